"""A chain of plain ``Map``/``FlatMap``/``Filter`` steps run on element objects, without Beam's bundle processor.

Between two native steps (a Parquet read feeding SlidingAggregate, whose
output a ``Map`` turns into rows for a native write) a fused stage made
only of such steps would otherwise cost an encode of every element, Beam's
bundle processor decoding it, running the step and encoding its output, and
a decode again for the next native step: for dict-shaped elements, several
microseconds per element, many times the step's own work. Here the
executor hands the stage the elements as objects and the steps run as
Beam's ``DoFnRunner`` would run them:

- a step is a ``CallableWrapperDoFn`` (what ``Map``, ``FlatMap``,
  ``Filter``, ``MapTuple`` build) with no side inputs, state, timers,
  ``DoFn.*Param`` arguments, batches or splitting, and one output; its
  extra arguments are passed as Beam passes them;
- each output keeps the input's timestamp and windows; a ``TimestampedValue``
  is assigned windows by the step's window function, a ``WindowedValue``
  kept, as Beam's ``_OutputHandler`` does; a ``TaggedOutput`` fails (the
  step declares no tagged output);
- ``Metrics`` used inside a step count under the step, as in Beam (a
  metrics container per step, reported with the task's other metrics);
- an error is re-raised naming the step (``[while running '...']``), as
  Beam's bundle processor tags it.

:func:`direct_chain` decides from a fused stage's transforms whether it is
such a chain; the batch executor runs it this way only next to a native
step, where the element objects are at hand (elsewhere the bundle
processor's coders are no slower than this loop).
"""
from __future__ import annotations

import dataclasses
import functools
import traceback
from typing import Any, Callable, Iterable, Iterator

from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners.worker import bundle_processor

from beam_ext.errors import BeamExtError
from beam_ext.runner.worker._setup import WorkerSetup


@dataclasses.dataclass(frozen=True)
class DirectStep:
    """One ``Map``-like step: its name (Beam's transform id), pickled DoFn payload,
    and the window function of its input, which assigns a ``TimestampedValue`` output's windows."""

    name: str
    payload: bytes
    window_fn: Any


@dataclasses.dataclass(frozen=True)
class DirectChain:
    """The steps of a fused stage, input to output, and the coders around them."""

    steps: tuple[DirectStep, ...]
    input_coder: Any
    output_coder: Any


def _simple_dofn(payload: bytes) -> str | None:
    """Why the pickled ParDo payload is not a plain callable DoFn, or None."""
    from apache_beam.internal import pickler
    from apache_beam.runners.common import DoFnSignature
    from apache_beam.transforms import core, userstate

    try:
        dofn, _, _, side_inputs, _ = pickler.loads(payload)
    except Exception as exc:  # noqa: BLE001 - unpicklable here: keep Beam's path
        return f"its DoFn does not unpickle on the driver ({exc})"
    if type(dofn) is not core.CallableWrapperDoFn:
        return f"{type(dofn).__name__} is not a plain callable"
    if side_inputs:
        return "it has side inputs"
    signature = DoFnSignature(dofn)
    if any(isinstance(d, (core._DoFnParam, userstate.StateSpec, userstate.TimerSpec))
           for d in signature.process_method.defaults):
        return "it takes DoFn parameters"
    if signature.is_stateful_dofn() or signature.is_splittable_dofn() or dofn._process_yields_batches:
        return "it is stateful, splittable or batched"
    return None


def direct_chain(transforms: Iterable[beam_runner_api_pb2.PTransform], input_coder: Any,
                 output_coder: Any, window_fn_of: Callable[[str], Any]) -> DirectChain | None:
    """The stage's steps as a :class:`DirectChain`, or None if it is not one.

    ``transforms``: the fused stage's, with one data input, one data output
    and only ParDos between them in a line. ``window_fn_of(pcollection id)``:
    its window function (Beam's bundle processor gives a DoFn its input's).
    """
    from apache_beam.utils import proto_utils

    transforms = list(transforms)
    by_input: dict[str, beam_runner_api_pb2.PTransform] = {}
    start = None
    ends = 0
    for transform in transforms:
        urn = transform.spec.urn
        if urn == bundle_processor.DATA_INPUT_URN:
            if start is not None:
                return None
            start = transform
        elif urn == bundle_processor.DATA_OUTPUT_URN:
            ends += 1
        elif urn != common_urns.primitives.PAR_DO.urn:
            return None
        if urn != bundle_processor.DATA_INPUT_URN:
            if len(transform.inputs) != 1:
                return None
            [pcoll] = transform.inputs.values()
            if pcoll in by_input:
                return None  # two consumers of one PCollection
            by_input[pcoll] = transform
    if start is None or ends != 1 or len(start.outputs) != 1:
        return None
    steps = []
    [pcoll] = start.outputs.values()
    while True:
        transform = by_input.get(pcoll)
        if transform is None:
            return None
        if transform.spec.urn == bundle_processor.DATA_OUTPUT_URN:
            break
        payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
        if (payload.side_inputs or payload.state_specs or payload.timer_family_specs
                or payload.restriction_coder_id or payload.requests_finalization
                or payload.do_fn.urn != python_urns.PICKLED_DOFN_INFO or len(transform.outputs) != 1):
            return None
        if _simple_dofn(payload.do_fn.payload) is not None:
            return None
        steps.append(DirectStep(transform.unique_name, payload.do_fn.payload, window_fn_of(pcoll)))
        [pcoll] = transform.outputs.values()
    if not steps or len(steps) + 2 != len(transforms):
        return None
    return DirectChain(tuple(steps), input_coder, output_coder)


class _Tracker:
    """What Beam's ``Metrics`` find through ``statesampler.get_current_tracker()``:
    the current state's metrics container, the running step's."""

    def __init__(self) -> None:
        from apache_beam.runners.worker import statesampler

        self.state = None
        self._install = statesampler.set_current_tracker

    def enter(self, state: _State) -> None:
        # Again before every call: a bundle processor run in between (another
        # stage of the task, while this chain's generator waits) resets it.
        self._install(self)
        self.state = state

    def current_state(self):
        return self.state

    def update_metric(self, typed_metric_name: Any, value: Any) -> None:
        self.state.metrics_container.get_metric_cell(typed_metric_name).update(value)


class _State:
    def __init__(self, container: Any) -> None:
        self.metrics_container = container


# As Beam's bundle processor tags an error; the driver reads the step from it.
_STEP_TAG = "[while running '%s']"


class StepFailed(BeamExtError, RuntimeError):
    """A step of a direct chain raised; the message names it as Beam's bundle processor does."""


# Elements a step takes per turn: each step then runs a whole list under
# its own metrics state, instead of switching state and generator frames
# per element (half the chain's cost for a one-line Map).
_BATCH = 512


def _batches(values: Iterator[Any]) -> Iterator[list]:
    batch: list = []
    append = batch.append
    for value in values:
        append(value)
        if len(batch) == _BATCH:
            yield batch
            batch = []
            append = batch.append
    if batch:
        yield batch


def _map_fn(dofn: Any) -> Callable | None:
    """The user's function of a ``Map``, whose DoFn wraps it as ``lambda x: [fn(x)]``, else None.

    Called directly, it saves the wrapper's call and one-element list per
    element. Recognised by the wrapper's code, which pickling copies but
    keeps equal.
    """
    wrapper = getattr(dofn, "_fn", None)
    code = getattr(wrapper, "__code__", None)
    if code is None or code not in _map_wrapper_codes():
        return None
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in wrapper.__closure__)))["fn"]


@functools.cache
def _map_wrapper_codes() -> tuple:
    from apache_beam.transforms import core

    def one(x):
        return x

    def more(x, y):
        return x

    # Beam's Map builds one wrapper for a function of the element alone and
    # another for one taking extra arguments.
    return core.Map(one).fn._fn.__code__, core.Map(more, None).fn._fn.__code__


def _run_step(name: str, dofn: Any, args: tuple, kwargs: dict, window_fn: Any, tracker: _Tracker,
              state: _State, batches: Iterator[list]) -> Iterator[list]:
    from apache_beam.pvalue import TaggedOutput
    from apache_beam.transforms.window import TimestampedValue, WindowFn
    from apache_beam.utils.windowed_value import WindowedValue

    special = (WindowedValue, TimestampedValue, TaggedOutput)

    def output(wv: Any, result: Any) -> Any:
        """What Beam's ``_OutputHandler`` makes of a result that is not a plain value."""
        if isinstance(result, WindowedValue):
            if len(wv.windows) != 1:
                result.windows *= len(wv.windows)
            return result
        if isinstance(result, TimestampedValue):
            out = WindowedValue(result.value, result.timestamp, tuple(
                window_fn.assign(WindowFn.AssignContext(result.timestamp, result.value))))
            if len(wv.windows) != 1:
                out.windows *= len(wv.windows)
            return out
        raise ValueError(f"emitted TaggedOutput({result.tag!r}, ...), but the step has no tagged outputs")

    fn = _map_fn(dofn)
    process = dofn.process if fn is None else fn
    if args or kwargs:
        # Beam passes a step's extra arguments after the element.
        process = lambda value, _p=process: _p(value, *args, **kwargs)  # noqa: E731
    for batch in batches:
        out: list = []
        append = out.append
        # Again for every batch: a bundle processor run in between (another
        # stage of the task, while this chain waits for input) resets it.
        tracker.enter(state)
        try:
            if fn is not None:
                for wv in batch:
                    result = process(wv.value)
                    append(output(wv, result) if isinstance(result, special) else wv.with_value(result))
            else:
                for wv in batch:
                    results = process(wv.value)
                    if results is None:
                        continue
                    # A list or a generator: a generator's body runs here,
                    # under this step's state, as it reads.
                    for result in results:
                        append(output(wv, result) if isinstance(result, special) else wv.with_value(result))
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise StepFailed(traceback.format_exc() + _STEP_TAG % name) from exc
        if out:
            yield out


def run_direct_chain(chain: DirectChain, setup: WorkerSetup | None, values: Iterator[Any],
                     report: list) -> Iterator[Any]:
    """The chain's output elements for ``values``; appends the task's serialized
    monitoring infos (user metrics per step) to ``report`` at the end."""
    from apache_beam.internal import pickler
    from apache_beam.metrics.execution import MetricsContainer
    from apache_beam.runners.worker import statesampler

    if setup is not None:
        setup.apply()  # before the DoFns are unpickled
    tracker = _Tracker()
    containers = []
    batches = _batches(values)
    for step in chain.steps:
        dofn, args, kwargs, _, _ = pickler.loads(step.payload)
        container = MetricsContainer(step.name)
        containers.append((step.name, container))
        batches = _run_step(step.name, dofn, tuple(args), dict(kwargs), step.window_fn, tracker,
                            _State(container), batches)
    previous = statesampler.get_current_tracker()
    try:
        for batch in batches:
            yield from batch
    finally:
        statesampler.set_current_tracker(previous)
    infos = [info for name, container in containers
             for info in container.to_runner_api_monitoring_infos(name).values()]
    report.append(beam_fn_api_pb2.ProcessBundleResponse(monitoring_infos=infos).SerializeToString())
