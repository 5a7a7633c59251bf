"""A stateful ``DoFn`` run on element objects, a key at a time, without Beam's bundle processor.

In Beam's bundle processor every state access of a stateful ``DoFn`` goes
through a runtime state object, a state cache and the state API, and every
``timer.set`` is encoded onto the data channel, decoded by the runner and
sent back when it fires: for a ``DoFn`` keeping a count per key that is
several times the ``DoFn``'s own work. In a batch stage the whole input is
there before any timer fires (the watermark goes from its minimum to its
maximum after the last element), so a task can instead take its input
grouped by key (the encoded key, as Beam's state is keyed; within the
grouping's memory budget, spilling sorted runs beyond it) and, for each key:

- call ``process`` for each element, once per window it is in, as Beam's
  ``PerWindowInvoker`` does, with its state and timers for that key and
  window held here as plain Python objects;
- then fire the key's timers as the runner's bundle processor path fires
  them at the end of input: all that are set, a timer family after another
  (in the order of the stage's timer families), each family's earliest
  first; the timers their callbacks set fire in a next round, until none is
  left;
- then drop the key's state: only one key's state is held at a time.

A ``DoFn`` with ``start_bundle`` or ``finish_bundle`` gets bundles of
whole keys (``keyed_groups``' ``bundle_bytes``), run by the chain's
``_in_bundles`` as a stateless step's are.

What Beam's runtime objects do, the ones here do too:

- ``ReadModifyWriteState.read`` gives the last value written or None; a
  bag's ``read`` the values added since it was last cleared, in order; a
  set's the distinct ones; a ``CombiningValueState``'s the combine's output
  of one accumulator (``merge_accumulators`` of it, or of none when nothing
  was added, then ``extract_output``), as Beam reads it;
- values are held as the objects given, as Beam's runtime state holds them
  until its bundle commits (a later bundle would read a decoded copy: a
  ``DoFn`` cannot count on either);
- a timer fires at its time truncated to milliseconds, as Beam's timer
  coder carries it; set again, it replaces the one set before for its key,
  window and dynamic tag; ``clear`` removes it. (The output timestamp Beam's
  ``OutputTimer`` gives a timer holds a streaming watermark; a batch stage
  has none to hold.)
- a callback's outputs get the timer's firing time and window, as Beam's
  ``invoke_user_timer`` gives them; its parameters are those Beam's
  ``invoke_timer_callback`` fills.

Which ``DoFn``s run here: :func:`beam_ext.runner.planning._direct_chain.stateful_dofn`.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Iterable, Iterator

from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.transforms import core, userstate
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_ext.runner._element_batches import BATCH, BUNDLE_END, Marker, as_batch
from beam_ext.runner._group_spill import ExternalGrouping, SpillStats
from beam_ext.runner._shuffle import unpack
from beam_ext.runner._window_keys import window_key
from beam_ext.runner.worker._direct import check_result

_EMPTY = object()


class _ValueState(userstate.ReadModifyWriteRuntimeState):
    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = _EMPTY

    def read(self) -> Any:
        value = self._value
        return None if value is _EMPTY else value

    def write(self, value: Any) -> None:
        self._value = value

    def clear(self) -> None:
        self._value = _EMPTY

    def commit(self) -> None:
        pass


class _BagState(userstate.BagRuntimeState):
    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: list = []

    def read(self) -> Iterable[Any]:
        return list(self._values)

    def add(self, value: Any) -> None:
        self._values.append(value)

    def clear(self) -> None:
        self._values = []

    def commit(self) -> None:
        pass


class _SetState(userstate.SetRuntimeState):
    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: set = set()

    def read(self) -> set:
        return set(self._values)

    def add(self, value: Any) -> None:
        self._values.add(value)

    def clear(self) -> None:
        self._values = set()

    def commit(self) -> None:
        pass


class _CombiningState(userstate.CombiningValueRuntimeState):
    __slots__ = ("_fn", "_accumulator")

    def __init__(self, combine_fn: core.CombineFn) -> None:
        self._fn = combine_fn
        self._accumulator = _EMPTY

    def read(self) -> Any:
        fn = self._fn
        held = self._accumulator
        # As Beam reads it: the held accumulators merged (none: an empty
        # list), the merge kept in their place.
        merged = fn.merge_accumulators([] if held is _EMPTY else [held])
        self._accumulator = merged
        return fn.extract_output(merged)

    def add(self, value: Any) -> None:
        held = self._accumulator
        self._accumulator = self._fn.add_input(self._fn.create_accumulator() if held is _EMPTY else held, value)

    def clear(self) -> None:
        self._accumulator = _EMPTY

    def commit(self) -> None:
        pass


@dataclasses.dataclass
class _Timer:
    """A set timer: its family (its callback's), firing time, pane, and the key and window it was set for."""

    family: str
    fire: Timestamp
    pane: Any
    key: Any
    window: Any


class _RuntimeTimer(userstate.BaseTimer):
    """What ``DoFn.TimerParam`` gives: sets and clears the key's timers of one family and window."""

    __slots__ = ("_timers", "_family", "_key", "_window", "_window_key", "_pane", "_set_to", "_fire")

    def __init__(self, timers: dict, family: str, key: Any, window: Any, pane: Any) -> None:
        self._timers = timers
        self._family = family
        self._key = key
        self._window = window
        # Pending timers are keyed by the window's bounds: hashing Beam's
        # IntervalWindow reads Python properties of the timestamp range.
        self._window_key = window_key(window)
        self._pane = pane
        self._set_to = self._fire = None

    def set(self, timestamp: Any, dynamic_timer_tag: str = "") -> None:
        # A DoFn setting its timer per element most often passes one time
        # (its window's end): Beam's Timestamp arithmetic, in Python, is done
        # once for it, and an equal time gives the same firing time.
        if self._set_to is None or not (timestamp is self._set_to or timestamp == self._set_to):
            # Beam's timer coder keeps milliseconds: a timer fires at its time
            # so truncated, as it does through the bundle processor.
            self._fire = Timestamp(micros=Timestamp.of(timestamp).micros // 1000 * 1000)
            self._set_to = timestamp
        fire = self._fire
        ident = (self._family, dynamic_timer_tag, self._window_key)
        held = self._timers.get(ident)
        # Set again, a timer keeps its place among the pending ones (a dict's
        # order), as the runner's table of decoded timers keeps it; set again
        # to what it holds, it changes nothing.
        if held is None or held.fire is not fire or held.pane is not self._pane or held.key is not self._key:
            self._timers[ident] = _Timer(self._family, fire, self._pane, self._key, self._window)

    def clear(self, dynamic_timer_tag: str = "") -> None:
        self._timers.pop((self._family, dynamic_timer_tag, self._window_key), None)


class _KeyState:
    """One key's state cells, by window and state name, and its pending timers."""

    __slots__ = ("cells", "timers", "_new")

    def __init__(self, new: dict[str, Callable[[], Any]]) -> None:
        self.cells: dict[tuple[Any, str], Any] = {}
        self.timers: dict[tuple[str, str, Any], _Timer] = {}
        self._new = new

    def state(self, name: str, window: Any) -> Any:
        cell = self.cells.get((window, name))
        if cell is None:
            cell = self.cells[(window, name)] = self._new[name]()
        return cell


def _state_factories(dofn: core.DoFn) -> tuple[dict[str, Callable[[], Any]], list[core.CombineFn]]:
    """A new state cell per state name, and the combine functions set up for them (to tear down)."""
    state_specs, _ = userstate.get_dofn_specs(dofn)
    new: dict[str, Callable[[], Any]] = {}
    combine_fns = []
    for spec in state_specs:
        if isinstance(spec, userstate.ReadModifyWriteStateSpec):
            new[spec.name] = _ValueState
        elif isinstance(spec, userstate.BagStateSpec):
            new[spec.name] = _BagState
        elif isinstance(spec, userstate.SetStateSpec):
            new[spec.name] = _SetState
        elif isinstance(spec, userstate.CombiningValueStateSpec):
            # Beam copies the spec's CombineFn and sets it up per state
            # object; one copy set up for the task's keys serves the same.
            fn = copy.deepcopy(spec.combine_fn)
            fn.setup()
            combine_fns.append(fn)
            new[spec.name] = lambda fn=fn: _CombiningState(fn)
        else:  # the planner admits no other kind
            raise ValueError(f"{type(dofn).__name__} keeps {type(spec).__name__}, which stages on objects do not hold")
    return new, combine_fns


def _argument_fillers(method: Any, args: tuple, kwargs: dict) -> tuple[list, dict, list]:
    """``process``'s bound arguments, keywords and ``(index, kind, spec)`` of the
    parameters filled per call, as Beam's ``PerWindowInvoker`` fills them."""
    from apache_beam.runners.common import _get_arg_placeholders

    placeholders, bound, keywords = _get_arg_placeholders(method, list(args), dict(kwargs))
    fill = []
    for i, p in placeholders:
        if p == core.DoFn.ElementParam:
            fill.append((i, "element", None))
        elif p == core.DoFn.KeyParam:
            fill.append((i, "key", None))
        elif p == core.DoFn.WindowParam:
            fill.append((i, "window", None))
        elif p == core.DoFn.WindowedValueParam:
            fill.append((i, "windowed", None))
        elif p == core.DoFn.TimestampParam:
            fill.append((i, "timestamp", None))
        elif p == core.DoFn.PaneInfoParam:
            fill.append((i, "pane", None))
        elif isinstance(p, core.DoFn.StateParam):
            fill.append((i, "state", p.state_spec.name))
        elif isinstance(p, core.DoFn.TimerParam):
            fill.append((i, "timer", p.timer_spec.name))
        else:  # the planner admits no other parameter
            raise ValueError(f"process takes {p}, which stages on objects do not give")
    return bound, keywords, fill


def _callback_arguments(wrapper: Any) -> list[tuple[str, str, Any]]:
    """``(keyword, kind, spec)`` of the parameters Beam's ``invoke_timer_callback``
    fills for a timer callback, as Beam's ``MethodWrapper`` finds them."""
    defaults = wrapper.defaults
    found = []
    for keyword, default in zip(wrapper.args[-len(defaults):], defaults) if defaults else ():
        if isinstance(default, core.DoFn.StateParam):
            found.append((keyword, "state", default.state_spec.name))
        elif isinstance(default, core.DoFn.TimerParam):
            found.append((keyword, "timer", default.timer_spec.name))
        elif core.DoFn.TimestampParam == default:
            found.append((keyword, "timestamp", None))
        elif core.DoFn.WindowParam == default:
            found.append((keyword, "window", None))
        elif core.DoFn.KeyParam == default:
            found.append((keyword, "key", None))
        elif core.DoFn.DynamicTimerTagParam == default:
            found.append((keyword, "tag", None))
    return found


def keyed_groups(memory_bytes: int, blobs: Iterable[bytes], stats: SpillStats | None = None,
                 bundle_bytes: int = 0) -> Iterator[tuple[bytes, list | bytes] | Marker]:
    """``(encoded key, pieces)`` of a keyed stage's shuffled ``(key, element)``
    blobs, every key once: ``pieces`` are the nested encodings of its
    elements, in a list or joined. Held within ``memory_bytes``, sorted runs
    spilled beyond it (counted in ``stats``).

    With ``bundle_bytes`` (a DoFn that sees bundles), a :data:`BUNDLE_END`
    before the key after the one whose elements bring a bundle to that many
    bytes: a bundle holds whole keys, as state and timers are a key's.
    """
    grouping = ExternalGrouping(memory_bytes, stats)
    size = 0
    try:
        grouping.add_all(unpack(blobs))
        for key, _, pieces in grouping.groups():
            if bundle_bytes and size >= bundle_bytes:
                yield BUNDLE_END
                size = 0
            yield key, pieces
            if bundle_bytes:
                size += len(pieces) if type(pieces) is bytes else sum(map(len, pieces))
    finally:
        grouping.close()


def run_stateful(name: str, dofn: core.DoFn, args: tuple, kwargs: dict, output: Callable[[Any, Any], Any],
                 tagged: bool, input_coder: Any, enter: Callable[[], None],
                 failed: Callable[[str], Exception], groups: Iterator[tuple[bytes, Any] | Marker]) -> Iterator[Any]:
    """The outputs of ``dofn``'s step over ``groups`` (see :func:`keyed_groups`),
    in batches: a key's elements, then its timers; a :data:`BUNDLE_END` of
    ``groups`` passed on after the outputs before it.

    ``output(wv, result)`` makes an output of a result that is not a plain
    value (see ``_direct.output_handler``); ``enter()`` puts the
    step's metrics in place before it runs user code; ``failed(name)`` the
    error naming the step, raised from the one being handled.
    """
    from apache_beam.pvalue import TaggedOutput
    from apache_beam.runners.common import DoFnSignature
    from apache_beam.transforms.window import TimestampedValue

    special = (WindowedValue, TimestampedValue, TaggedOutput)
    signature = DoFnSignature(dofn)
    method = signature.process_method
    process = method.method_value
    bound, keywords, fill = _argument_fillers(method, args, kwargs)
    new, combine_fns = _state_factories(dofn)
    callbacks = {spec.name: (wrapper.method_value, _callback_arguments(wrapper))
                 for spec, wrapper in signature.timer_methods.items()}
    families = sorted(callbacks)  # the stage's timer families, in the order the runner writes them
    decode = input_coder.get_impl().decode_from_stream
    out: list = []
    checked = False

    def emit(template: WindowedValue, results: Any) -> Iterator[Any]:
        """A timer callback's ``results``, in batches (``out`` filled as the element loop fills it)."""
        nonlocal out, checked
        if not checked:
            checked = True
            check_result(results)
        for result in results:
            out.append(output(template, result) if isinstance(result, special) else template.with_value(result))
            if len(out) >= BATCH:
                yield out if tagged else as_batch(out)
                out = []
                enter()

    # A key's state and its window are the same for all its elements in that
    # window: they are put in a window's arguments once, the rest per element.
    per_window = [(i, spec) for i, kind, spec in fill if kind == "state"]
    windowed_fill = [i for i, kind, _ in fill if kind == "window"]
    per_element = [(i, kind, spec) for i, kind, spec in fill if kind not in ("state", "window")]
    # Most often the element is all that changes from call to call.
    element_at = per_element[0][0] if [kind for _, kind, _ in per_element] == ["element"] else None

    def arguments_for(window: Any, held: _KeyState) -> list:
        arguments = list(bound)
        for i, spec in per_window:
            arguments[i] = held.state(spec, window)
        for i in windowed_fill:
            arguments[i] = window
        return arguments

    def fill_element(arguments: list, template: WindowedValue, key: Any, window: Any, held: _KeyState) -> None:
        for i, kind, spec in per_element:
            if kind == "element":
                arguments[i] = template.value
            elif kind == "timer":
                # One per family, window and pane of the key: the list is the window's.
                timer = arguments[i]
                if type(timer) is not _RuntimeTimer or timer._pane is not template.pane_info:
                    arguments[i] = _RuntimeTimer(held.timers, spec, key, window, template.pane_info)
            elif kind == "key":
                arguments[i] = key
            elif kind == "timestamp":
                arguments[i] = template.timestamp
            elif kind == "pane":
                arguments[i] = template.pane_info
            else:
                arguments[i] = template

    def fire(ident: tuple, timer: _Timer, held: _KeyState) -> Any:
        callback, parameters = callbacks[timer.family]
        tag, window = ident[1], timer.window
        arguments: dict[str, Any] = {}
        for keyword, kind, spec in parameters:
            if kind == "state":
                arguments[keyword] = held.state(spec, window)
            elif kind == "timer":
                arguments[keyword] = _RuntimeTimer(held.timers, spec, timer.key, window, timer.pane)
            elif kind == "timestamp":
                arguments[keyword] = timer.fire
            elif kind == "window":
                arguments[keyword] = window
            elif kind == "key":
                arguments[keyword] = timer.key
            else:
                arguments[keyword] = tag
        return callback(**arguments)

    try:
        for group in groups:
            if group is BUNDLE_END:
                if out:
                    yield out if tagged else as_batch(out)
                    out = []
                yield group
                continue
            pieces = group[1]
            enter()
            held = _KeyState(new)
            # A window's arguments, its state in place, by its bounds (see _RuntimeTimer).
            prepared: dict[Any, list] = {}
            last_window = last = None
            try:
                stream = create_InputStream(pieces if type(pieces) is bytes else b"".join(pieces))
                while stream.size() > 0:
                    wv = decode(stream, True)
                    try:
                        key, _ = wv.value
                    except (TypeError, ValueError):
                        raise ValueError("Input value to a stateful DoFn or KeyParam must be a KV tuple; "
                                         f"instead, got '{wv.value}'.") from None
                    windows = wv.windows
                    for window in windows:
                        template = wv if len(windows) == 1 else WindowedValue(
                            wv.value, wv.timestamp, (window,), wv.pane_info)
                        if window is not last_window:
                            bounds = window_key(window)
                            last = prepared.get(bounds)
                            if last is None:
                                last = prepared[bounds] = arguments_for(window, held)
                            last_window = window
                        # The list is reused: a call unpacks it into its own arguments.
                        if element_at is not None:
                            last[element_at] = template.value
                        else:
                            fill_element(last, template, key, window, held)
                        results = process(*last, **keywords)
                        if results is None:
                            continue
                        if not checked:
                            checked = True
                            check_result(results)
                        for result in results:
                            out.append(output(template, result) if isinstance(result, special)
                                       else template.with_value(result))
                            if len(out) >= BATCH:
                                yield out if tagged else as_batch(out)
                                out = []
                                enter()
                while held.timers:
                    # All pending timers are due at the end of input; those set
                    # while they fire wait for the next round.
                    due, held.timers = held.timers, {}
                    for family in families:
                        for ident, timer in sorted(((i, t) for i, t in due.items() if t.family == family),
                                                   key=lambda it: it[1].fire):
                            results = fire(ident, timer, held)
                            if results is not None:
                                yield from emit(WindowedValue(None, timer.fire, (timer.window,)), results)
            except Exception as exc:  # noqa: BLE001 - re-raised naming the step
                raise failed(name) from exc
        if out:
            yield out if tagged else as_batch(out)
    finally:
        for fn in combine_fns:
            fn.teardown()
