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
  kept, as Beam's ``_OutputHandler`` does; a ``TaggedOutput`` goes to the
  branches reading its tag where the step declares tagged outputs (see
  :mod:`beam_ext.runner.worker._branches`), and fails where it declares none;
- a ``DoFn`` with ``start_bundle`` or ``finish_bundle`` runs them per bundle
  of the stage's input, cut as Beam's bundle processor cuts it (see
  :func:`decoded_batches` and :func:`_in_bundles`);
- the partial combine keeps one accumulator per key (per key and window
  outside default windowing; per key and merged session in sessions, see
  :mod:`beam_ext.runner.worker._partial_sessions`), evicts a tenth of its
  keys when it holds Beam's maximum, compacts what it emits and stamps
  non-default windows' outputs as Beam does (end of window, or the
  timestamp combiner's value); a ``WindowInto`` just before it is folded in,
  and so is the ``Map`` of a ``GroupBy(...).aggregate_field(...)`` of named
  fields (:mod:`beam_ext.runner.worker._schema_group_by`);
- a first step that is a ``Map`` only picking fields takes a batch held as
  columns as columns (:mod:`beam_ext.runner.worker._projection`);
- a first step that is a stateful ``DoFn`` takes the stage's input grouped
  by key and runs a key at a time (:mod:`beam_ext.runner.worker._stateful`);
- an output feeding a GroupByKey is written as the bundle processor's
  output would be: the same key bytes and payloads, packed per target
  partition;
- ``Metrics`` used inside a step count under the step, as in Beam (a
  metrics container per step, reported with the task's other metrics);
- an error is re-raised naming the step (``[while running '...']`` after
  its message), as Beam's bundle processor tags it.
"""
from __future__ import annotations

import dataclasses
import functools
import traceback
from itertools import chain as chained
from itertools import islice, repeat
from types import GeneratorType
from typing import Any, Callable, Iterable, Iterator, Sequence

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.transforms import combiners, core
from apache_beam.utils.windowed_value import create as new_windowed

from beam_ext.errors import BeamExtError
from beam_ext.runner._element_batches import (
    BATCH,
    BUNDLE_END,
    PAUSE,
    Columns,
    Marker,
    Same,
    as_batch,
    as_batches,
    windowed,
)
from beam_ext.runner._shuffle import Buckets, KeyedValues, ShuffleWriter, WindowedKeyedValues
from beam_ext.runner._window_assign import assigner, keyed_assigner
from beam_ext.runner._window_keys import max_timestamp_micros, window_key
from beam_ext.runner.worker import _dofn_pool
from beam_ext.runner.worker._branches import MAIN_TAG, ByTag, Tagged, fork
from beam_ext.runner.worker._multimap_view import MultiMap
from beam_ext.runner.worker._partial_sessions import PartialSessions, merges_partially
from beam_ext.runner.worker._plain_accumulators import plain_accumulators, plain_tuple_accumulators
from beam_ext.runner.worker._projection import project, projection, traceable
from beam_ext.runner.worker._schema_group_by import (
    AggregatedFields,
    aggregated_fields,
    closure,
    grouped_key,
    grouped_pairs,
)
from beam_ext.runner.worker._setup import WorkerSetup


@dataclasses.dataclass(frozen=True)
class DirectSideInput:
    """A side input of a step: its index among the stage's side inputs, its
    pickled view function, its elements' windowed coder, and whether it is
    read as a multimap (``AsMultiMap``) or as an iterable. ``mapping``:
    its pickled window mapping function where an element reads the view of
    the side input's window its own window maps to (see :class:`_WindowedView`);
    None where every element reads the view of all its elements (the global window)."""

    index: int
    view_fn: bytes
    coder: Any
    mapping: bytes | None = None
    multimap: bool = False  # an AsMultiMap: its view function reads a MultiMap


class AssignWindows(core.DoFn):
    """A ``WindowInto``'s step (``beam:transform:window_into:v1``), as Beam's
    bundle processor runs it: each element, per window it is in, gets the
    windows the window function assigns it, its timestamp kept."""

    def __init__(self, windowfn: Any) -> None:
        self.windowfn = windowfn

    def process(self, element: Any, timestamp: Any = core.DoFn.TimestampParam,
                window: Any = core.DoFn.WindowParam) -> Iterator[Any]:
        from apache_beam.transforms.window import WindowFn
        from apache_beam.utils.windowed_value import WindowedValue

        new_windows = self.windowfn.assign(WindowFn.AssignContext(timestamp, element=element, window=window))
        yield WindowedValue(element, timestamp, new_windows)


@dataclasses.dataclass(frozen=True)
class DirectStep:
    """One ``Map``-like step: its name (Beam's transform id), pickled DoFn info,
    the window function of its input (which assigns a ``TimestampedValue``
    output's windows) and its side inputs, in Beam's argument order.
    ``tagged``: the step has tagged outputs (its chain then forks after it).
    ``bundles``: its DoFn defines ``start_bundle`` or ``finish_bundle``, or
    makes batches that close at bundle ends (``batched``).
    ``stateful``: its DoFn keeps state or sets timers; it is then the first
    step of its chain and takes the chain's input grouped by key (see
    :mod:`beam_ext.runner.worker._stateful`). ``batched``: its DoFn defines
    only ``process_batch`` (see :mod:`beam_ext.runner.worker._batched`)."""

    name: str
    payload: bytes
    window_fn: Any
    side_inputs: tuple[DirectSideInput, ...] = ()
    tagged: bool = False
    bundles: bool = False
    stateful: bool = False
    batched: bool = False


@dataclasses.dataclass(frozen=True)
class DirectCombinePhase:
    """A step of a combine after its GroupByKey: merge a key's accumulators
    or extract its output, for a lifted combine, or combine a key's values
    whole (``phase``: Beam's ``merge``, ``extract`` or ``all``), with pickled
    ``(CombineFn, args, kwargs)``."""

    name: str
    combine_fn: bytes
    phase: str


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
    ``output_coder`` is None where no step reads the output.

    With ``branches`` the line forks after its steps (see
    :mod:`._branches`): each branch is a chain of its own, ending at one of
    the stage's outputs, ``output`` its index (None: no step reads it).

    ``keyed_memory``: the first step is a stateful DoFn's; the executor
    hands the chain its input grouped by key (``_stateful.keyed_groups``),
    held within this many bytes. 0 otherwise.
    """

    steps: tuple[DirectStep | DirectCombinePhase, ...]
    input_coder: Any
    output_coder: Any
    precombine: DirectCombine | None = None
    shuffle: ShuffleWriter | None = None
    partitions: int = 0
    branches: tuple[DirectBranch, ...] = ()
    output: int | None = 0
    keyed_memory: int = 0

    def sees_bundles(self) -> bool:
        """Whether a step of the chain or its branches runs per bundle: its input must be cut into bundles."""
        return (any(getattr(step, "bundles", False) for step in self.steps)
                or any(branch.chain.sees_bundles() for branch in self.branches))

    def ends(self) -> Iterator[DirectChain]:
        """The chains where the stage's lines end: this one, or its branches' ends."""
        if not self.branches:
            yield self
        for branch in self.branches:
            yield from branch.chain.ends()


@dataclasses.dataclass(frozen=True)
class DirectBranch:
    """A branch of a chain that forks: the output it reads of the chain's last
    step (a tag, or ``MAIN_TAG``) and the chain of steps it runs."""

    tag: str
    chain: DirectChain


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


def _failed(name: str) -> StepFailed:
    """The error being handled, its step named after its message, as Beam's bundle processor names it."""
    return StepFailed(traceback.format_exc().rstrip("\n") + " " + _STEP_TAG % name)


def decoded_batches(coder: Any, limit_bytes: int, chunks: Iterable[bytes], bundles: bool = False) -> Iterator[Any]:
    """The elements of encoded ``chunks``, in batches of at most ``BATCH``
    elements that close once their encoded size reaches ``limit_bytes`` (the
    stage's bundle size): a batch of large elements (a grouping's values) is
    never held whole.

    With ``bundles``, a :data:`BUNDLE_END` between the batches of two
    bundles, cut as Beam's bundle processor cuts its input (``_bundles`` in
    :mod:`._task`): a bundle closes once its elements reach ``limit_bytes``,
    and none is left empty at the end.
    """
    from apache_beam.coders.coder_impl import create_InputStream

    decode = coder.get_impl().decode_from_stream
    batch: list = []
    size = 0
    bundle_size = 0
    ended = False
    for chunk in chunks:
        stream = create_InputStream(chunk)
        left = len(chunk)
        while left > 0:
            if ended:
                yield BUNDLE_END
                ended = False
            batch.append(decode(stream, True))
            now = stream.size()
            read = left - now
            size += read
            left = now
            if bundles:
                bundle_size += read
                if bundle_size >= limit_bytes:
                    yield batch
                    batch, size, bundle_size, ended = [], 0, 0, True
                    continue
            if len(batch) == BATCH or size >= limit_bytes:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _map_fn(dofn: Any) -> Callable | None:
    """The user's function of a ``Map``, whose DoFn wraps it as ``lambda x: [fn(x)]``, else None.

    Called directly, it saves the wrapper's call and one-element list per
    element. Recognised by the wrapper's code, which pickling copies but
    keeps equal. A ``GroupBy``'s ``Map`` gets an equal function that builds
    the key function once (:func:`grouped_pairs`).
    """
    fn = _wrapped_fn(dofn)
    return None if fn is None else grouped_pairs(fn) or fn


def _wrapped_fn(dofn: Any) -> Callable | None:
    """The function a ``Map`` step's DoFn wraps, as the user (or Beam's ``GroupBy``) gave it, else None."""
    from apache_beam.transforms import core

    if type(dofn) is core._KeyWithNone:  # CombineGlobally's first step, a generator DoFn
        return _key_with_none
    wrapper = getattr(dofn, "_fn", None)
    code = getattr(wrapper, "__code__", None)
    if code is None or code not in _map_wrapper_codes():
        return None
    return closure(wrapper)["fn"]


def _dead_letter_process(dofn: Any) -> Callable | None:
    """The ``process`` of Beam's dead-letter wrapper (``with_exception_handling``),
    its fields read from a plain copy; else None.

    The wrapper hands every name it does not hold on to the user's DoFn
    through a ``__getattribute__`` written in Python, which runs for each of
    its own fields too: several calls an element, more than the user's work
    in a ``Map``. The call is still the wrapper's own function, so a dead
    letter's traceback names the same frames as on Beam's runners.
    """
    import types

    if type(dofn) is not core._ExceptionHandlingWrapperDoFn:
        return None
    fields = object.__getattribute__(dofn, "__dict__")
    method = core._ExceptionHandlingWrapperDoFn.exception_handling_wrapper_do_fn_custom_process
    # With allow_unsafe_userstate_in_process the wrapper's process is another function.
    if getattr(fields.get("process"), "__func__", None) is not method:
        return None
    return functools.partial(method, types.SimpleNamespace(**fields))


def _top_adder(dofn: Any) -> Callable[[list], None] | None:
    """For Beam's per-bundle step of ``Top.Of`` (``_TopPerBundle``) without a key
    or a reversed order: a function adding a batch's values to its bundle's
    heap as its ``process`` adds each (``heappush`` until it holds ``n``, then
    ``heappushpop``), in one loop instead of a call per element. Else None."""
    import heapq

    if type(dofn) is not combiners._TopPerBundle or dofn._compare or dofn._key:
        return None
    n = dofn._n
    push, pushpop = heapq.heappush, heapq.heappushpop

    def add(values: list) -> None:
        heap = dofn._heap  # start_bundle gives each bundle its own
        for value in values:
            if len(heap) < n:
                push(heap, value)
            else:
                pushpop(heap, value)

    return add


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


def _keywords_in_order(call: Callable, given: int, kwargs: dict) -> tuple | None:
    """``kwargs``' values in the order of ``call``'s parameters, if they name
    the ones right after the element and the ``given`` positional arguments,
    else None.

    Passed by position they bind to the same parameters, and a call skips
    the merge of keyword dicts that ``functools.partial`` makes every time
    (a side input given as ``d=AsDict(...)``; ``benchmarks/runner_ab.py
    side_mean`` times a pipeline that has one).

    >>> _keywords_in_order(lambda word, weights, default=0: None, 0, {"weights": {}, "default": 1})
    ({}, 1)
    >>> _keywords_in_order(lambda word, *rest, weights: None, 0, {"weights": {}}) is None
    True
    """
    import inspect

    try:
        parameters = list(inspect.signature(call).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    end = 1 + given + len(kwargs)
    named = parameters[1 + given:end]
    if (len(named) != len(kwargs) or {p.name for p in named} != set(kwargs)
            or any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters[:end])):
        return None
    return tuple(kwargs[p.name] for p in named)


def _checks_output(dofn: Any) -> bool:
    """Whether Beam checks the step's first result for a str, bytes or dict
    (a DoFn class whose ``process`` returns rather than yields)."""
    import inspect

    from apache_beam.transforms import core

    return not isinstance(dofn, core.CallableWrapperDoFn) and not inspect.isgeneratorfunction(dofn.process)


def output_handler(name: str, window_fn: Any, tagged: bool) -> Callable[[Any, Any], Any]:
    """``output(wv, result)``: what Beam's ``_OutputHandler`` makes of a step's
    ``result`` that is not a plain value, for its input element ``wv``: a
    ``WindowedValue`` kept, a ``TimestampedValue`` given the windows
    ``window_fn`` assigns, a ``TaggedOutput`` filed under its tag where the
    step has ``tagged`` outputs (a :class:`Tagged`), refused where it has none."""
    from apache_beam.transforms.window import TimestampedValue, WindowFn
    from apache_beam.utils.windowed_value import WindowedValue

    windowing = (WindowedValue, TimestampedValue)
    windows_at = assigner(window_fn)

    def output(wv: Any, result: Any) -> Any:
        if isinstance(result, WindowedValue):
            if len(wv.windows) != 1:
                result.windows *= len(wv.windows)
            return result
        if isinstance(result, TimestampedValue):
            micros = result.timestamp.micros
            out = new_windowed(result.value, micros, windows_at(micros) if windows_at is not None else tuple(
                window_fn.assign(WindowFn.AssignContext(result.timestamp, result.value))))
            if len(wv.windows) != 1:
                out.windows *= len(wv.windows)
            return out
        if not tagged:
            raise ValueError(f"emitted TaggedOutput({result.tag!r}, ...), but the step has no tagged outputs")
        if not isinstance(result.tag, str):
            raise TypeError(f"In {name}, tag {result.tag!r} is not a string")  # as Beam's output handler
        value = result.value
        return Tagged(result.tag, output(wv, value) if isinstance(value, windowing) else wv.with_value(value))

    return output


def _run_step(name: str, dofn: Any, args: tuple, kwargs: dict, window_fn: Any, tracker: _Tracker,
              state: _State, batches: Iterator[Same | list], needs_setup: bool = False,
              tagged: bool = False) -> Iterator[Same | list]:
    from apache_beam.pvalue import TaggedOutput
    from apache_beam.transforms.window import TimestampedValue
    from apache_beam.utils.windowed_value import WindowedValue

    windowing = (WindowedValue, TimestampedValue)
    special = (WindowedValue, TimestampedValue, TaggedOutput)
    plain_types: set = set()
    windows_at = assigner(window_fn)
    stamped = {TimestampedValue}
    tagged_only = {TaggedOutput}
    output = output_handler(name, window_fn, tagged)

    def by_tag(template: Any, results: list) -> ByTag | None:
        """A tagged step's plain ``results`` and ``TaggedOutput``s of plain
        values, split by tag; None if one needs :func:`output`'s checks or windowing."""
        parts: dict[str, list] = {}
        main: list = []
        append = main.append
        for result in results:
            if type(result) is not TaggedOutput:
                append(result)
                continue
            value = result.value
            if isinstance(value, windowing):
                return None
            part = parts.get(result.tag)
            if part is not None:
                part.append(value)
            elif isinstance(result.tag, str):
                parts[result.tag] = [value]
            else:
                return None
        if main:
            # Beam's bundle processor files its main output under "None" too.
            parts[MAIN_TAG] = main + parts[MAIN_TAG] if MAIN_TAG in parts else main
        return ByTag({tag: Same(template, values) for tag, values in parts.items()})

    def outputs(template: Any, results: list) -> Same | ByTag | list:
        """``results`` of elements windowed as ``template``, as the next step's batch."""
        types = set(map(type, results))  # one pass in C; a type is checked once
        if not types <= plain_types:
            specials = {kind for kind in types - plain_types if issubclass(kind, special)}
            if specials:
                if windows_at is not None and types == stamped and len(template.windows) == 1:
                    # All timestamped (a FlatMap stamping events): output() without its checks.
                    return as_batch([new_windowed(r.value, (micros := r.timestamp.micros), windows_at(micros))
                                     for r in results])
                if tagged and specials == tagged_only and (split := by_tag(template, results)) is not None:
                    return split
                # Elements that may share windowing again (Reshuffle's
                # restored timestamps, all the minimum): checked. A
                # tagged step's are split by tag next (see _branches).
                out = [output(template, r) if isinstance(r, special) else template.with_value(r)
                       for r in results]
                return out if tagged else as_batch(out)
            plain_types.update(types)
        return Same(template, results)

    if needs_setup:
        tracker.enter(state)
        try:
            dofn.setup()  # once per instance: the pool keeps it for later tasks
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise _failed(name) from exc
    if type(dofn) is AssignWindows:
        windows_at = assigner(dofn.windowfn)
        assign = _by_windowfn(dofn.windowfn) if windows_at is None else _by_standard_windows(windows_at)
        yield from _assign_windows(name, assign, tracker, state, batches)
        return
    check = _checks_output(dofn)
    with_params = _param_invoker(dofn, args, kwargs)
    if with_params is not None:
        yield from _run_with_params(name, with_params, check, output, outputs, special, tracker, state, batches)
        return
    fn = _map_fn(dofn)
    call = (_dead_letter_process(dofn) or dofn.process) if fn is None else fn
    top = _top_adder(dofn)
    if kwargs:
        tail = _keywords_in_order(call, len(args), kwargs)
        if tail is None:
            call = functools.partial(call, **kwargs)
        else:
            args += tail
    # Beam passes a step's extra arguments after the element: a Map's
    # function is mapped over the values and a repeat of each.
    extra = [repeat(arg) for arg in args]
    process = (lambda value: call(value, *args)) if args else call
    for batch in batches:
        if type(batch) is Marker:
            yield batch
            continue
        # Again for every batch: a bundle processor run in between (another
        # stage of the task, while this chain waits for input) resets it.
        tracker.enter(state)
        try:
            if type(batch) is not Same:
                yield from _run_windowed(process, fn is not None, check, output, special, batch, tracker, state)
                check = False
                continue
            template = batch.template
            if fn is not None:
                yield outputs(template, list(map(call, batch.values, *extra)))
                continue
            if top is not None:  # its process outputs nothing
                top(batch.values)
                continue
            out: list = []
            append = out.append
            for value in batch.values:
                results = process(value)
                if type(results) is GeneratorType:
                    # Read here as it yields, a batch at a time: a DoFn
                    # yielding one result or none then costs little more
                    # than its own work (a generator of _fan_out's per
                    # element cost several times that), and a large fan-out
                    # is never held whole.
                    for result in results:
                        append(result)
                        if len(out) >= BATCH:
                            yield outputs(template, out)
                            out = []
                            append = out.append
                            tracker.enter(state)
                    continue
                if check:
                    check_result(results)
                    check = False
                if results is None:
                    continue
                if type(results) in (list, tuple) and len(results) <= BATCH:
                    out += results
                else:
                    out = yield from _fan_out(out, results, template, outputs, tracker, state)
                    append = out.append
                if len(out) >= BATCH:
                    yield outputs(template, out)
                    out = []
                    append = out.append
                    tracker.enter(state)
            if out:
                yield outputs(template, out)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise _failed(name) from exc


def _run_batched(name: str, dofn: Any, window_fn: Any, tracker: _Tracker, state: _State, batches: Iterator[Any],
                 needs_setup: bool = False) -> Iterator[Any]:
    """A batched DoFn's step (see :mod:`._batched`); its bundles, and so its ``setup``, are ``_in_bundles``'s."""
    from beam_ext.runner.worker._batched import run_batched

    output = output_handler(name, window_fn, False) if dofn._process_batch_yields_elements else None
    return run_batched(dofn, functools.partial(tracker.enter, state), lambda: _failed(name), batches, output)


def _in_bundles(name: str, dofn: Any, tagged: bool, tracker: _Tracker, state: _State, needs_setup: bool,
                run: Callable[[Iterator[Any]], Iterator[Any]], batches: Iterator[Any]) -> Iterator[Any]:
    """A step whose DoFn defines ``start_bundle`` or ``finish_bundle``, as
    Beam's ``DoFnRunner`` runs it: ``start_bundle`` before a bundle's first
    element, ``finish_bundle`` after its last, its outputs (``WindowedValue``
    only, as Beam requires) passed on before the next bundle starts.
    ``run(batches)`` is the step's run over elements; the bundles end where
    ``batches`` hold :data:`BUNDLE_END`, and with the input."""
    from apache_beam.pvalue import TaggedOutput
    from apache_beam.utils.windowed_value import WindowedValue

    def call(method: Callable) -> Any:
        tracker.enter(state)
        try:
            return method()
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise _failed(name) from exc

    def start() -> None:
        results = call(dofn.start_bundle)
        if results is not None:
            raise StepFailed(f"Start Bundle should not output any elements but got {results!r} " + _STEP_TAG % name)

    def checked(result: Any) -> Any:
        tag = None
        if isinstance(result, TaggedOutput):
            tag = result.tag
            if not isinstance(tag, str):
                raise TypeError(f"In {name}, tag {tag!r} is not a string")
            result = result.value
        if not isinstance(result, WindowedValue):
            raise RuntimeError(f"Finish Bundle should only output WindowedValue type but got {type(result)}")
        if tag is None:
            return result
        if not tagged:
            raise ValueError(f"emitted TaggedOutput({tag!r}, ...), but the step has no tagged outputs")
        return Tagged(tag, result)

    def finish() -> Iterator[list]:
        # A batch at a time: a DoFn may emit much from finish_bundle (what it buffered).
        results = iter(call(dofn.finish_bundle) or ())
        while True:
            tracker.enter(state)
            try:
                out = [checked(result) for result in islice(results, BATCH)]
            except Exception as exc:  # noqa: BLE001 - re-raised naming the step
                raise _failed(name) from exc
            if not out:
                return
            yield out if tagged else as_batch(out)

    if needs_setup:
        call(dofn.setup)  # before the first bundle starts
    start()
    for batch in run(batches):
        if batch is BUNDLE_END:
            yield from finish()
            start()
        yield batch
    yield from finish()


def _assign_windows(name: str, assign: Callable[[Same | list], Iterator[Same | list]], tracker: _Tracker,
                    state: _State, batches: Iterator[Same | list]) -> Iterator[Same | list]:
    """A ``WindowInto`` step, each batch assigned by ``assign`` (:func:`_by_standard_windows`
    or :func:`_by_windowfn`), as :class:`AssignWindows` would run: each element
    once per window it was in, since Beam calls it per window; timestamp kept, pane unknown."""
    for batch in batches:
        if type(batch) is Marker:
            yield batch
            continue
        tracker.enter(state)
        try:
            yield from assign(batch)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise _failed(name) from exc


def _by_standard_windows(windows_at: Callable[[int], tuple]) -> Callable[[Same | list], Iterator[Same | list]]:
    """Assignment by one of Beam's standard window functions (see
    :mod:`beam_ext.runner._window_assign`): a batch sharing a timestamp is assigned once."""
    def assign(batch: Same | list) -> Iterator[Same | list]:
        if type(batch) is Same:
            template = batch.template
            micros = template.timestamp_micros
            new = Same(new_windowed(None, micros, windows_at(micros)), batch.values)
            for _ in template.windows:
                yield new
            return
        out: list = []
        for wv in batch:
            micros = wv.timestamp_micros
            new_windows = windows_at(micros)
            value = wv.value
            for _ in wv.windows:
                out.append(new_windowed(value, micros, new_windows))
        yield out

    return assign


def _by_windowfn(windowfn: Any) -> Callable[[Same | list], Iterator[list]]:
    """Assignment by any other window function (a user's own), without a DoFn
    call per element: its ``assign`` asked once per window the element was
    in, with the element's value, timestamp and that window, as Beam asks it."""
    from apache_beam.transforms.window import WindowFn

    context, windows_of = WindowFn.AssignContext, windowfn.assign

    def assign(batch: Same | list) -> Iterator[list]:
        out: list = []
        for wv in windowed(batch):
            value, micros, timestamp = wv.value, wv.timestamp_micros, wv.timestamp
            for w in wv.windows:
                out.append(new_windowed(value, micros, tuple(windows_of(context(timestamp, element=value, window=w)))))
        yield out

    return assign


def _fan_out(out: list, results: Iterable, template: Any, outputs: Callable, tracker: _Tracker,
             state: _State) -> Iterator[Same | list]:
    """Adds a step's ``results`` for one element to ``out``; yields each batch
    they fill and returns what is left.

    A fan-out is passed on a batch at a time, never held whole (memory
    bounded); a generator's body runs here, under the step's state, as it is read.
    """
    rest = iter(results)
    while True:
        out += islice(rest, BATCH - len(out))
        if len(out) < BATCH:
            return out
        yield outputs(template, out)
        out = []
        tracker.enter(state)


def _param_invoker(dofn: Any, args: tuple, kwargs: dict,
                   restriction: str | None = None) -> tuple[Callable, bool] | None:
    """For a ``process`` taking ``DoFn.TimestampParam``, ``WindowParam``,
    ``PaneInfoParam`` or ``WindowedValueParam``, or side inputs read per window
    (:class:`_WindowedView` among ``args`` and ``kwargs``): ``(call(value,
    windowed), observes window)``, its arguments bound as Beam's
    ``PerWindowInvoker`` binds them (``windowed`` gives the timestamp, window
    and pane). None for other DoFns.

    ``restriction``: a splittable DoFn's argument taking its restriction
    tracker (:mod:`._splittable`), which Beam passes by keyword; the call is
    then ``call(value, windowed, tracker)``."""
    from apache_beam.runners.common import MethodWrapper, _get_arg_placeholders

    # Beam's DoFnSignature also validates the DoFn's state and timers (done when
    # the pipeline was built), at a few milliseconds per task and step.
    method = MethodWrapper(dofn, "process")
    windowed_views = any(type(a) is _WindowedView for a in (*args, *kwargs.values()))
    if restriction is None and not windowed_views and not any(
            isinstance(d, core._DoFnParam) and d != core.DoFn.ElementParam for d in method.defaults):
        return None
    placeholders, bound, keywords = _get_arg_placeholders(method, list(args), dict(kwargs))
    process = method.method_value
    # Side inputs read per window: Beam then calls the DoFn once per window of an element.
    observes_window = windowed_views or any(p == core.DoFn.WindowParam for _, p in placeholders)
    fill = [(i, lambda value, wv, view=a: view.at(wv.windows[0]))
            for i, a in enumerate(bound) if type(a) is _WindowedView]
    keyword_views = [(k, a) for k, a in keywords.items() if type(a) is _WindowedView]
    keywords = {k: a for k, a in keywords.items() if type(a) is not _WindowedView}
    for i, p in placeholders:
        if p == core.DoFn.ElementParam:
            fill.append((i, lambda value, wv: value))
        elif p == core.DoFn.TimestampParam:
            fill.append((i, lambda value, wv: wv.timestamp))
        elif p == core.DoFn.WindowParam:
            fill.append((i, lambda value, wv: wv.windows[0]))
        elif p == core.DoFn.PaneInfoParam:
            fill.append((i, lambda value, wv: wv.pane_info))
        elif p == core.DoFn.WindowedValueParam:
            fill.append((i, lambda value, wv: wv.with_value(value)))
        else:  # the planner admits no other parameter
            raise ValueError(f"{type(dofn).__name__}.process takes {p}, which stages on objects do not give")

    def call(value: Any, wv: Any) -> Any:
        arguments = list(bound)
        for i, get in fill:
            arguments[i] = get(value, wv)
        if keyword_views:
            return process(*arguments, **keywords, **{k: view.at(wv.windows[0]) for k, view in keyword_views})
        return process(*arguments, **keywords)

    if restriction is not None:
        def call_tracked(value: Any, wv: Any, tracker: Any) -> Any:
            arguments = list(bound)
            for i, get in fill:
                arguments[i] = get(value, wv)
            return process(*arguments, **keywords, **{restriction: tracker})

        if keyword_views:  # the planner gives a splittable DoFn no side inputs
            raise ValueError(f"{type(dofn).__name__}.process reads side inputs per window and is splittable")
        return call_tracked, observes_window
    return call, observes_window


def _per_window(batch: Same | list, observes_window: bool) -> Iterator[tuple[Any, list]]:
    """``(windowing, values)`` runs of ``batch``: one per window of each element
    when the DoFn observes its window, as Beam calls such a DoFn once per window."""
    from apache_beam.utils.windowed_value import WindowedValue

    if type(batch) is Same:
        template = batch.template
        if observes_window and len(template.windows) > 1:
            for w in template.windows:
                yield WindowedValue(None, template.timestamp, (w,), template.pane_info), batch.values
        else:
            yield template, batch.values
        return
    for wv in batch:
        if observes_window and len(wv.windows) > 1:
            for w in wv.windows:
                yield WindowedValue(wv.value, wv.timestamp, (w,), wv.pane_info), [wv.value]
        else:
            yield wv, [wv.value]


def _run_with_params(name: str, invoker: tuple[Callable, bool], check: bool, output: Callable, outputs: Callable,
                     special: tuple, tracker: _Tracker, state: _State,
                     batches: Iterator[Same | list]) -> Iterator[Same | list]:
    """A step whose ``process`` takes DoFn parameters (``WindowInto`` among them),
    run as Beam runs it: the parameters filled per element, per window where it
    observes its window."""
    call, observes_window = invoker
    for batch in batches:
        if type(batch) is Marker:
            yield batch
            continue
        tracker.enter(state)
        try:
            if type(batch) is Same:
                for template, values in _per_window(batch, observes_window):
                    out: list = []
                    for value in values:
                        results = call(value, template)
                        if check:
                            check_result(results)
                            check = False
                        if results is not None:
                            out = yield from _fan_out(out, results, template, outputs, tracker, state)
                    if out:
                        yield outputs(template, out)
                continue
            elements: list = []
            for wv, [value] in _per_window(batch, observes_window):
                results = call(value, wv)
                if check:
                    check_result(results)
                    check = False
                if results is not None:
                    elements += [output(wv, r) if isinstance(r, special) else wv.with_value(r) for r in results]
                if len(elements) >= BATCH:
                    yield elements
                    elements = []
                    tracker.enter(state)
            if elements:
                yield elements
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise _failed(name) from exc


def check_result(results: Any) -> None:
    """Beam's check of a DoFn's first result (apache/beam#18712): not a str, bytes or dict."""
    if isinstance(results, (str, bytes, dict)):
        raise TypeError(f"Returning a {type(results).__name__} from a ParDo or FlatMap is not allowed. "
                        f"Please use list({results!r}) if you really want this behavior.")


def _run_windowed(process: Callable, is_map: bool, check: bool, output: Callable, special: tuple,
                  batch: list, tracker: _Tracker, state: _State) -> Iterator[list]:
    """A step over ``WindowedValue`` elements of differing windowing, as Beam runs it per element."""
    out: list = []
    append = out.append
    if is_map:
        for wv in batch:
            result = process(wv.value)
            append(output(wv, result) if isinstance(result, special) else wv.with_value(result))
    else:
        for wv in batch:
            results = process(wv.value)
            if check:
                check_result(results)
                check = False
            if results is None:
                continue
            for result in results:
                append(output(wv, result) if isinstance(result, special) else wv.with_value(result))
                if len(out) >= BATCH:
                    yield out
                    out = []
                    append = out.append
                    tracker.enter(state)
    if out:
        yield out


# Builtins that iterate their argument once: Beam's re-iterable chain of a
# merge's accumulators is then a plain chain.
_ONE_PASS = (sum, min, max)


def _one_pass(fn: Any) -> Callable | None:
    """The builtin of ``sum``, ``min`` or ``max`` that ``fn``, Beam's wrapper of
    a function (with no extra arguments: curried ones are another type),
    merges accumulators by; else None."""
    if type(fn) in (core.NoSideInputsCallableWrapperCombineFn, core.CallableWrapperCombineFn) and fn._fn in _ONE_PASS:
        return fn._fn
    return None


def _merged_output(fn: Any) -> Callable[[Any], Any]:
    """``extract_output(merge_accumulators(accumulators))`` of ``fn`` as one call.

    A function's: ``extract_output`` of ``merge_accumulators``' one-value
    list is the function of it (``sum``'s ``0 +`` included, as Beam adds it).
    A tuple of CombineFns' (``TupleCombineFn``, ``SingleInputTupleCombineFn``):
    each component's over its part of the accumulators, as Beam's merges
    them component by component (in batches, which for these left folds
    from ``0`` or the first value gives the same result) and extracts a tuple.
    """
    one_pass = _one_pass(fn)
    if one_pass is not None:
        return lambda accumulators: one_pass((one_pass(chained.from_iterable(accumulators)),))
    if type(fn) in (combiners.TupleCombineFn, combiners.SingleInputTupleCombineFn):
        parts = [_merged_output(component) for component in fn._combiners]
        return lambda accumulators: tuple([part(components) for part, components
                                           in zip(parts, zip(*accumulators))])
    merge, extract = fn.merge_accumulators, fn.extract_output
    return lambda accumulators: extract(merge(accumulators))


def phase_apply(phase: str, executor: Any) -> Callable[[Any], Any]:
    """``executor.apply`` (Beam's ``PhasedCombineFnExecutor``) as the
    ``CombineFn``'s own method where the executor only passes it on: a
    call fewer per key. A function's merge of ``sum``, ``min`` or ``max``
    chains the accumulators itself. ``phase`` ``merge_extract``: the
    output of a key's accumulators merged (see :func:`_merged_output`)."""
    fn = executor.combine_fn
    if phase == "merge":
        one_pass = _one_pass(fn)
        if one_pass is not None:
            return lambda accumulators: [one_pass(chained.from_iterable(accumulators))]
        return fn.merge_accumulators
    if phase == "merge_extract":  # both phases, as a merge's extract run with it (see _run_phase)
        return _merged_output(fn)
    if phase == "extract":
        return fn.extract_output
    return executor.apply


def extracts_after(merge: DirectCombinePhase | DirectStep, extract: DirectCombinePhase | DirectStep) -> bool:
    """Whether ``extract`` extracts the outputs of ``merge``'s accumulators:
    a lifted combine's last two phases, one after the other."""
    return (type(merge) is DirectCombinePhase and type(extract) is DirectCombinePhase and merge.phase == "merge"
            and extract.phase == "extract" and extract.combine_fn == merge.combine_fn)


def _run_phase(phase: DirectCombinePhase, tracker: _Tracker, state: _State, batches: Iterator[Same | list],
               then: tuple[DirectCombinePhase, _State] | None = None) -> Iterator[Same | list]:
    """Beam's ``CombineOperation``: each ``(key, values)`` element becomes
    ``(key, phase of the values)``, its windowing kept. ``then``: the
    extract phase after this merge (see :func:`extracts_after`) and its
    state, run in the same pass where the ``CombineFn`` is one of Beam's
    plain arithmetic or a tuple of them (see :mod:`._plain_accumulators`),
    which runs no user code to count metrics under either phase; else
    after it."""
    from apache_beam.internal import pickler

    fn, args, kwargs = pickler.loads(phase.combine_fn)[:3]
    if then is not None and (args or kwargs or (plain_accumulators(fn) is None
                                                 and plain_tuple_accumulators(fn) is None)):
        yield from _run_phase(then[0], tracker, then[1], _run_phase(phase, tracker, state, batches))
        return
    executor = combiners.PhasedCombineFnExecutor(phase.phase, fn, args, kwargs)
    apply = phase_apply("merge_extract" if then is not None else phase.phase, executor)

    def keyed(kv: tuple) -> tuple:
        key, values = kv
        return key, apply(values)

    tracker.enter(state)
    executor.combine_fn.setup()
    try:
        for batch in batches:
            if type(batch) is Marker:
                yield batch
                continue
            tracker.enter(state)
            try:
                if type(batch) is Same:
                    out: Same | list = Same(batch.template, [(key, apply(values)) for key, values in batch.values])
                else:
                    out = [wv.with_value(keyed(wv.value)) for wv in batch]
            except Exception as exc:  # noqa: BLE001 - re-raised naming the step
                raise _failed(phase.name) from exc
            yield out
    finally:
        executor.combine_fn.teardown()


def _keeps_plain(windowing: Any, args: Any, kwargs: Any, unkeyed: bool) -> bool:
    """Whether a partial combine may keep plain accumulators: a keyed one
    without extra arguments, whose windowed outputs are stamped at the end
    of their window, as there is no output time to track."""
    from apache_beam.transforms.window import TimestampCombiner

    return (not unkeyed and not args and not kwargs
            and (windowing.is_default() or windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW))


def _takes_fields(combine: DirectCombine, fields: AggregatedFields) -> bool:
    """Whether the partial combine can take ``fields``' pairs: plain
    accumulators of a ``TupleCombineFn`` with a component per value field,
    in windows it does not merge itself."""
    from apache_beam.internal import pickler

    fn, args, kwargs = pickler.loads(combine.combine_fn)[:3]
    return (_keeps_plain(combine.windowing, args, kwargs, unkeyed=False) and not merges_partially(combine.windowing)
            and plain_tuple_accumulators(fn) is not None and len(fn._combiners) == len(fields.value_fields))


def _run_fields(name: str, fields: AggregatedFields, tracker: _Tracker, state: _State,
                batches: Iterator[Same | list]) -> Iterator[Same | list]:
    """In place of Beam's ``Map`` of a ``GroupBy(...).aggregate_field(...)``
    named ``name``: its input rows' pairs read by field name, their
    windowing kept."""
    pairs = fields.pairs
    for batch in batches:
        if type(batch) is Marker:
            yield batch
            continue
        tracker.enter(state)
        try:
            if type(batch) is Same:
                out: Same | list = Same(batch.template, pairs(batch.values))
            else:
                out = [wv.with_value(pair) for wv, pair in zip(batch, pairs([wv.value for wv in batch]))]
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise _failed(name) from exc
        yield out


def _picks_fields(step: DirectStep, info: tuple) -> bool:
    """Whether ``step`` is a ``Map`` that may only pick fields (see :mod:`._projection`)."""
    dofn, args, kwargs, _, _ = info
    fn = _map_fn(dofn)
    return (fn is not None and fn is not _key_with_none and not step.side_inputs and not args and not kwargs
            and traceable(fn))


def _run_picking(step: DirectStep, dofn: Any, tracker: _Tracker, state: _State, batches: Iterator[Any],
                 needs_setup: bool) -> Iterator[Same | list | Columns]:
    """A ``Map`` that may only pick fields: a batch held as columns becomes
    the columns it picks (:func:`project`); any other batch, or one it does
    not only pick fields of, runs per element as before."""
    batches = iter(batches)
    first = next(batches, None)
    if type(first) is not Columns:  # a producer's batches are all of a kind: these run as before
        if first is not None:
            yield from _run_step(step.name, dofn, (), {}, step.window_fn, tracker, state,
                                 as_batches(chained([first], batches)), needs_setup=needs_setup)
        return
    fn = _map_fn(dofn)
    picked: dict[tuple, tuple | None] = {}  # by the batches' shape and columns' names
    for batch in chained([first], batches):
        if type(batch) is Columns:
            kind = (batch.shape, batch.names())
            if kind not in picked:
                picked[kind] = projection(fn, kind[1], batch.shape)
            if picked[kind] is not None:
                tracker.enter(state)
                yield project(picked[kind], batch)
                continue
        yield from _run_step(step.name, dofn, (), {}, step.window_fn, tracker, state, as_batches([batch]),
                             needs_setup=needs_setup)
        needs_setup = False


# The partial combine adds a batch's values per key in one call while a
# batch holds at most one key per _FEW_KEYS elements, and checks again every
# _REGROUP_EVERY batches.
_FEW_KEYS = 8
_REGROUP_EVERY = 64

# The windows of an element under default windowing, for the partial combine:
# its table is keyed by the key alone.
_KEY_ALONE = (None,)

# A partial combine that holds more than _HELD_SHARE as many keys as it has
# taken elements, once it has taken _PROBE_ROWS, passes the rest on each
# alone: its table would cost more than the shuffle it saves. Spark SQL's
# and DataFusion's partial aggregations stop at the same evidence (DataFusion's
# defaults: 100,000 rows, 0.8).
_PROBE_ROWS = 100_000
_HELD_SHARE = 0.8


def _precombine(combine: DirectCombine, tracker: _Tracker, state: _State, batches: Iterator[Same | list],
                max_keys: int | None = None, unkeyed: bool = False, folded: Any = None,
                fields: AggregatedFields | None = None, probe_rows: int = _PROBE_ROWS) -> Iterator[Same | list]:
    """Beam's ``PGBKCVOperation`` over the task's input: one flush at the end, not one per bundle.

    ``max_keys``: the keys held before a tenth are evicted; Beam's bound by
    default. ``unkeyed``: the input is the values alone, each under the key
    None (``CombineGlobally``'s key-with-None step, folded in; default
    windowing only). ``folded``: the window function of a ``WindowInto``
    folded in, the input not yet in its windows: sessions the combine merges
    are computed from the timestamps (see :class:`PartialSessions`), plain
    accumulators take fixed or sliding windows with their keys from
    :func:`keyed_assigner`, with no window or key made per element; other
    combines run the ``WindowInto`` first. ``fields``: the input is the
    pairs of :meth:`AggregatedFields.pairs`, whose keys are made Beam's
    ``Key`` rows as they are emitted (see :func:`_takes_fields`).
    ``probe_rows``: the elements taken before the combine checks that its
    keys repeat (under default windowing, keyed); if they hardly do, it
    emits its table and passes each next element on alone, as the
    accumulator of its value (see ``_HELD_SHARE``)."""
    from apache_beam.internal import pickler
    from apache_beam.transforms import core
    from apache_beam.transforms.window import GlobalWindows, TimestampCombiner
    from apache_beam.utils.windowed_value import WindowedValue

    fn, args, kwargs = pickler.loads(combine.combine_fn)[:3]
    combine_fn = combiners.curry_combine_fn(fn, args, kwargs)
    create, add, add_all = combine_fn.create_accumulator, combine_fn.add_input, combine_fn.add_inputs
    compact = None if combine_fn.compact.__func__ is core.CombineFn.compact else combine_fn.compact
    windowing = combine.windowing
    default = windowing.is_default()
    assert default or not unkeyed
    combiner = (None if windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW
                else TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn))
    # Beam's bound: more keys for combiners whose accumulators are known to be tiny.
    if max_keys is None:
        max_keys = 1000 * 1000 if (isinstance(fn, (combiners.CountCombineFn, combiners.MeanCombineFn)) or (
            isinstance(fn, core.CallableWrapperCombineFn) and fn._fn in (min, max, sum))) else 100 * 1000
    # Count's, Mean's, sum's, min's and max's CombineFns keep plain
    # accumulators in the table, updated by the same arithmetic without a
    # call per element (see _plain_accumulators). Windowed, they are keyed
    # by (window_key, key), the windows kept aside.
    plain = ((plain_tuple_accumulators if fields is not None else plain_accumulators)(fn)
             if _keeps_plain(windowing, args, kwargs, unkeyed) else None)
    assert plain or fields is None
    rekey = fields.key if fields is not None else None
    # Sessions are merged per key before the shuffle, not kept per element.
    sessions = None
    if not unkeyed and merges_partially(windowing):
        gap = None if folded is None else folded.gap_size.micros
        sessions = PartialSessions(create, add_all, compact, gap=gap)
    keyed_at = keyed_assigner(folded) if folded is not None and plain and not default else None
    if folded is not None and sessions is None and keyed_at is None:
        batches = _assign_windows(combine.name, _by_standard_windows(assigner(folded)), tracker, state, batches)
    global_wv = GlobalWindows.windowed_value(None)
    table: dict = plain.new_table() if plain else {}
    # window_key -> (window,), for plain windowed accumulators: the emitted
    # elements of a window share the tuple, which the shuffle's writer
    # recognises by identity (ShuffleWriter's windows_apart).
    window_of: dict = {}

    def emit(wkey: Any, entry: Any) -> Any:
        """An output: under default windowing a value of ``global_wv``'s windowing, else an element."""
        if plain:
            if default:
                return (wkey if rekey is None else rekey(wkey)), plain.finish(entry)
            windows = window_of[wkey[0]]
            key = wkey[1] if rekey is None else rekey(wkey[1])
            return new_windowed((key, plain.finish(entry)), max_timestamp_micros(windows[0]), windows)
        value = entry[0] if compact is None else compact(entry[0])
        if default:
            return wkey, value
        window = entry[2]
        if combiner is None:
            return new_windowed((wkey[1], value), max_timestamp_micros(window), (window,))
        return WindowedValue((wkey[1], value), entry[1], (window,))

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
        if window_of:
            held = {wkey[0] for wkey in table}
            for gone in [k for k in window_of if k not in held]:
                del window_of[gone]

    def windowed_pairs(batch: Same | list) -> list:
        """A batch's ``((window_key, key), value)`` pairs, once per window of each element."""
        if type(batch) is Same:
            keys = []
            for window in batch.template.windows:
                keys.append(window_key(window))
                window_of.setdefault(keys[-1], (window,))
            return [((k, key), value) for key, value in batch.values for k in keys]
        pairs: list = []
        append = pairs.append
        for wv in batch:
            key, value = wv.value
            for window in wv.windows:
                k = window_key(window)
                if k not in window_of:
                    window_of[k] = (window,)
                append(((k, key), value))
        return pairs

    def folded_pairs(batch: Same | list) -> list:
        """A batch's ``((window_key, key), value)`` pairs in the windows the folded
        ``WindowInto`` assigns, once per window of each element it was in before."""
        if type(batch) is Same:
            keys = []
            for k, window in keyed_at(batch.template.timestamp_micros):
                keys.append(k)
                window_of.setdefault(k, (window,))
            keys *= len(batch.template.windows)
            return [((k, key), value) for key, value in batch.values for k in keys]
        pairs: list = []
        append = pairs.append
        for wv in batch:
            key, value = wv.value
            keyed = keyed_at(wv.timestamp_micros)
            if len(wv.windows) != 1:
                keyed *= len(wv.windows)
            for k, window in keyed:
                if k not in window_of:
                    window_of[k] = (window,)
                append(((k, key), value))
        return pairs

    def new_entry(wkey: Any, timestamp: Any, out: list, window: Any = None) -> list:
        # Called only for a key not held: a held key's entry (a non-empty
        # list, so truthy) is found by the caller's table.get. A windowed
        # key is (window_key(window), key): the entry keeps the window.
        if len(table) >= max_keys:
            evict(out)
        entry = table[wkey] = [create(), timestamp, window]
        return entry

    def add_grouped(kvs: list, windows: tuple, timestamp: Any, out: list) -> int:
        """Adds a batch's values of a key in one call, which CombineFns may do
        faster than one at a time (Beam's contract: the same result); the
        number of keys."""
        groups: dict = {}
        for key, value in kvs:
            group = groups.get(key)
            if group is None:
                groups[key] = [value]
            else:
                group.append(value)
        for key, values in groups.items():
            for window in windows:
                wkey = key if window is None else (window_key(window), key)
                entry = table.get(wkey) or new_entry(wkey, timestamp, out, window)
                entry[0] = add_all(entry[0], values)
                if combiner is not None:
                    entry[1] = combiner.combine(entry[1], timestamp)
        return len(groups)

    def add_each(kvs: list, windows: tuple, timestamp: Any, out: list) -> None:
        if windows is _KEY_ALONE:
            for key, value in kvs:
                entry = table.get(key) or new_entry(key, None, out)
                entry[0] = add(entry[0], value)
            return
        for key, value in kvs:
            for window in windows:
                wkey = (window_key(window), key)
                entry = table.get(wkey) or new_entry(wkey, timestamp, out, window)
                entry[0] = add(entry[0], value)
                if combiner is not None:
                    entry[1] = combiner.combine(entry[1], timestamp)

    def add_windowed(batch: list, out: list) -> None:
        # Elements of differing windowing, each added in its own windows.
        for wv in batch:
            add_each((wv.value,), wv.windows, wv.timestamp if combiner is not None else None, out)

    def alone(pairs: list) -> list:
        """Each pair's key with the compacted accumulator of its value alone."""
        if plain:
            singles = plain.singles(pairs)
            return singles if rekey is None else [(rekey(key), acc) for key, acc in singles]
        if compact is None:
            return [(key, add(create(), value)) for key, value in pairs]
        return [(key, compact(add(create(), value))) for key, value in pairs]

    grouping, batches_seen = True, 0
    # Until probed: the elements taken. Sessions merge, and the unkeyed
    # combine has one key: both always pay.
    probing, passing, taken = default and not unkeyed and sessions is None, False, 0
    tracker.enter(state)
    combine_fn.setup()
    try:
        for batch in batches:
            if type(batch) is Marker:
                yield batch
                continue
            out: list = []
            tracker.enter(state)
            try:
                same = type(batch) is Same
                if passing:
                    out = alone(batch.values if same else [wv.value for wv in batch])
                elif sessions is not None:
                    out = sessions.add(batch)
                elif plain:
                    plain.add(table, (batch.values if same else [wv.value for wv in batch]) if default
                             else folded_pairs(batch) if keyed_at is not None else windowed_pairs(batch))
                    if len(table) > max_keys:
                        evict(out)
                elif unkeyed:
                    entry = table.get(None) or new_entry(None, None, out)
                    entry[0] = add_all(entry[0], batch.values if same else [wv.value for wv in batch])
                elif same or default:
                    if same:
                        kvs = batch.values
                        windows = _KEY_ALONE if default else batch.template.windows
                        timestamp = batch.template.timestamp if combiner is not None else None
                    else:
                        kvs, windows, timestamp = [wv.value for wv in batch], _KEY_ALONE, None
                    if batches_seen % _REGROUP_EVERY == 0:
                        grouping = True
                    batches_seen += 1
                    # Grouping pays only where keys repeat within a batch:
                    # tried again now and then.
                    if grouping:
                        grouping = add_grouped(kvs, windows, timestamp, out) * _FEW_KEYS <= len(kvs)
                    else:
                        add_each(kvs, windows, timestamp, out)
                else:
                    add_windowed(batch, out)
                if probing:
                    taken += len(batch.values) if same else len(batch)
                    if taken >= probe_rows:
                        probing = False
                        passing = len(table) > _HELD_SHARE * taken
                        if passing:
                            out.extend(emit(wkey, entry) for wkey, entry in table.items())
                            table.clear()
            except Exception as exc:  # noqa: BLE001 - re-raised naming the step
                raise _failed(combine.name) from exc
            if out:
                yield Same(global_wv, out) if default else out
        tracker.enter(state)
        try:
            out = sessions.flush() if sessions is not None else [emit(wkey, entry) for wkey, entry in table.items()]
        except Exception as exc:  # noqa: BLE001 - re-raised naming the step
            raise _failed(combine.name) from exc
        table.clear()
        window_of.clear()
        if out:
            yield Same(global_wv, out) if default else out
    finally:
        combine_fn.teardown()


def _shuffled(chain: DirectChain, last: str, batches: Iterator[list],
              key_of: Callable[[Any], Any] | None = None) -> Iterator[tuple[int, bytes]]:
    """``(target partition, blob)`` pairs of the chain's output, as the bundle
    processor's would be packed; a trivial grouping's values are gathered by
    key first (:class:`KeyedValues`). ``last``: the step whose output it is.
    ``key_of``: the output is a ``GroupBy``'s elements, not yet paired with
    their keys (see :meth:`_ChainRun.line`)."""
    shuffle = chain.shuffle
    trivial = shuffle.trivial
    if trivial:
        buckets = KeyedValues(chain.partitions, blocks=shuffle.blocks)
    elif shuffle.by_window:
        buckets = WindowedKeyedValues(shuffle, chain.partitions)
    else:
        buckets = Buckets(chain.partitions)
    encoders = shuffle.value_encoders() if trivial else None
    for batch in batches:
        if type(batch) is Marker:  # a bundle's end stops here
            if batch is PAUSE:
                yield batch
            continue
        try:
            if shuffle.by_window:
                yield from buckets.add(batch)
            elif encoders is None:
                yield from buckets.add(shuffle.pairs(windowed(batch)))
            else:
                values = batch.values if type(batch) is Same else [wv.value for wv in windowed(batch)]
                yield from buckets.add_batch(values, key_of, *encoders)
        except Exception as exc:  # noqa: BLE001 - an output the GroupByKey's coder refuses
            raise _failed(last) from exc
    try:
        yield from buckets.flush()
    except Exception as exc:  # noqa: BLE001 - rows held as their fields meet their coder here
        raise _failed(last) from exc


def _encoded(coder: Any, batches: Iterator[Same | list]) -> Iterator[bytes]:
    """The elements of ``batches`` encoded with ``coder``, in chunks of about 4 MiB
    (as the executor encodes a buffer: see ``_encode_partition``)."""
    from apache_beam.coders.coder_impl import create_OutputStream

    encode = coder.get_impl().encode_to_stream
    out = create_OutputStream()
    for batch in batches:
        if type(batch) is Marker:  # a bundle's end stops here
            if batch is PAUSE:
                yield batch
            continue
        for wv in windowed(batch):
            encode(wv, out, True)
        if out.size() >= 4 << 20:
            yield out.get()
            out = create_OutputStream()
    if out.size():
        yield out.get()


class _WindowedView:
    """A side input read per window, as Beam's ``SideInputMap`` reads it: an
    element's window mapped by the side input's window mapping function, and
    the view function applied to the side input's elements in that window
    (none: the view of no elements, an ``AsSingleton``'s default or its error),
    each view made once, when first read."""

    def __init__(self, view_fn: Callable[[list], Any], mapping: Callable[[Any], Any], by_window: dict) -> None:
        self._view_fn, self._mapping, self._by_window = view_fn, mapping, by_window
        self._views: dict = {}

    def at(self, window: Any) -> Any:
        """The view an element in ``window`` reads."""
        try:
            return self._views[window]
        except KeyError:
            view = self._views[window] = self._view_fn(self._by_window.get(self._mapping(window), []))
            return view


def _multimap(view_fn: Callable[[Any], Any], pairs: list) -> Any:
    return view_fn(MultiMap(pairs))


def _views(step: DirectStep, side_inputs: Sequence[Sequence[bytes]]) -> list:
    """The step's side-input values: each the view of all its elements (the
    global window), or a :class:`_WindowedView` where it is read per window."""
    from apache_beam.coders.coder_impl import create_InputStream
    from apache_beam.internal import pickler

    views = []
    for side in step.side_inputs:
        decode = side.coder.get_impl().decode_from_stream
        values: list = []
        by_window: dict = {}
        for chunk in side_inputs[side.index]:
            stream = create_InputStream(chunk)
            while stream.size() > 0:
                wv = decode(stream, True)
                if side.mapping is None:
                    values.append(wv.value)
                    continue
                for window in wv.windows:
                    by_window.setdefault(window, []).append(wv.value)
        view_fn = pickler.loads(side.view_fn)
        if side.multimap:
            view_fn = functools.partial(_multimap, view_fn)
        views.append(view_fn(values) if side.mapping is None
                     else _WindowedView(view_fn, pickler.loads(side.mapping), by_window))
    return views


def run_direct_chain(chain: DirectChain, setup: WorkerSetup | None, batches: Iterator[Same | list],
                     report: list, side_inputs: Sequence[Sequence[bytes]] = (),
                     batches_out: bool = False, indexed: bool = False) -> Iterator[Any]:
    """The chain's output for ``batches`` of its input (lists of
    ``WindowedValue``, or :class:`Same`): elements, batches of them if
    ``batches_out``, or ``(target partition, blob)`` pairs if it feeds a
    GroupByKey. A chain that forks yields what each of its ends does, with
    encoded chunks in place of elements; with ``indexed`` any chain does,
    each item as ``(output index, item)``. ``side_inputs``: the encoded
    chunks of the stage's side inputs, by index. Appends the task's
    serialized monitoring infos (user metrics per step) to ``report`` at the
    end."""
    from apache_beam.runners.worker import statesampler

    if setup is not None:
        setup.apply()  # before the DoFns are unpickled
    run = _ChainRun(side_inputs, batches_out, indexed)
    previous = statesampler.get_current_tracker()
    try:
        batches = run.line(chain, batches, root=True)
        if chain.branches or indexed:
            yield from run.ended(chain, batches, "")
        elif chain.shuffle is not None:
            yield from _shuffled(chain, _last_step(chain, ""), batches, run.pair_keys.get(id(chain)))
        elif batches_out:
            for batch in batches:
                if type(batch) is not Marker:
                    yield batch
        else:
            for batch in batches:
                if type(batch) is not Marker:
                    yield from windowed(batch)
        run.release()
    finally:
        statesampler.set_current_tracker(previous)
        run.discard()  # the task failed or was abandoned: Beam drops such instances
    report.append(run.report())


def _last_step(chain: DirectChain, before: str) -> str:
    """The name of the last step run on a chain's line; ``before``, the one before it, if it has none."""
    if chain.precombine is not None:
        return chain.precombine.name
    return chain.steps[-1].name if chain.steps else before


def _dropped(batches: Iterator[Any]) -> Iterator[Any]:
    """Runs a line nothing reads the output of; passes on its pauses."""
    for batch in batches:
        if batch is PAUSE:
            yield batch


def _indexed(index: int, items: Iterator[Any]) -> Iterator[Any]:
    for item in items:
        yield item if item is PAUSE else (index, item)


class _ChainRun:
    """One task's run of a chain: its steps' DoFn instances and metrics, line by line."""

    def __init__(self, side_inputs: Sequence[Sequence[bytes]], batches_out: bool, indexed: bool) -> None:
        self.side_inputs = side_inputs
        self.batches_out = batches_out
        self.indexed = indexed
        self.tracker = _Tracker()
        self.containers: list[tuple[str, Any]] = []
        self.acquired: list[tuple[bytes, tuple]] = []
        self.fresh: set[int] = set()
        self.pair_keys: dict[int, Callable[[Any], Any]] = {}  # by id of a chain: see line()

    def release(self) -> None:
        for payload, info in self.acquired:
            _dofn_pool.release(payload, info)
        self.acquired = []

    def discard(self) -> None:
        for _, info in self.acquired:
            _dofn_pool.discard(info)
        self.acquired = []

    def report(self) -> bytes:
        infos = [info for name, container in self.containers
                 for info in container.to_runner_api_monitoring_infos(name).values()]
        return beam_fn_api_pb2.ProcessBundleResponse(monitoring_infos=infos).SerializeToString()

    def forked(self, chain: DirectChain, batches: Iterator[Any], before: str) -> Iterator[Any]:
        """The outputs of the ends of a chain's branches, run on its line's ``batches``."""
        last = _last_step(chain, before)

        def branch(chain: DirectChain) -> Callable[[Iterator[Any]], Iterator[Any]]:
            return lambda inbox: self.ended(chain, self.line(chain, inbox), last)

        tagged = bool(chain.steps) and getattr(chain.steps[-1], "tagged", False)
        return fork(batches, [(b.tag, branch(b.chain)) for b in chain.branches], tagged)

    def ended(self, chain: DirectChain, batches: Iterator[Any], before: str) -> Iterator[Any]:
        """What a branch's line yields at its end: handed batches, encoded
        chunks or shuffle pairs (with its output's index if ``indexed``)."""
        if chain.branches:
            return self.forked(chain, batches, before)
        if chain.output is None:
            return _dropped(batches)
        if self.batches_out:
            return (batch for batch in batches if batch is PAUSE or type(batch) is not Marker)
        if chain.shuffle is not None:
            out = _shuffled(chain, _last_step(chain, before), batches, self.pair_keys.get(id(chain)))
        else:
            out = _encoded(chain.output_coder, batches)
        return _indexed(chain.output, out) if self.indexed else out

    def _arguments(self, step: DirectStep, info: tuple) -> tuple[Any, Any, Any]:
        """The step's DoFn and its extra arguments, its side inputs' views in place."""
        from apache_beam.internal.util import insert_values_in_args

        from beam_ext.runner.worker._splittable import SizedRestrictions

        dofn, args, kwargs, _, _ = info
        if step.side_inputs:
            views = _views(step, self.side_inputs)
            if isinstance(dofn, SizedRestrictions):
                # A splittable DoFn's side inputs are among its own arguments, which its wrapper holds.
                dofn = dofn.with_arguments(*insert_values_in_args(dofn.args, dofn.kwargs, views))
            else:
                args, kwargs = insert_values_in_args(args, kwargs, views)
        return dofn, args, kwargs

    def _stateful(self, step: DirectStep, dofn: Any, args: Any, kwargs: Any, state: _State, needs_setup: bool,
                  input_coder: Any, groups: Iterator[Any]) -> Iterator[Any]:
        from beam_ext.runner.worker._stateful import run_stateful

        tracker = self.tracker
        if needs_setup:
            tracker.enter(state)
            try:
                dofn.setup()  # once per instance: the pool keeps it for later tasks
            except Exception as exc:  # noqa: BLE001 - re-raised naming the step
                raise _failed(step.name) from exc
        return run_stateful(step.name, dofn, tuple(args), dict(kwargs),
                            output_handler(step.name, step.window_fn, step.tagged), step.tagged,
                            input_coder, functools.partial(tracker.enter, state), _failed, groups)

    def line(self, chain: DirectChain, batches: Iterator[Any], root: bool = False) -> Iterator[Any]:
        """The batches out of a chain's steps (and partial combine), run on ``batches``."""
        from apache_beam.metrics.execution import MetricsContainer

        tracker, fresh = self.tracker, self.fresh
        steps = []
        for step in chain.steps:
            if isinstance(step, DirectCombinePhase):
                steps.append((step, None))
                continue
            info, new = _dofn_pool.acquire(step.payload)
            self.acquired.append((step.payload, info))
            if new:
                fresh.add(id(info))
            steps.append((step, info))
        # CombineGlobally's key-with-None step, folded into its partial combine
        # (the values need no key to be grouped by); it has no metrics of its own.
        unkeyed = bool(chain.precombine is not None and chain.precombine.windowing.is_default() and steps
                       and steps[-1][1] is not None and _map_fn(steps[-1][1][0]) is _key_with_none)
        if unkeyed:
            steps.pop()
        # GroupBy(...).aggregate_field(...)'s pairs, read by field name for a
        # partial combine of plain accumulators (see _schema_group_by).
        fields, fields_step = None, None
        if (chain.precombine is not None and not unkeyed and steps and steps[-1][1] is not None
                and not steps[-1][0].side_inputs):
            fn = _map_fn(steps[-1][1][0])
            fields = aggregated_fields(fn) if fn is not None else None
            if fields is not None and _takes_fields(chain.precombine, fields):
                fields_step = steps[-1][0]
            else:
                fields = None
        # A WindowInto just before the combine (or its fields' step), into
        # sessions it merges or fixed or sliding windows: folded in (see
        # _precombine's ``folded``).
        at = len(steps) - (1 if fields is None else 2)
        folded = None
        if (chain.precombine is not None and at >= 0 and steps[at][1] is not None
                and type(steps[at][1][0]) is AssignWindows
                and steps[at][1][0].windowfn == chain.precombine.windowing.windowfn
                and (merges_partially(chain.precombine.windowing)
                     or keyed_assigner(chain.precombine.windowing.windowfn) is not None)):
            folded = steps.pop(at)[1][0].windowfn
        # A GroupBy's own Map right before a grouping that gathers each key's
        # values first: the shuffle's writer pairs the elements with their keys
        # as it takes them, without a step between (Beam's lambda has no metrics).
        if (chain.shuffle is not None and chain.shuffle.trivial and chain.precombine is None
                and not chain.branches and steps and steps[-1][1] is not None
                and not steps[-1][0].side_inputs and not steps[-1][0].bundles):
            fn = _wrapped_fn(steps[-1][1][0])
            key_of = grouped_key(fn) if fn is not None else None
            if key_of is not None:
                steps.pop()
                self.pair_keys[id(chain)] = key_of
        # A first step that only picks fields may take batches held as columns
        # (a branch's batches come from steps, never as columns).
        picks = root and steps and steps[0][1] is not None and _picks_fields(steps[0][0], steps[0][1])
        if root and not picks and not chain.keyed_memory:
            batches = as_batches(batches)
        # A merge's extract phase runs with it (see _run_phase's ``then``).
        extracts = {n + 1 for n in range(len(steps) - 1) if extracts_after(steps[n][0], steps[n + 1][0])}
        for n, (step, info) in enumerate(steps):
            if n in extracts:
                continue
            container = MetricsContainer(step.name)
            self.containers.append((step.name, container))
            if getattr(step, "stateful", False):  # first on its chain: ``batches`` are its input's groups by key
                dofn, args, kwargs = self._arguments(step, info)
                run = functools.partial(self._stateful, step, dofn, args, kwargs, _State(container))
                if step.bundles:
                    batches = _in_bundles(step.name, dofn, step.tagged, tracker, _State(container),
                                          id(info) in fresh, functools.partial(run, False, chain.input_coder),
                                          batches)
                else:
                    batches = run(id(info) in fresh, chain.input_coder, batches)
            elif n == 0 and picks:
                batches = _run_picking(step, info[0], tracker, _State(container), batches,
                                       needs_setup=id(info) in fresh)
                if (len(steps) > 1 or chain.precombine is not None or chain.shuffle is not None or chain.branches
                        or not self.batches_out):
                    batches = as_batches(batches)
            elif info is None:
                then = None
                if n + 1 in extracts:
                    extract = MetricsContainer(steps[n + 1][0].name)
                    self.containers.append((steps[n + 1][0].name, extract))
                    then = (steps[n + 1][0], _State(extract))
                batches = _run_phase(step, tracker, _State(container), batches, then)
            elif step is fields_step:
                batches = _run_fields(step.name, fields, tracker, _State(container), batches)
            else:
                dofn, args, kwargs = self._arguments(step, info)
                if step.batched:
                    run = functools.partial(_run_batched, step.name, dofn, step.window_fn, tracker,
                                            _State(container))
                else:
                    run = functools.partial(_run_step, step.name, dofn, tuple(args), dict(kwargs), step.window_fn,
                                            tracker, _State(container), tagged=step.tagged)
                if step.bundles:
                    batches = _in_bundles(step.name, dofn, step.tagged, tracker, _State(container),
                                          id(info) in fresh, run, batches)
                else:
                    batches = run(batches, needs_setup=id(info) in fresh)
        if chain.precombine is not None:
            container = MetricsContainer(chain.precombine.name)
            self.containers.append((chain.precombine.name, container))
            batches = _precombine(chain.precombine, tracker, _State(container), batches, unkeyed=unkeyed,
                                  folded=folded, fields=fields)
        return batches
