"""Builds a user's pipeline script without running it.

The script runs under :func:`runpy` with ``--runner`` pointing at
:class:`CaptureRunner`, and ``Pipeline.run`` routes every pipeline to it even
when the script names a runner in code. The runner keeps the pipeline and
returns a result whose methods do nothing, so ``p.run()``,
``with beam.Pipeline(...) as p:``, ``.wait_until_finish()`` and metric
queries all pass.

Building must not contact anything:

* cross-language transforms are "expanded" by an in-process stand-in for the
  expansion service, which returns one leaf carrying the transform's own URN
  and one output, so the rest of the pipeline still builds (and the leaf is
  one SparkRunner has no implementation for);
* file sources on ``gs://`` skip the existence check Beam makes when they are
  constructed (it needs Google Cloud Storage).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import runpy
import sys
import traceback
from typing import Callable, Iterator

import apache_beam as beam
from apache_beam.metrics.metric import MetricResults
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_expansion_api_pb2, beam_runner_api_pb2
from apache_beam.runners import runner
from apache_beam.transforms import external
from apache_beam.transforms.core import Windowing
from apache_beam.transforms.window import GlobalWindows

from beam_ext.errors import BeamExtError

_RUNNER = "beam_ext.migrate._capture.CaptureRunner"


class CrossLanguageDiscovery(BeamExtError, RuntimeError):
    """A transform asked an expansion service for its schema while being constructed."""


@dataclasses.dataclass
class ExternalExpansion:
    """A cross-language transform the stand-in expansion service was asked to expand."""

    full_label: str
    urn: str
    service: str


@dataclasses.dataclass
class Capture:
    """What building a script gave.

    ``pipelines``: (pipeline, options, what ``on_run`` said) of each pipeline the script ran;
    ``unrun``: pipelines constructed but never run (the script stopped while
    building them); ``error``: the script's exception, if it raised, with
    ``failed_at`` the labels of the transforms being applied when it did
    (innermost first); ``externals``: cross-language expansions asked for.
    """

    pipelines: list = dataclasses.field(default_factory=list)
    unrun: list = dataclasses.field(default_factory=list)
    error: BaseException | None = None
    error_text: str = ""
    failed_at: list[str] = dataclasses.field(default_factory=list)
    externals: list[ExternalExpansion] = dataclasses.field(default_factory=list)
    exit_code: object | None = None


class _NoMetrics(MetricResults):
    def query(self, filter=None):
        return {name: [] for name in (MetricResults.COUNTERS, MetricResults.DISTRIBUTIONS,
                                      MetricResults.GAUGES, MetricResults.STRINGSETS,
                                      MetricResults.BOUNDED_TRIES,
                                      getattr(MetricResults, "HISTOGRAMS", "histograms"))}


class CapturedResult(runner.PipelineResult):
    """The result of a pipeline that was built, not run: done, with no metrics."""

    def __init__(self) -> None:
        super().__init__(runner.PipelineState.DONE)

    def wait_until_finish(self, duration=None):
        return self._state

    def cancel(self):
        return self._state

    def metrics(self) -> MetricResults:
        return _NoMetrics()

    def monitoring_metrics(self) -> MetricResults:
        return _NoMetrics()


class CaptureRunner(runner.PipelineRunner):
    """Keeps each pipeline it is asked to run, and runs nothing.

    Example::

        p = beam.Pipeline(runner=CaptureRunner())
        ...
        p.run().wait_until_finish()   # built, recorded in CaptureRunner.captured
    """

    captured: list = []
    # Called as on_run(pipeline, options) while the script's module is still
    # alive (schemas of its NamedTuples resolve through it); its result is kept.
    on_run: Callable | None = None

    def run_pipeline(self, pipeline, options):
        analysis = CaptureRunner.on_run(pipeline, options) if CaptureRunner.on_run else None
        CaptureRunner.captured.append((pipeline, options, analysis))
        return CapturedResult()


class _StandInExpansionService:
    """Answers expansion requests with one leaf of the requested URN; contacts nothing."""

    def __init__(self, service, record: list[ExternalExpansion]) -> None:
        self._service = service
        self._record = record

    def Expand(self, request, *args, **kwargs):
        ns = request.namespace
        self._record.append(ExternalExpansion(
            request.transform.unique_name, request.transform.spec.urn, _describe_service(self._service)))
        response = beam_expansion_api_pb2.ExpansionResponse()
        components = response.components
        components.CopyFrom(request.components)
        from apache_beam.runners import pipeline_context

        context = pipeline_context.PipelineContext()
        strategy = Windowing(GlobalWindows()).to_runner_api(context)
        window_coder = context.coders.get_proto(context.coders.get_by_id(strategy.window_coder_id))
        components.coders[f"{ns}_window"].CopyFrom(window_coder)
        components.coders[f"{ns}_bytes"].spec.urn = common_urns.coders.BYTES.urn
        strategy.window_coder_id = f"{ns}_window"
        strategy.environment_id = ""
        components.windowing_strategies[f"{ns}_global"].CopyFrom(strategy)
        components.pcollections[f"{ns}_out"].CopyFrom(beam_runner_api_pb2.PCollection(
            unique_name=f"{request.transform.unique_name}.out", coder_id=f"{ns}_bytes",
            windowing_strategy_id=f"{ns}_global", is_bounded=beam_runner_api_pb2.IsBounded.BOUNDED))
        response.transform.CopyFrom(request.transform)
        response.transform.outputs["out"] = f"{ns}_out"
        return response

    def artifact_service(self):
        raise CrossLanguageDiscovery("no artifacts: the expansion was not made")


def _describe_service(service) -> str:
    if isinstance(service, str):
        return service
    jar = getattr(service, "path_to_jar", None)
    return f"Java expansion service {jar}" if jar else type(service).__name__


@contextlib.contextmanager
def _patched(obj, name: str, value) -> Iterator[None]:
    old = obj.__dict__[name]
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _run_routed_to_capture(original_run):
    def run(self, test_runner_api="AUTO"):
        if not isinstance(self.runner, CaptureRunner):
            self.runner = CaptureRunner()
        return original_run(self, test_runner_api=False)
    return run


def _recording_apply(original_apply, failed_at: list[str]):
    def apply(self, transform, pvalueish=None, label=None):
        parent = self._current_transform()
        before = len(parent.parts)
        try:
            return original_apply(self, transform, pvalueish, label)
        except BaseException as exc:
            if not getattr(exc, "_beam_ext_seen", False):
                failed_at.clear()
            with contextlib.suppress(AttributeError):
                exc._beam_ext_seen = True
            name = (parent.parts[before].full_label if len(parent.parts) > before
                    else "/".join(x for x in (parent.full_label, label or getattr(transform, "label", "?")) if x))
            failed_at.append(name)
            raise
    return apply


def _recording_init(original_init, created: list):
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        created.append(self)
    return __init__


def _skip_gcs_validation(original_validate):
    def _validate(self):
        pattern = self._pattern.get() if self._pattern.is_accessible() else ""
        if isinstance(pattern, str) and pattern.startswith("gs://"):
            return None  # needs Google Cloud Storage; the checker reports the path
        return original_validate(self)
    return _validate


def script_argv(script: str, args: list[str]) -> list[str]:
    """``sys.argv`` for ``script``: its arguments with every ``--runner`` replaced by the capture runner."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--runner":
            skip = True
            continue
        if arg.startswith("--runner="):
            continue
        kept.append(arg)
    return [script, *kept, f"--runner={_RUNNER}"]


def build(script: str, args: list[str], on_run: Callable | None = None) -> Capture:
    """Runs ``script`` (a path, or a module name) with ``args`` and captures the pipelines it builds.

    ``on_run(pipeline, options)`` is called when the script runs a pipeline
    (its result is kept with the pipeline in ``Capture.pipelines``); it must
    not raise.
    """
    from apache_beam.io import filebasedsource

    capture = Capture()
    created: list = []
    CaptureRunner.captured = []
    CaptureRunner.on_run = on_run

    @contextlib.contextmanager
    def stand_in(service):
        yield _StandInExpansionService(service, capture.externals)

    def discovery(*_args, **_kwargs):
        raise CrossLanguageDiscovery(
            "the transform asks its expansion service for its configuration while being constructed")

    argv = script_argv(script, args)
    saved_argv, saved_path = sys.argv, list(sys.path)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(beam.Pipeline, "run", _run_routed_to_capture(beam.Pipeline.run)))
        stack.enter_context(_patched(beam.Pipeline, "apply",
                                     _recording_apply(beam.Pipeline.apply, capture.failed_at)))
        stack.enter_context(_patched(beam.Pipeline, "__init__", _recording_init(beam.Pipeline.__init__, created)))
        stack.enter_context(_patched(external.ExternalTransform, "service", staticmethod(stand_in)))
        stack.enter_context(_patched(external.SchemaAwareExternalTransform, "discover_iter",
                                     staticmethod(discovery)))
        stack.enter_context(_patched(external, "_maybe_use_transform_service", lambda service, options=None: service))
        stack.enter_context(_patched(filebasedsource.FileBasedSource, "_validate",
                                     _skip_gcs_validation(filebasedsource.FileBasedSource._validate)))
        sys.argv = argv
        try:
            if os.path.exists(script) or script.endswith(".py"):
                sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
                runpy.run_path(script, run_name="__main__")
            else:
                runpy.run_module(script, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                capture.exit_code = exc.code
        except BaseException as exc:  # the user's script: any failure is reported, not raised
            capture.error = exc
            capture.error_text = _summary(exc)
        finally:
            sys.argv = saved_argv
            sys.path[:] = saved_path
            CaptureRunner.on_run = None
    capture.pipelines = list(CaptureRunner.captured)
    ran = {id(p) for p, _, _ in capture.pipelines}
    capture.unrun = [p for p in created if id(p) not in ran]
    return capture


def _summary(exc: BaseException, frames: int = 4) -> str:
    """The exception and the last few frames of its traceback."""
    tb = traceback.extract_tb(exc.__traceback__)
    lines = traceback.format_list(tb[-frames:])
    text = "".join(lines) + "".join(traceback.format_exception_only(type(exc), exc))
    return text.rstrip()


def options_of(pipeline) -> PipelineOptions:
    """The options a pipeline was built with."""
    return pipeline._options
