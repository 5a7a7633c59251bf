"""A fused stage of ``Map``-like steps run on element objects, without Beam's bundle processor.

Beam's bundle processor moves every element through an operation per step:
a receiver, a ``DoFnRunner``, an output handler, state sampling, and coders
at the stage's edges. For the steps most pipelines are made of (``Map``,
``FlatMap``, ``Filter``, the partial combine before a lifted
``CombinePerKey``'s shuffle), that machinery costs several times the step's
own work. Here the executor hands the stage its input as element objects
(decoded from the input buffer, or as a native step produced them) and the
steps run as Beam's ``DoFnRunner`` and ``PGBKCVOperation`` would run them:

- a step is a ``DoFn`` of the element alone (which ones:
  :mod:`beam_ext.runner.planning._direct_chain`); its extra arguments are
  passed as Beam passes them, side inputs (global window, read whole)
  included, each given its view of all the side input's elements;
- each output keeps the input's timestamp and windows; a ``TimestampedValue``
  is assigned windows by the step's window function, a ``WindowedValue``
  kept, as Beam's ``_OutputHandler`` does; a ``TaggedOutput`` fails (the
  step declares no tagged output);
- the partial combine keeps one accumulator per key (per key and window
  outside default windowing), evicts a tenth of its keys when it holds
  Beam's maximum, compacts what it emits and stamps non-default windows'
  outputs as Beam does (end of window, or the timestamp combiner's value);
- an output feeding a GroupByKey is written as the bundle processor's
  output would be: the same key bytes and payloads, packed per target
  partition;
- ``Metrics`` used inside a step count under the step, as in Beam (a
  metrics container per step, reported with the task's other metrics);
- an error is re-raised naming the step (``[while running '...']``), as
  Beam's bundle processor tags it.
"""
from __future__ import annotations

import dataclasses
import functools
import traceback
from typing import Any, Callable, Iterable, Iterator, Sequence

from apache_beam.portability.api import beam_fn_api_pb2

from beam_ext.errors import BeamExtError
from beam_ext.runner._shuffle import Buckets, ShuffleWriter
from beam_ext.runner.worker._setup import WorkerSetup


@dataclasses.dataclass(frozen=True)
class DirectSideInput:
    """A side input of a step: its index among the stage's side inputs, its
    pickled view function, and its elements' windowed coder."""

    index: int
    view_fn: bytes
    coder: Any


@dataclasses.dataclass(frozen=True)
class DirectStep:
    """One ``Map``-like step: its name (Beam's transform id), pickled DoFn info,
    the window function of its input (which assigns a ``TimestampedValue``
    output's windows) and its side inputs, in Beam's argument order."""

    name: str
    payload: bytes
    window_fn: Any
    side_inputs: tuple[DirectSideInput, ...] = ()


@dataclasses.dataclass(frozen=True)
class DirectCombine:
    """The partial combine before a lifted ``CombinePerKey``'s shuffle: its name,
    pickled ``(CombineFn, args, kwargs)`` and its input's windowing strategy."""

    name: str
    combine_fn: bytes
    windowing: Any


@dataclasses.dataclass(frozen=True)
class DirectChain:
    """The steps of a fused stage, input to output, and the coders around them.

    With ``shuffle`` the output feeds a GroupByKey: the task yields
    ``(target partition, blob)`` pairs over ``partitions``, not elements.
    """

    steps: tuple[DirectStep, ...]
    input_coder: Any
    output_coder: Any
    precombine: DirectCombine | None = None
    shuffle: ShuffleWriter | None = None
    partitions: int = 0


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


def decoded_batches(coder: Any, limit_bytes: int, chunks: Iterable[bytes]) -> Iterator[list]:
    """The elements of encoded ``chunks``, in batches of at most ``_BATCH``
    elements that close once their encoded size reaches ``limit_bytes`` (the
    stage's bundle size): a batch of large elements (a grouping's values) is
    never held whole."""
    from apache_beam.coders.coder_impl import create_InputStream

    decode = coder.get_impl().decode_from_stream
    batch: list = []
    size = 0
    for chunk in chunks:
        stream = create_InputStream(chunk)
        left = len(chunk)
        while left > 0:
            batch.append(decode(stream, True))
            now = stream.size()
            size += left - now
            left = now
            if len(batch) == _BATCH or size >= limit_bytes:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


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
    from apache_beam.transforms import core

    if type(dofn) is core._KeyWithNone:  # CombineGlobally's first step, a generator DoFn
        return _key_with_none
    wrapper = getattr(dofn, "_fn", None)
    code = getattr(wrapper, "__code__", None)
    if code is None or code not in _map_wrapper_codes():
        return None
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in wrapper.__closure__)))["fn"]


def _key_with_none(value: Any) -> tuple:
    return None, value


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
    if args:
        # Beam passes a step's extra arguments after the element.
        process = lambda value, _p=process: _p(value, *args, **kwargs)  # noqa: E731
    elif kwargs:
        process = functools.partial(process, **kwargs)
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
                        if len(out) >= _BATCH:
                            # A step's fan-out is passed on a batch at a
                            # time, never held whole (memory bounded).
                            yield out
                            out = []
                            append = out.append
                            tracker.enter(state)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise StepFailed(traceback.format_exc() + _STEP_TAG % name) from exc
        if out:
            yield out


# The partial combine adds a batch's values per key in one call while a
# batch holds at most one key per _FEW_KEYS elements, and checks again every
# _REGROUP_EVERY batches.
_FEW_KEYS = 8
_REGROUP_EVERY = 64


def _precombine(combine: DirectCombine, tracker: _Tracker, state: _State,
                batches: Iterator[list], max_keys: int | None = None) -> Iterator[list]:
    """Beam's ``PGBKCVOperation`` over the task's input: one flush at the end, not one per bundle.

    ``max_keys``: the keys held before a tenth are evicted; Beam's bound by default."""
    from apache_beam.internal import pickler
    from apache_beam.transforms import combiners, core
    from apache_beam.transforms.window import GlobalWindows, TimestampCombiner
    from apache_beam.utils.windowed_value import WindowedValue

    fn, args, kwargs = pickler.loads(combine.combine_fn)[:3]
    combine_fn = combiners.curry_combine_fn(fn, args, kwargs)
    create, add, add_all = combine_fn.create_accumulator, combine_fn.add_input, combine_fn.add_inputs
    compact = None if combine_fn.compact.__func__ is core.CombineFn.compact else combine_fn.compact
    windowing = combine.windowing
    default = windowing.is_default()
    combiner = (None if windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW
                else TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn))
    # Beam's bound: more keys for combiners whose accumulators are known to be tiny.
    if max_keys is None:
        max_keys = 1000 * 1000 if (isinstance(fn, (combiners.CountCombineFn, combiners.MeanCombineFn)) or (
            isinstance(fn, core.CallableWrapperCombineFn) and fn._fn in (min, max, sum))) else 100 * 1000
    global_wv = GlobalWindows.windowed_value(None)
    table: dict = {}

    def emit(wkey: Any, entry: list) -> Any:
        value = entry[0] if compact is None else compact(entry[0])
        if default:
            return global_wv.with_value((wkey, value))
        window, key = wkey
        return WindowedValue((key, value), window.max_timestamp() if combiner is None else entry[1], (window,))

    def evict(out: list) -> None:
        # As Beam: the oldest tenth of the keys, in the order they came.
        target = len(table) * 9 // 10
        old = []
        for wkey, entry in table.items():
            old.append(wkey)
            out.append(emit(wkey, entry))
            if len(table) - len(old) <= target:
                break
        for wkey in old:
            del table[wkey]

    def new_entry(wkey: Any, timestamp: Any, out: list) -> list:
        # Called only for a key not held: a held key's entry (a non-empty
        # list, so truthy) is found by the caller's table.get.
        if len(table) >= max_keys:
            evict(out)
        entry = table[wkey] = [create(), timestamp]
        return entry

    grouping, batches_seen = True, 0
    tracker.enter(state)
    combine_fn.setup()
    try:
        for batch in batches:
            out: list = []
            tracker.enter(state)
            try:
                if default and batches_seen % _REGROUP_EVERY == 0:
                    grouping = True
                batches_seen += 1
                if default and grouping:
                    # A batch's values of a key are added in one call, which
                    # CombineFns may do faster than one at a time (Beam's
                    # contract: the same result). Worth it only where keys
                    # repeat within a batch: tried again now and then.
                    groups: dict = {}
                    for wv in batch:
                        key, value = wv.value
                        group = groups.get(key)
                        if group is None:
                            groups[key] = [value]
                        else:
                            group.append(value)
                    for key, values in groups.items():
                        entry = table.get(key) or new_entry(key, None, out)
                        entry[0] = add_all(entry[0], values)
                    grouping = len(groups) * _FEW_KEYS <= len(batch)
                    batch = ()
                for wv in batch:
                    key, value = wv.value
                    if default:
                        entry = table.get(key) or new_entry(key, None, out)
                        entry[0] = add(entry[0], value)
                        continue
                    timestamp = wv.timestamp if combiner is not None else None
                    for window in wv.windows:
                        wkey = (window, key)
                        entry = table.get(wkey) or new_entry(wkey, timestamp, out)
                        entry[0] = add(entry[0], value)
                        if combiner is not None:
                            entry[1] = combiner.combine(entry[1], timestamp)
            except Exception as exc:  # noqa: BLE001 - re-raised naming the step
                raise StepFailed(traceback.format_exc() + _STEP_TAG % combine.name) from exc
            if out:
                yield out
        tracker.enter(state)
        try:
            out = [emit(wkey, entry) for wkey, entry in table.items()]
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise StepFailed(traceback.format_exc() + _STEP_TAG % combine.name) from exc
        table.clear()
        if out:
            yield out
    finally:
        combine_fn.teardown()


def _shuffled(chain: DirectChain, batches: Iterator[list]) -> Iterator[tuple[int, bytes]]:
    """``(target partition, blob)`` pairs of the chain's output, as the bundle processor's would be packed."""
    last = chain.precombine.name if chain.precombine is not None else chain.steps[-1].name
    buckets = Buckets(chain.partitions)
    pairs = chain.shuffle.pairs
    for batch in batches:
        try:
            yield from buckets.add(pairs(batch))
        except Exception as exc:  # noqa: BLE001 - an output the GroupByKey's coder refuses
            raise StepFailed(traceback.format_exc() + _STEP_TAG % last) from exc
    yield from buckets.flush()


def _views(step: DirectStep, side_inputs: Sequence[Sequence[bytes]]) -> list:
    """The step's side-input values, each its view of all the elements (global window)."""
    from apache_beam.coders.coder_impl import create_InputStream
    from apache_beam.internal import pickler

    views = []
    for side in step.side_inputs:
        decode = side.coder.get_impl().decode_from_stream
        values = []
        for chunk in side_inputs[side.index]:
            stream = create_InputStream(chunk)
            while stream.size() > 0:
                values.append(decode(stream, True).value)
        views.append(pickler.loads(side.view_fn)(values))
    return views


def run_direct_chain(chain: DirectChain, setup: WorkerSetup | None, values: Iterator[Any],
                     report: list, side_inputs: Sequence[Sequence[bytes]] = (),
                     batched: bool = False) -> Iterator[Any]:
    """The chain's output for ``values`` (element objects, or lists of them if
    ``batched``): elements, or ``(target partition, blob)`` pairs if it feeds
    a GroupByKey. ``side_inputs``: the encoded chunks of the
    stage's side inputs, by index. Appends the task's serialized monitoring
    infos (user metrics per step) to ``report`` at the end."""
    from apache_beam.internal import pickler
    from apache_beam.internal.util import insert_values_in_args
    from apache_beam.metrics.execution import MetricsContainer
    from apache_beam.runners.worker import statesampler

    if setup is not None:
        setup.apply()  # before the DoFns are unpickled
    tracker = _Tracker()
    containers = []
    batches = values if batched else _batches(values)
    previous = statesampler.get_current_tracker()
    try:
        for step in chain.steps:
            dofn, args, kwargs, _, _ = pickler.loads(step.payload)
            if step.side_inputs:
                args, kwargs = insert_values_in_args(args, kwargs, _views(step, side_inputs))
            container = MetricsContainer(step.name)
            containers.append((step.name, container))
            batches = _run_step(step.name, dofn, tuple(args), dict(kwargs), step.window_fn, tracker,
                                _State(container), batches)
        if chain.precombine is not None:
            container = MetricsContainer(chain.precombine.name)
            containers.append((chain.precombine.name, container))
            batches = _precombine(chain.precombine, tracker, _State(container), batches)
        if chain.shuffle is not None:
            yield from _shuffled(chain, batches)
        else:
            for batch in batches:
                yield from batch
    finally:
        statesampler.set_current_tracker(previous)
    infos = [info for name, container in containers
             for info in container.to_runner_api_monitoring_infos(name).values()]
    report.append(beam_fn_api_pb2.ProcessBundleResponse(monitoring_infos=infos).SerializeToString())
