"""Which fused stages the batch executor may run on element objects (:mod:`beam_ext.runner.worker._direct`).

A stage qualifies when, from its one data input to each of its data
outputs (or the pipeline's end), it is a line of:

- ParDos of a ``DoFn`` that takes only the element (and extra arguments):
  ``Map``, ``FlatMap``, ``Filter``, ``MapTuple``, Beam's own key-with-``None``
  step of ``CombineGlobally``, or a ``DoFn`` subclass (``setup`` and
  ``teardown`` run once per instance, kept between tasks; ``start_bundle``
  and ``finish_bundle`` per bundle of the stage's input); no state,
  timers, splitting, batches, bundle finalization, ``DoFn.*Param``
  arguments other than ``TimestampParam``, ``WindowParam``,
  ``PaneInfoParam`` and ``WindowedValueParam`` (``WindowInto`` takes the
  first two), or setup or bundle contexts;
- side inputs of such a step read as a whole (``AsDict``, ``AsList``,
  ``AsIter``, ``AsSingleton``): from the global window where the step's
  input is in the global window too, or in any windows that Beam's default
  mapping for a global side input maps to it; otherwise per window, each
  element's window mapped by the side input's mapping function (the step
  is then called once per window of an element, as Beam calls it);
- the steps of a lifted combine after its GroupByKey (merging a key's
  accumulators, extracting its output);
- a ``Flatten`` of this one line alone (what Beam's fusion puts before a
  ``Flatten``'s buffer where the coders differ), or of several lines of the
  stage (see ``write_flattens_to_their_grouping``): each line goes on
  through it with a copy of the steps after it;
- optionally, last, the partial combine Beam puts before a lifted
  ``CombinePerKey``'s shuffle.

A batch stage whose first step is a stateful ``DoFn`` (the stage Beam's
fusion roots at it, its input partitioned by key) qualifies too, with the
in-memory state backend, when that ``DoFn`` keeps ``ReadModifyWrite``,
``Bag``, ``Set`` or ``CombiningValue`` state, sets event-time or
processing-time timers, takes side inputs only read whole from the global
window and no parameters beyond its element's key, timestamp, window and
pane, its state and its timers, and its input's windows do not merge (see
:func:`stateful_dofn` and :mod:`beam_ext.runner.worker._stateful`). Its
``start_bundle`` and ``finish_bundle`` run per bundle of whole keys.

A ``DoFn`` that defines only ``process_batch`` (a batched ``DoFn``: numpy
arrays, pandas frames) runs on objects too, when it takes the batch alone,
no side inputs, and yields to one output, batches or (``yields_elements``,
as Beam's ``to_dataframe`` yields each frame) elements: its batches are made
as Beam's bundle processor makes them (see :mod:`beam_ext.runner.worker._batched`).

A batch stage whose first step processes a splittable ``DoFn``'s sized
restrictions (Beam's fusion roots a stage there; the runner spreads the
restrictions over the tasks) qualifies too, when that ``DoFn`` keeps no
watermark estimator, is bounded per element, takes no side inputs and no
parameters beyond its restriction tracker and its element's timestamp,
window and pane (see :func:`splittable_dofn` and
:mod:`beam_ext.runner.worker._splittable`).

A line may fork: after a step with tagged outputs (``Partition``, a
``ParDo(...).with_outputs(...)``, a dead-letter output), a branch per step
reading each output; after a ``PCollection`` read by several steps of the
stage, a branch per step (see :mod:`beam_ext.runner.worker._branches`).
Each branch is such a line in turn.

Everything else keeps Beam's bundle processor.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils import proto_utils

from beam_ext.errors import BeamExtError
from beam_ext.runner._shuffle import ShuffleWriter
from beam_ext.runner.worker._batched import ExplodedBatches
from beam_ext.runner.worker._branches import MAIN_TAG
from beam_ext.runner.worker._direct import (
    AssignWindows,
    DirectBranch,
    DirectChain,
    DirectCombine,
    DirectCombinePhase,
    DirectSideInput,
    DirectStep,
)
from beam_ext.runner.worker._splittable import sized_restrictions

_BUNDLE_METHODS = ("start_bundle", "finish_bundle")
_ACCESS_PATTERNS = (common_urns.side_inputs.ITERABLE.urn, common_urns.side_inputs.MULTIMAP.urn)
_PRECOMBINE = common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn
_ASSIGN_WINDOWS = common_urns.primitives.ASSIGN_WINDOWS.urn
_SDF_PROCESS = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
# Beam's combine phases after a grouping, by urn, as its bundle processor
# names them; "all" is an unlifted CombinePerKey's whole combine (a trigger
# Beam does not lift, or an output time a streaming lift would change).
_PHASES = {common_urns.combine_components.COMBINE_PER_KEY_MERGE_ACCUMULATORS.urn: "merge",
           common_urns.combine_components.COMBINE_PER_KEY_EXTRACT_OUTPUTS.urn: "extract",
           common_urns.combine_components.COMBINE_GROUPED_VALUES.urn: "all"}


@dataclasses.dataclass(frozen=True)
class DirectEnd:
    """One of a stage's data outputs: its index among the stage's outputs, its
    elements' coder, and how it is shuffled if it feeds a GroupByKey (the
    real coder, not the runner's bytes view: the chain encodes objects)."""

    index: int
    coder: Any
    shuffle: ShuffleWriter | None


def _dofn_info(payload: beam_runner_api_pb2.ParDoPayload) -> tuple[bytes, tuple | None]:
    """A ParDo's pickled DoFn info, and that info unpickled: ``(dofn, args,
    kwargs, side inputs, windowing)``, or None where it does not unpickle on
    the driver (it keeps Beam's path). A DoFn of another SDK's keeps it too."""
    from apache_beam.internal import pickler
    from apache_beam.transforms import core

    try:
        data = core.DoFnInfo.from_runner_api(payload.do_fn, None).serialized_dofn_data()
    except ValueError:
        raise _NotDirect from None  # a DoFn of another SDK's or an unknown stateless kind
    try:
        return data, pickler.loads(data)
    except Exception:  # noqa: BLE001 - unpicklable here: keep Beam's path
        return data, None


def sees_bundles(dofn: Any) -> bool:
    """Whether ``dofn`` defines ``start_bundle`` or ``finish_bundle``.

    Read from the instance, as Beam's ``DoFnSignature`` reads them: the
    wrapper of ``with_exception_handling`` hands the user's DoFn's methods
    on through its ``__getattribute__``, not through its class.
    """
    from apache_beam.transforms import core

    return any(getattr(getattr(dofn, m), "__func__", None) is not getattr(core.DoFn, m) for m in _BUNDLE_METHODS)


def simple_dofn(dofn: Any) -> str | None:
    """Why ``dofn`` is not a DoFn of the element alone, or None.

    ``start_bundle`` and ``finish_bundle`` are allowed: the chain runs them
    per bundle of the stage's input, cut as Beam's bundle processor cuts it.
    ``setup`` and ``teardown`` see only the instance.
    """
    from apache_beam.transforms import core, userstate

    signature, reason = _signature(dofn)
    if reason is not None:
        return reason
    given = (core.DoFn.ElementParam, core.DoFn.TimestampParam, core.DoFn.WindowParam, core.DoFn.PaneInfoParam,
             core.DoFn.WindowedValueParam, core.DoFn.SideInputParam)
    if any(isinstance(d, (userstate.StateSpec, userstate.TimerSpec))
           or (isinstance(d, core._DoFnParam) and not any(d == g for g in given))
           for d in signature.process_method.defaults):
        return "it takes DoFn parameters other than the element's timestamp, window and pane"
    if signature.is_stateful_dofn():
        return "it is stateful"
    return None


def _signature(dofn: Any, splittable: bool = False, batched: bool = False) -> tuple[Any, str | None]:
    """``dofn``'s ``DoFnSignature``, and why no stage on objects runs it (stateful or
    not; processing sized restrictions where ``splittable``; its batches where
    ``batched``), or None."""
    from apache_beam.runners.common import DoFnSignature
    from apache_beam.transforms import core

    if not isinstance(dofn, core.DoFn):
        return None, f"{type(dofn).__name__} is not a DoFn"
    signature = DoFnSignature(dofn)
    if any(True for _ in signature.get_setup_contexts()) or any(True for _ in signature.get_bundle_contexts()):
        return signature, "it takes setup or bundle contexts"
    if signature.is_splittable_dofn() != splittable:
        return signature, "it is splittable" if not splittable else "it is not splittable"
    if works_on_batches(dofn) != batched:
        return signature, "it works on batches" if not batched else "it works on elements"
    return signature, None


def works_on_batches(dofn: Any) -> bool:
    """Whether ``dofn`` defines ``process_batch``, yields batches, or has no ``process``."""
    return dofn._process_batch_defined or dofn._process_yields_batches or not dofn._process_defined


def batched_dofn(dofn: Any) -> str | None:
    """Why a ``dofn`` that works on batches does not run on element objects
    (:mod:`beam_ext.runner.worker._batched`), or None."""
    signature, reason = _signature(dofn, batched=True)
    if reason is not None:
        return reason
    if dofn._process_defined:
        # Beam hands such a DoFn elements or batches by what its neighbours make.
        return "it defines process as well as process_batch"
    # A process_batch yielding elements (as Beam's to_dataframe does) needs no output converter.
    if getattr(dofn, "input_batch_converter", None) is None or (
            getattr(dofn, "output_batch_converter", None) is None and not dofn._process_batch_yields_elements):
        return "it has no batch converters"
    method = signature.process_batch_method
    if len(method.args) != 1 or method.defaults:
        return "its process_batch takes more than the batch"
    if signature.is_stateful_dofn():
        return "it is stateful"
    return None


def splittable_dofn(dofn: Any) -> str | None:
    """Why the sized restrictions of a splittable ``dofn`` are not processed on
    element objects in a batch stage (:mod:`beam_ext.runner.worker._splittable`), or None."""
    from apache_beam.runners.sdf_utils import NoOpWatermarkEstimatorProvider
    from apache_beam.transforms import core

    signature, reason = _signature(dofn, splittable=True)
    if reason is not None:
        return reason
    if signature.is_unbounded_per_element():
        return "it is unbounded per element"
    method = signature.process_method
    # The runner asks no watermark of a batch restriction; a DoFn that keeps
    # one (its own estimator or the parameter) keeps Beam's path.
    if (any(isinstance(d, core.DoFn.WatermarkEstimatorParam) for d in method.defaults)
            or type(signature.get_watermark_estimator_provider()) is not NoOpWatermarkEstimatorProvider):
        return "it keeps a watermark estimator"
    if signature.is_stateful_dofn():
        return "it is stateful"
    given = (core.DoFn.ElementParam, core.DoFn.TimestampParam, core.DoFn.WindowParam, core.DoFn.PaneInfoParam,
             core.DoFn.WindowedValueParam)
    if any(isinstance(d, core._DoFnParam) and not isinstance(d, core._RestrictionDoFnParam)
           and not any(d == g for g in given) for d in method.defaults):
        return "it takes DoFn parameters other than its restriction and the element's timestamp, window and pane"
    return None


def stateful_dofn(dofn: Any, windowing: Any) -> str | None:
    """Why a stateful ``dofn`` reading elements windowed by ``windowing`` does not run on
    element objects (:mod:`beam_ext.runner.worker._stateful`), or None."""
    from apache_beam.transforms import core, userstate

    signature, reason = _signature(dofn)
    if reason is not None:
        return reason
    if windowing.windowfn.is_merging():
        return "its input's windows merge"
    given = (core.DoFn.ElementParam, core.DoFn.KeyParam, core.DoFn.TimestampParam, core.DoFn.WindowParam,
             core.DoFn.PaneInfoParam, core.DoFn.WindowedValueParam)
    if any(isinstance(d, core._DoFnParam) and not any(d == g for g in given)
           and not isinstance(d, (core.DoFn.StateParam, core.DoFn.TimerParam))
           for d in signature.process_method.defaults):
        return ("its process takes DoFn parameters other than the element's key, timestamp, window and pane, "
                "its state and its timers")
    state_specs, timer_specs = userstate.get_dofn_specs(dofn)
    held = (userstate.ReadModifyWriteStateSpec, userstate.BagStateSpec, userstate.SetStateSpec,
            userstate.CombiningValueStateSpec)
    if not all(type(spec) in held for spec in state_specs):
        return "it keeps a kind of state other than ReadModifyWrite, Bag, Set and CombiningValue"
    domains = (userstate.TimeDomain.WATERMARK, userstate.TimeDomain.REAL_TIME)
    if any(spec.time_domain not in domains for spec in timer_specs):
        return "it sets timers in a time domain other than event time and processing time"
    for wrapper in signature.timer_methods.values():
        # Beam calls a callback with keywords alone; WindowedValueParam gets the window there.
        if (len(wrapper.args) != len(wrapper.defaults) or any(
                isinstance(d, core._DoFnParam) and d == core.DoFn.WindowedValueParam for d in wrapper.defaults)):
            return f"its callback {wrapper.method_value.__name__} takes arguments Beam does not fill"
    return None


def direct_chain(transforms: Iterable[beam_runner_api_pb2.PTransform], *, input_coder: Any,
                 ends: Mapping[str, DirectEnd], windowing_of: Callable[[str], Any],
                 side_input: Callable[[str, str, str], tuple[int, Any] | None],
                 combine_fn: Callable[[beam_runner_api_pb2.CombinePayload], bytes],
                 partitions: int, keyed_memory: int = 0) -> DirectChain | None:
    """The stage's steps as a :class:`DirectChain`, or None if they are not one.

    ``ends``: where each of the stage's data outputs (by transform id) goes,
    its output index, coder and shuffle. ``windowing_of(pcollection id)``:
    its windowing strategy. ``side_input(transform name, tag, pcollection
    id)``: the side input's index among the stage's and its elements'
    coder, or None where it cannot be read whole. ``combine_fn(payload)``: a
    precombine's pickled ``(CombineFn, args, kwargs)``. ``partitions``: of
    the shuffles the stage writes. ``keyed_memory``: the stage is a stateful
    ``DoFn``'s (its first step), its input grouped by key within this many
    bytes; 0 for a stage without state.
    """
    transforms = list(transforms)
    consumers: dict[str, list[beam_runner_api_pb2.PTransform]] = {}
    start = None
    for transform in transforms:
        urn = transform.spec.urn
        if urn == bundle_processor.DATA_INPUT_URN:
            if start is not None:
                return None
            start = transform
            continue
        if urn == common_urns.primitives.FLATTEN.urn:
            # Each line into it goes on through it (a copy of what follows per line).
            main = list(transform.inputs.values())
        elif (urn not in (bundle_processor.DATA_OUTPUT_URN, common_urns.primitives.PAR_DO.urn, _ASSIGN_WINDOWS,
                          _PRECOMBINE, _SDF_PROCESS) and urn not in _PHASES):
            return None
        else:
            main = [pcoll for tag, pcoll in transform.inputs.items() if not _is_side_tag(transform, tag)]
            if len(main) != 1:
                return None
        for pcoll in main:
            consumers.setdefault(pcoll, []).append(transform)
    if start is None or len(start.outputs) != 1:
        return None
    builder = _LineBuilder(consumers, ends, windowing_of, side_input, combine_fn, partitions, bool(keyed_memory))
    [pcoll] = start.outputs.values()
    try:
        chain = builder.line(pcoll)
    except _NotDirect:
        return None
    # Every transform once on a line (none in a cycle or left over), some work
    # to do: a step, elements to re-encode (Beam's fusion makes a stage of a
    # one-input Flatten, "Flatten/Transcode", where an input's coder differs
    # from the Flatten's), or to write to a GroupByKey's shuffle (a Flatten's
    # buffer read back for its grouping, in streaming).
    if len(builder.visited) + 1 != len(transforms) or not (
            builder.works or _transcodes(chain, input_coder) or _shuffles_as_read(chain)):
        return None
    if keyed_memory:
        # The stateful step takes the input's groups: it must be the first step of the root line.
        if not chain.steps or not getattr(chain.steps[0], "stateful", False):
            return None
        return dataclasses.replace(chain, input_coder=input_coder, keyed_memory=keyed_memory)
    return dataclasses.replace(chain, input_coder=input_coder)


def _transcodes(chain: DirectChain, input_coder: Any) -> bool:
    """Whether a chain of no steps writes its input with another coder to a buffer a step reads."""
    return (not chain.steps and not chain.branches and chain.precombine is None and chain.shuffle is None
            and chain.output_coder is not None and chain.output_coder != input_coder)


def _shuffles_as_read(chain: DirectChain) -> bool:
    """Whether a chain of no steps writes its input to a GroupByKey's shuffle."""
    return not chain.steps and not chain.branches and chain.precombine is None and chain.shuffle is not None


def _explodes_batches(dofn: Any) -> bool:
    """Whether ``dofn``'s ``process`` takes the element alone and yields batches
    (``@beam.DoFn.yields_batches``) that its output batch converter explodes."""

    if (not dofn._process_defined or dofn._process_batch_defined or not dofn._process_yields_batches
            or getattr(dofn, "output_batch_converter", None) is None or sees_bundles(dofn)):
        return False
    signature, reason = _signature(dofn, batched=True)
    method = signature.process_method if reason is None else None
    return (method is not None and len(method.args) == 1 and not method.defaults
            and not signature.is_stateful_dofn())


class _NotDirect(BeamExtError):
    """A step the chain cannot run on element objects."""


class _LineBuilder:
    """Walks a stage's steps from its input to its outputs (see :func:`direct_chain`)."""

    def __init__(self, consumers: dict, ends: Mapping[str, DirectEnd], windowing_of: Callable,
                 side_input: Callable, combine_fn: Callable, partitions: int, keyed: bool = False) -> None:
        self.consumers = consumers
        self.ends = ends
        self.windowing_of = windowing_of
        self.side_input = side_input
        self.combine_fn = combine_fn
        self.partitions = partitions
        self.visited: set[str] = set()  # reached again past a Flatten of several lines
        self.works = False  # a step runs somewhere: else the stage only moves a buffer
        self.keyed = keyed  # the first step may keep state (see direct_chain's keyed_memory)

    def line(self, pcoll: str, first: beam_runner_api_pb2.PTransform | None = None) -> DirectChain:
        """The line of steps reading ``pcoll`` (from ``first`` on, one of its
        consumers), to where it ends or forks."""
        steps: list[DirectStep | DirectCombinePhase] = []
        precombine = None
        while True:
            found = [first] if first is not None else self.consumers.get(pcoll, [])
            first = None
            if len(found) > 1:  # the PCollection is read by several steps: each a branch of its own
                if precombine is not None:
                    raise _NotDirect
                branches = tuple(DirectBranch(MAIN_TAG, self.line(pcoll, c)) for c in found)
                return self._chain(steps, precombine, None, branches)
            if not found:  # no step reads it: the line's outputs are dropped, as Beam drops them
                if precombine is not None:
                    raise _NotDirect
                return self._chain(steps, None, None)
            [transform] = found
            self.visited.add(transform.unique_name)
            urn = transform.spec.urn
            if urn == bundle_processor.DATA_OUTPUT_URN:
                end = self.ends[transform.unique_name]
                if precombine is not None and end.shuffle is None:
                    raise _NotDirect
                return self._chain(steps, precombine, end)
            if precombine is not None:
                raise _NotDirect
            if urn == common_urns.primitives.FLATTEN.urn:
                # The elements as they are. One input: Beam's fusion puts one
                # before a Flatten's buffer where the coders differ (the output
                # is encoded with the buffer's coder). Several: the lines a
                # stage writes a grouping's shuffle from (see
                # write_flattens_to_their_grouping), each running its own copy
                # of the steps after it, which see one element at a time.
                [pcoll] = transform.outputs.values()
                continue
            windowing = self.windowing_of(pcoll)
            if urn == _PRECOMBINE:
                payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.CombinePayload)
                precombine = DirectCombine(transform.unique_name, self.combine_fn(payload), windowing)
                self.works = True
                [pcoll] = transform.outputs.values()
                continue
            if len(transform.outputs) != 1 and urn not in (common_urns.primitives.PAR_DO.urn, _SDF_PROCESS):
                raise _NotDirect
            steps.append(self._step(transform, urn, windowing))
            self.works = True
            if len(transform.outputs) > 1:
                # Tagged outputs: a branch per step reading each.
                branches = tuple(DirectBranch(tag, self.line(out, c)) for tag, out in transform.outputs.items()
                                 for c in self.consumers.get(out, []))
                return self._chain(steps, None, None, branches)
            [pcoll] = transform.outputs.values()

    def _chain(self, steps: list, precombine: DirectCombine | None, end: DirectEnd | None,
               branches: tuple[DirectBranch, ...] = ()) -> DirectChain:
        if end is None:
            return DirectChain(tuple(steps), None, None, precombine=precombine, branches=branches, output=None)
        return DirectChain(tuple(steps), None, end.coder, precombine=precombine, shuffle=end.shuffle,
                           partitions=self.partitions, output=end.index)

    def _step(self, transform: beam_runner_api_pb2.PTransform, urn: str,
              windowing: Any) -> DirectStep | DirectCombinePhase:
        from apache_beam.internal import pickler

        if urn in _PHASES:
            payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.CombinePayload)
            return DirectCombinePhase(transform.unique_name, self.combine_fn(payload), _PHASES[urn])
        if urn == _ASSIGN_WINDOWS:
            # A WindowInto: its windows are its output's windowing strategy's.
            [out] = transform.outputs.values()
            assign = pickler.dumps((AssignWindows(self.windowing_of(out).windowfn), (), {}, None, None))
            return DirectStep(transform.unique_name, assign, windowing.windowfn)
        payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
        if urn == _SDF_PROCESS:
            return self._splittable_step(transform, payload, windowing)
        stateful = bool(payload.state_specs or payload.timer_family_specs)
        # Only a keyed stage's first step may keep state: it alone gets its input grouped by key.
        if ((stateful and (not self.keyed or self.works)) or payload.restriction_coder_id
                or payload.requests_finalization):
            raise _NotDirect
        dofn_data, info = _dofn_info(payload)
        dofn = None if info is None else info[0]
        batched = dofn is not None and not stateful and works_on_batches(dofn)
        if batched:
            _, args, kwargs, side_inputs, fn_windowing = info
            if (args or kwargs or payload.side_inputs or len(transform.outputs) != 1):
                raise _NotDirect
            if _explodes_batches(dofn):
                # An element in, batches out: the batches exploded into elements in the step.
                wrapped = pickler.dumps((ExplodedBatches(dofn), (), {}, side_inputs, fn_windowing))
                return DirectStep(transform.unique_name, wrapped, windowing.windowfn)
            # Batches of the element alone, on a line (a batched DoFn with tagged outputs keeps Beam's path).
            if batched_dofn(dofn) is not None:
                raise _NotDirect
            # Its batches close at bundle ends too, as Beam's consumer set flushes them.
            return DirectStep(transform.unique_name, dofn_data, windowing.windowfn, bundles=True, batched=True)
        if dofn is None or (stateful_dofn(dofn, windowing) if stateful else simple_dofn(dofn)) is not None:
            raise _NotDirect
        return DirectStep(transform.unique_name, dofn_data, windowing.windowfn,
                          self._side_inputs(transform, payload, windowing, stateful),
                          tagged=len(transform.outputs) > 1, bundles=sees_bundles(dofn), stateful=stateful)

    def _side_inputs(self, transform: beam_runner_api_pb2.PTransform, payload: beam_runner_api_pb2.ParDoPayload,
                     windowing: Any, stateful: bool) -> tuple[DirectSideInput, ...]:
        """The step's side inputs, each read whole or per window."""
        from apache_beam.transforms import sideinputs

        views = []
        windowed = not isinstance(windowing.windowfn, GlobalWindows)
        for tag in sorted(payload.side_inputs, key=sideinputs.get_sideinput_index):
            proto = payload.side_inputs[tag]
            found = self.side_input(transform.unique_name, tag, transform.inputs[tag])
            if (found is None or proto.access_pattern.urn not in _ACCESS_PATTERNS
                    or proto.window_mapping_fn.urn != python_urns.PICKLED_WINDOW_MAPPING_FN):
                raise _NotDirect
            index, coder = found
            # A side input in the global window, read through Beam's default
            # mapping from any window to the global one, is the same whole view
            # for every element, whatever the element's windows. Any other is
            # read per window, through its mapping; not by a stateful step.
            whole = isinstance(self.windowing_of(transform.inputs[tag]).windowfn, GlobalWindows) and (
                not windowed or _maps_to_global(proto.window_mapping_fn))
            if not whole and stateful:
                raise _NotDirect
            views.append(DirectSideInput(index, proto.view_fn.payload, coder,
                                         None if whole else proto.window_mapping_fn.payload,
                                         proto.access_pattern.urn == common_urns.side_inputs.MULTIMAP.urn))
        return tuple(views)

    def _splittable_step(self, transform: beam_runner_api_pb2.PTransform,
                         payload: beam_runner_api_pb2.ParDoPayload, windowing: Any) -> DirectStep:
        """A splittable DoFn's processing of sized restrictions, first on its
        stage (Beam's fusion roots it there), as a step of the wrapper
        :class:`~beam_ext.runner.worker._splittable.SizedRestrictions`."""
        from apache_beam.internal import pickler

        if self.works or payload.requests_finalization:
            raise _NotDirect
        _, info = _dofn_info(payload)
        if info is None:
            raise _NotDirect
        dofn, args, kwargs, side_inputs, fn_windowing = info
        if splittable_dofn(dofn) is not None:
            raise _NotDirect
        # Side inputs read whole: their views fill the DoFn's own arguments (SizedRestrictions.with_arguments).
        views = self._side_inputs(transform, payload, windowing, stateful=False)
        if any(view.mapping is not None for view in views):
            raise _NotDirect
        wrapped = pickler.dumps((sized_restrictions(dofn, args, kwargs), (), {}, side_inputs, fn_windowing))
        return DirectStep(transform.unique_name, wrapped, windowing.windowfn, views,
                          tagged=len(transform.outputs) > 1, bundles=sees_bundles(dofn))


def _maps_to_global(mapping: beam_runner_api_pb2.FunctionSpec) -> bool:
    """Whether a side input's window mapping is Beam's default for a global
    side input: every window to the global one."""
    from apache_beam.internal import pickler
    from apache_beam.transforms import sideinputs

    try:
        return pickler.loads(mapping.payload) is sideinputs._global_window_mapping_fn
    except Exception:  # noqa: BLE001 - a mapping that does not unpickle here keeps Beam's path
        return False


def _is_side_tag(transform: beam_runner_api_pb2.PTransform, tag: str) -> bool:
    if transform.spec.urn not in (common_urns.primitives.PAR_DO.urn, _SDF_PROCESS):
        return False
    payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
    return tag in payload.side_inputs
