"""``check``: build a pipeline script without running it and say what SparkRunner can run.

Example::

    report = check_script("wordcount.py", ["--input", "in.txt", "--output", "out"])
    print(report.to_text())
    report.exit_status   # 0: everything runs; 1: something cannot; 2: the script did not build
"""
from __future__ import annotations

import copy
import dataclasses
import json
import re
import textwrap
import traceback

from apache_beam.portability import common_urns

from beam_ext.migrate import rules
from beam_ext.migrate._capture import Capture, CrossLanguageDiscovery, build
from beam_ext.migrate.rules import CANNOT, CAVEAT, RUNS, Finding, OptionVerdict

_PIPELINE = "(pipeline)"


@dataclasses.dataclass
class Row:
    """One transform of the report: its verdict ("runs", "caveat", "cannot") and the reason."""

    transform: str
    urn: str
    verdict: str
    reason: str
    pipeline: int = 0


@dataclasses.dataclass
class Report:
    """What the checker found for one script.

    ``rows``: transforms with their verdicts; ``options``: verdicts on the
    options the script set; ``build_error``: the script's failure when no
    pipeline could be built (exit status 2); ``notes``: what else the user
    should know (a build stopped early, a script that raised after building).
    """

    script: str
    args: list[str]
    rows: list[Row] = dataclasses.field(default_factory=list)
    options: list[OptionVerdict] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    build_error: str | None = None
    pipelines: int = 0

    @property
    def can_run(self) -> bool:
        """True when the pipeline built and nothing in it is "cannot"."""
        verdicts = [r.verdict for r in self.rows] + [o.verdict for o in self.options]
        return self.build_error is None and CANNOT not in verdicts

    @property
    def exit_status(self) -> int:
        """0: everything can run; 1: something cannot; 2: the script did not build."""
        if self.build_error is not None:
            return 2
        return 0 if self.can_run else 1

    def counts(self) -> dict[str, int]:
        """Transforms per verdict."""
        return {v: sum(r.verdict == v for r in self.rows) for v in (RUNS, CAVEAT, CANNOT)}

    def summary(self) -> str:
        """One line: counts and whether the pipeline can run on SparkRunner."""
        if self.build_error is not None:
            return "The script failed before building a pipeline: nothing was checked."
        n = self.counts()
        options = [o for o in self.options if o.verdict != RUNS]
        text = (f"{len(self.rows)} transforms: {n[RUNS]} run, {n[CAVEAT]} run with a caveat, "
                f"{n[CANNOT]} cannot run")
        if options:
            bad = sum(o.verdict == CANNOT for o in options)
            text += f"; {len(options)} options reported ({bad} cannot run)"
        verdict = "can run on SparkRunner" if self.can_run else "cannot run on SparkRunner as it is"
        return f"{text}. The pipeline {verdict}."

    def to_json(self) -> dict:
        """The report as JSON-ready data (``--format=json``)."""
        return {
            "script": self.script, "args": self.args, "can_run": self.can_run,
            "exit_status": self.exit_status, "summary": {"transforms": len(self.rows), **self.counts()},
            "transforms": [dataclasses.asdict(r) for r in self.rows],
            "options": [dataclasses.asdict(o) for o in self.options],
            "notes": self.notes, "build_error": self.build_error,
        }

    def to_text(self) -> str:
        """The report as a table per pipeline, the options, notes and a summary line."""
        out = [f"Checked {self.script} for SparkRunner (built, not run)", ""]
        if self.build_error is not None:
            out += ["The script failed while building its pipeline:", textwrap.indent(self.build_error, "    "), "",
                    self.summary()]
            return "\n".join(out)
        for index in range(self.pipelines):
            rows = [r for r in self.rows if r.pipeline == index]
            if self.pipelines > 1:
                out.append(f"Pipeline {index + 1} of {self.pipelines}:")
            out += _table(["transform", "verdict", "reason"],
                          [(r.transform, r.verdict, r.reason) for r in rows]) + [""]
        if self.options:
            out += _table(["option", "verdict", "reason"],
                          [(o.option, o.verdict, o.reason) for o in self.options]) + [""]
        out += [f"Note: {note}" for note in self.notes]
        if self.notes:
            out.append("")
        out.append(self.summary())
        return "\n".join(out)


def _table(header: list[str], rows: list[tuple[str, str, str]], reason_width: int = 72) -> list[str]:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(2)]
    lines = [f"{header[0]:<{widths[0]}}  {header[1]:<{widths[1]}}  {header[2]}"]
    lines.append(f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * len(header[2])}")
    indent = " " * (widths[0] + widths[1] + 4)
    for name, verdict, reason in rows:
        wrapped = textwrap.wrap(reason, reason_width) or [""]
        lines.append(f"{name:<{widths[0]}}  {verdict:<{widths[1]}}  {wrapped[0]}".rstrip())
        lines += [indent + more for more in wrapped[1:]]
    return lines


def check_script(script: str, args: list[str] | None = None, *, gcp_access: bool = False,
                 all_steps: bool = False) -> Report:
    """Builds ``script`` with ``args`` (``--runner`` replaced, nothing run) and judges each transform.

    ``gcp_access``: the Spark cluster has Google Cloud credentials and network
    (Google Cloud IOs become caveats instead of "cannot"). ``all_steps``:
    list every transform at every level, not only the top-level ones.
    Building runs the script's own code up to ``run()``; it contacts no
    expansion service and checks no ``gs://`` path.
    """
    args = list(args or [])
    report = Report(script=script, args=args)

    def analyse(pipeline, options, partial=False) -> list[Row]:
        try:
            return _pipeline_rows(pipeline, options, gcp_access, all_steps, partial)
        except Exception as exc:  # a bug of the checker must not pass for the script's failure
            return [Row(_PIPELINE, "", CANNOT, f"the checker failed on this pipeline: {exc!r}")]

    capture = build(script, args, on_run=analyse)
    judged = [(o, rows) for _, o, rows in capture.pipelines]
    if capture.error is not None:
        kind = _failure_kind(capture.error, capture.error_text)
        if kind is None:
            report.build_error = capture.error_text
            return report
        if capture.unrun:
            # Judge what was built before the failure, then the step that failed.
            pipeline = capture.unrun[-1]
            label = capture.failed_at[-1] if capture.failed_at else _PIPELINE
            inner = capture.failed_at[0] if capture.failed_at else label
            rows = [r for r in analyse(pipeline, pipeline._options, partial=True)
                    if r.transform != label and not label.startswith(r.transform + "/")]
            where = "" if inner == label else f"{inner!r}: "
            rows.append(Row(label, "", CANNOT, f"{where}{kind}; building stopped here: {_last_line(capture)}"))
            report.notes.append(f"building stopped at {label!r}: transforms applied after it were not checked")
            judged.append((pipeline._options, rows))
        else:
            report.notes.append(f"the script raised after its pipeline was built: {_last_line(capture)}")
    elif capture.exit_code is not None and not judged:
        report.build_error = f"the script exited with status {capture.exit_code} before building a pipeline"
        return report
    if not judged and capture.unrun:
        judged = [(p._options, analyse(p, p._options)) for p in capture.unrun]
        report.notes.append("the script built its pipeline but never ran it")
    if not judged:
        report.build_error = ("the script built no pipeline (does it build and run one when started as "
                              "__main__?)")
        return report
    seen_options: set[str] = set()
    for index, (options, rows) in enumerate(judged):
        for row in rows:
            row.pipeline = index
        report.rows += rows
        for verdict in rules.gcs_option_verdicts(options, gcp_access) + rules.option_verdicts(options):
            if verdict.option not in seen_options:
                seen_options.add(verdict.option)
                report.options.append(verdict)
    report.pipelines = len(judged)
    return report


def _last_line(capture: Capture) -> str:
    return "".join(traceback.format_exception_only(type(capture.error), capture.error)).strip().splitlines()[-1]


def _failure_kind(error: BaseException, text: str) -> str | None:
    """The reason a build failure means "cannot run", or None for a failure of the script itself."""
    if isinstance(error, CrossLanguageDiscovery) or "expansion service" in text.lower():
        return f"cannot run: {rules.XLANG_REASON}"
    module = type(error).__module__ or ""
    if module.startswith("google.") or "gs://" in text or "apache-beam[gcp]" in text:
        return f"cannot run here: {rules.GCP_REASON}"
    return None


def _pipeline_rows(pipeline, options, gcp_access: bool, all_steps: bool, partial: bool) -> list[Row]:
    from apache_beam.transforms.external import ExternalTransform

    root = pipeline.transforms_stack[0]
    every = _nodes(root)
    nodes = every if all_steps else list(root.parts)
    # Cross-language steps have their own rule; the planner's "unknown URN" would repeat it.
    externals = frozenset(n.full_label for n in every if isinstance(n.transform, ExternalTransform))
    findings = rules.step_findings(root, gcp_access)
    urns: dict[str, str] = {}
    try:
        proto, planning = _as_sparkrunner_plans(pipeline, options, externals)
        urns = {t.unique_name: t.spec.urn for t in proto.components.transforms.values()}
        findings += planning
    except Exception as exc:  # a pipeline SparkRunner could not even receive
        if not partial:
            findings.append(Finding(_PIPELINE, CANNOT, f"cannot run: the pipeline has no Runner API form: {exc}"))
    rows = []
    labels = [n.full_label for n in nodes]
    for label in labels:
        mine = [f for f in findings if f.step == label or f.step.startswith(label + "/")]
        rows.append(_row(label, urns.get(label, ""), mine))
    orphans = [f for f in findings if not any(f.step == lb or f.step.startswith(lb + "/") for lb in labels)]
    if orphans:
        rows.append(_row(_PIPELINE, "", orphans))
    return rows


def _row(label: str, urn: str, findings: list[Finding]) -> Row:
    reasons: list[str] = []
    for f in sorted(findings, key=lambda f: -rules._RANK[f.verdict]):
        text = f.reason if f.step in (label, _PIPELINE) else f"{f.step!r}: {f.reason}"
        if f.reason not in " ".join(reasons):
            reasons.append(text)
    return Row(label, urn, rules.worst(f.verdict for f in findings), "; ".join(reasons))


def _nodes(root) -> list:
    out = []

    def visit(node):
        for part in node.parts:
            out.append(part)
            visit(part)

    visit(root)
    return out


def _as_sparkrunner_plans(pipeline, options, externals: frozenset[str]):
    """The proto SparkRunner would make, and the findings of its planner on it.

    The same steps as ``SparkRunner.run_pipeline`` and ``run_proto`` up to
    planning: batch replays a replayable TestStream as a bounded source;
    leaves no worker implements are refused; then the planner runs.
    """
    from beam_ext.runner import spark_runner
    from beam_ext.runner._pipeline_proto import pipeline_proto
    from beam_ext.runner.planning import TestStreamAsBoundedSource, plan_pipeline
    from beam_ext.runner.planning._phases import RUNNER_URNS, substitute_natives, unsupported_leaves

    if not spark_runner._is_streaming(pipeline, options):
        pipeline.replace_all([TestStreamAsBoundedSource()])
    proto = pipeline_proto(pipeline, options)
    streaming = spark_runner._proto_is_streaming(proto, options)
    natives_proto = copy.deepcopy(proto)
    natives = frozenset() if streaming else substitute_natives(natives_proto)
    runner_urns = rules_urns = RUNNER_URNS | natives
    if streaming:
        rules_urns = runner_urns | {common_urns.primitives.TEST_STREAM.urn}
    unsupported = unsupported_leaves(natives_proto, rules_urns)
    findings = rules.urn_findings(unsupported, externals)
    if not unsupported:
        try:
            plan_pipeline(copy.deepcopy(proto), 64 << 20, 2, streaming=streaming)
        except Exception as exc:  # what the planner refuses is the verdict
            named = re.search(r"'([^']+)'", str(exc))
            findings.append(Finding(named.group(1) if named else _PIPELINE, CANNOT,
                                    f"cannot run: SparkRunner's planner refuses it: {exc}"))
    return proto, findings


def report_json(report: Report) -> str:
    """``report`` as indented JSON."""
    return json.dumps(report.to_json(), indent=2)
