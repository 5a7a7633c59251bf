"""The verdict rules: what SparkRunner can run, step by step and option by option.

Each rule looks at one step of a built pipeline (its Python transform, or its
Runner API proto as SparkRunner plans it) and may give a :class:`Finding`:
``"caveat"`` (runs, with a named difference) or ``"cannot"`` (with the
reason). A step with no finding runs.

The rules follow what SparkRunner does:

* its planner (``beam_ext.runner.planning``) runs every leaf whose URN Beam's
  bundle processor or the runner implements, and refuses others;
* Google Cloud IOs are Python transforms that would run, but need Google
  Cloud credentials, network and ``apache-beam[gcp]``; Pub/Sub's read is a
  source only Dataflow and Beam's DirectRunner implement;
* cross-language transforms need a Java expansion service and a Java SDK
  harness next to each task, which SparkRunner does not start;
* streaming side inputs must be bounded (docs/streaming.md, "Limits");
* TestStream from a TestStreamService, and ``PairWithTiming`` (used by
  ``ReverseTestStream``), are read only by Beam's Python DirectRunner.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

from apache_beam.options import pipeline_options as po
from apache_beam.options.value_provider import StaticValueProvider

from beam_ext.runner.dataflow_options import map_dataflow_options

RUNS, CAVEAT, CANNOT = "runs", "caveat", "cannot"
_RANK = {RUNS: 0, CAVEAT: 1, CANNOT: 2}

GCP_REASON = "needs Google Cloud credentials and network"
XLANG_REASON = ("cross-language transform: needs a Java expansion service and a Java SDK harness, "
                "which SparkRunner does not run")


@dataclasses.dataclass(frozen=True)
class Finding:
    """What a rule says about one step: ``verdict`` ("caveat" or "cannot") and why.

    Example::

        Finding("ReadFromBigQuery", "cannot", "cannot run here: needs Google Cloud credentials ...")
    """

    step: str
    verdict: str
    reason: str


@dataclasses.dataclass(frozen=True)
class OptionVerdict:
    """The verdict on one pipeline option the user set.

    Example::

        OptionVerdict("--update", "cannot", "updates a running Dataflow job in place; ...")
    """

    option: str
    verdict: str
    reason: str


def worst(verdicts: Iterable[str]) -> str:
    """The most severe of ``verdicts`` ("runs" when there are none)."""
    return max(verdicts, key=_RANK.__getitem__, default=RUNS)


# -- Steps, from the Python graph ------------------------------------------

_GCP_SERVICES = (  # module fragment -> the Google Cloud service it talks to
    ("bigquery", "BigQuery"), ("pubsublite", "Pub/Sub Lite"), ("pubsub", "Pub/Sub"),
    ("spanner", "Spanner"), ("bigtable", "Bigtable"), ("datastore", "Datastore"),
    ("gcsio", "Cloud Storage"), ("gcsfilesystem", "Cloud Storage"), ("healthcare", "Healthcare API"),
    ("ml.gcp", "Cloud AI APIs"), ("vertex_ai", "Vertex AI"),
)
_GCP_MODULES = ("apache_beam.io.gcp.", "apache_beam.ml.gcp.", "apache_beam.ml.inference.vertex_ai")


def gcp_service(transform) -> str | None:
    """The Google Cloud service a transform of Beam's GCP modules talks to, or None."""
    module = type(transform).__module__
    if not module.startswith(_GCP_MODULES):
        return None
    return next((name for fragment, name in _GCP_SERVICES if fragment in module), "Google Cloud")


def _gcp_finding(step: str, what: str, gcp_access: bool) -> Finding:
    if gcp_access:
        return Finding(step, CAVEAT, f"{what}: {GCP_REASON} on the driver and every executor, "
                                     "and apache-beam[gcp] installed there")
    return Finding(step, CANNOT, f"cannot run here: {GCP_REASON} ({what})")


def _not_scanned() -> tuple[type, ...]:
    from apache_beam import pipeline, pvalue

    # What every transform can reach (its pipeline, the options): not the transform's own paths.
    return (bytes, int, float, bool, type(None), pipeline.Pipeline, pipeline.AppliedPTransform,
            po.PipelineOptions, pvalue.PValue)


_NOT_SCANNED = _not_scanned()


def gcs_paths(obj, depth: int = 3) -> Iterator[str]:
    """``gs://`` paths among a transform's attributes (a few levels deep)."""
    seen: set[int] = set()

    def walk(value, level):
        if isinstance(value, StaticValueProvider):
            value = value.value
        if isinstance(value, str):
            if value.startswith("gs://"):
                yield value
            return
        if level > depth or id(value) in seen or isinstance(value, _NOT_SCANNED):
            return
        seen.add(id(value))
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            children = list(value)
        elif hasattr(value, "__dict__") and not callable(value) or type(value).__module__.startswith(
                "apache_beam.io"):
            children = list(getattr(value, "__dict__", {}).values())
        else:
            return
        for child in children:
            yield from walk(child, level + 1)

    yield from walk(obj, 0)


def step_findings(root, gcp_access: bool = False) -> list[Finding]:
    """Findings of the Python-level rules for every step under ``root`` (a pipeline's root node).

    A rule that flags a composite is not applied again to its parts.
    """
    from apache_beam.testing.test_stream import PairWithTiming, TestStream
    from apache_beam.transforms.external import (
        ExternalTransform,
        JavaExternalTransform,
        SchemaAwareExternalTransform,
    )

    found: list[Finding] = []

    def visit(node, flagged: frozenset[str]) -> None:
        transform, step = node.transform, node.full_label
        mine = set()
        if transform is not None:
            service = gcp_service(transform) if "gcp" not in flagged else None
            if service:
                found.append(_gcp_finding(step, f"Google Cloud {service}", gcp_access))
                mine.add("gcp")
            if "gcp" not in flagged and "gcp" not in mine:
                paths = sorted(set(gcs_paths(transform)))
                if paths:
                    found.append(_gcp_finding(step, f"Cloud Storage path {paths[0]}", gcp_access))
                    mine.add("gcp")
            if "xlang" not in flagged and isinstance(
                    transform, (ExternalTransform, JavaExternalTransform, SchemaAwareExternalTransform)):
                urn = getattr(transform, "_urn", "") or ""
                found.append(Finding(step, CANNOT, f"cannot run: {XLANG_REASON}" + (f" ({urn})" if urn else "")))
                mine.add("xlang")
            if isinstance(transform, PairWithTiming):
                found.append(Finding(step, CANNOT, "cannot run: PairWithTiming (used by ReverseTestStream) "
                                     "reads the runner's clock, which only Beam's Python DirectRunner provides"))
            if isinstance(transform, TestStream) and getattr(transform, "_endpoint", None):
                found.append(Finding(step, CANNOT, "cannot run: this TestStream reads its events from a "
                                     f"TestStreamService ({transform._endpoint}); SparkRunner needs them "
                                     "in the pipeline"))
            for side in node.side_inputs:
                pcoll = getattr(side, "pvalue", None)
                if pcoll is not None and pcoll.is_bounded is False:
                    producer = pcoll.producer.full_label if pcoll.producer else str(pcoll)
                    found.append(Finding(step, CANNOT, "cannot run: side input from an unbounded "
                                         f"PCollection ({producer!r}); SparkRunner streaming needs side "
                                         "inputs to be bounded for now"))
        for part in node.parts:
            visit(part, flagged | mine)

    for part in root.parts:
        visit(part, frozenset())
    return found


# -- Steps, from the Runner API proto as SparkRunner plans it ---------------

_URN_HINTS = {
    "beam:transform:pubsub_read:v1": "Pub/Sub's source is implemented only by Dataflow and Beam's DirectRunner",
    "beam:transform:pubsub_write:v1": "Pub/Sub's sink is implemented only by Dataflow and Beam's DirectRunner",
    "beam:transform:pubsub_write:v2": "Pub/Sub's sink is implemented only by Dataflow and Beam's DirectRunner",
    "beam:transform:read:v1": "a Read of a source that is neither a BoundedSource nor a splittable DoFn "
                              "(a Dataflow native source)",
}


def urn_findings(unsupported: Iterable[tuple[str, str]], externals: frozenset[str]) -> list[Finding]:
    """Findings for the leaves SparkRunner's planner refuses: (step, URN) pairs.

    ``externals``: steps of cross-language transforms (reported by their own rule).
    """
    found = []
    for step, urn in unsupported:
        if step in externals:
            continue
        hint = _URN_HINTS.get(urn)
        found.append(Finding(step, CANNOT, f"cannot run: SparkRunner has no implementation of {urn}"
                             + (f" ({hint})" if hint else "")))
    return found


# -- Options ----------------------------------------------------------------

def option_verdicts(options: po.PipelineOptions) -> list[OptionVerdict]:
    """Verdicts on the Dataflow options a pipeline sets, from the mapping
    SparkRunner itself applies at start (:mod:`beam_ext.runner.dataflow_options`):
    an option it cannot honour cannot run; one it ignores or maps to something
    else is a caveat naming what it becomes."""
    verdicts = []
    for m in map_dataflow_options(options).mappings:
        if m.kind == "unsupported":
            verdicts.append(OptionVerdict(m.option, CANNOT, m.meaning))
        elif m.kind == "ignored":
            verdicts.append(OptionVerdict(m.option, CAVEAT, f"ignored on Spark: {m.meaning}"))
        elif m.kind in ("spark", "dependency"):
            verdicts.append(OptionVerdict(m.option, CAVEAT, f"on Spark: {m.meaning}"))
    return verdicts


def gcs_option_verdicts(options: po.PipelineOptions, gcp_access: bool = False) -> list[OptionVerdict]:
    """Options whose value is a ``gs://`` path: whatever uses them needs Google Cloud Storage."""
    verdicts = []
    for name, value in sorted(options.get_all_options(drop_default=True).items()):
        if isinstance(value, str) and value.startswith("gs://"):
            extra = "" if gcp_access else "; use a path Spark's executors can write"
            verdicts.append(OptionVerdict(f"--{name}", CAVEAT, f"Cloud Storage path {value}: what uses it "
                                          f"{GCP_REASON}{extra}"))
    return verdicts
