"""Which fused stages the batch executor may run on element objects (:mod:`beam_ext.runner.worker._direct`).

A stage qualifies when, between its one data input and its one data output
(or the pipeline's end), it is a line of:

- ParDos of a ``DoFn`` that takes only the element (and extra arguments):
  ``Map``, ``FlatMap``, ``Filter``, ``MapTuple``, Beam's own key-with-``None``
  step of ``CombineGlobally``, or a ``DoFn`` subclass that overrides
  neither ``start_bundle`` nor ``finish_bundle`` (``setup`` and
  ``teardown`` run once per instance, kept between tasks); no state,
  timers, splitting, batches, bundle finalization, ``DoFn.*Param``
  arguments other than ``TimestampParam``, ``WindowParam``,
  ``PaneInfoParam`` and ``WindowedValueParam`` (``WindowInto`` takes the
  first two), setup or bundle contexts, or tagged outputs;
- side inputs of such a step read as a whole (``AsDict``, ``AsList``,
  ``AsIter``, ``AsSingleton``), where both the step's input and the side
  input are in the global window;
- the steps of a lifted combine after its GroupByKey (merging a key's
  accumulators, extracting its output);
- a ``Flatten`` of this one line alone (what Beam's fusion puts before a
  ``Flatten``'s buffer where the coders differ);
- optionally, last, the partial combine Beam puts before a lifted
  ``CombinePerKey``'s shuffle.

Everything else keeps Beam's bundle processor.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms.window import GlobalWindows

from beam_ext.runner._shuffle import ShuffleWriter
from beam_ext.runner.worker._direct import (
    AssignWindows,
    DirectChain,
    DirectCombine,
    DirectCombinePhase,
    DirectSideInput,
    DirectStep,
)

_BUNDLE_METHODS = ("start_bundle", "finish_bundle")
_PRECOMBINE = common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn
_ASSIGN_WINDOWS = common_urns.primitives.ASSIGN_WINDOWS.urn
# A combine's steps after its GroupByKey, by Beam's name of their phase.
_PHASES = {common_urns.combine_components.COMBINE_PER_KEY_MERGE_ACCUMULATORS.urn: "merge",
           common_urns.combine_components.COMBINE_PER_KEY_EXTRACT_OUTPUTS.urn: "extract"}


def simple_dofn(payload: bytes) -> str | None:
    """Why the pickled DoFn info is not a DoFn of the element alone, or None."""
    from apache_beam.internal import pickler
    from apache_beam.runners.common import DoFnSignature
    from apache_beam.transforms import core, userstate

    try:
        dofn = pickler.loads(payload)[0]
    except Exception as exc:  # noqa: BLE001 - unpicklable here: keep Beam's path
        return f"its DoFn does not unpickle on the driver ({exc})"
    if not isinstance(dofn, core.DoFn):
        return f"{type(dofn).__name__} is not a DoFn"
    # Bundles are the bundle processor's (cut by --spark_bundle_size): a DoFn
    # that sees them keeps its path. setup and teardown see only the instance.
    bundle_methods = [m for m in _BUNDLE_METHODS if getattr(type(dofn), m) is not getattr(core.DoFn, m)]
    if bundle_methods:
        return f"{type(dofn).__name__} defines {', '.join(bundle_methods)}"
    signature = DoFnSignature(dofn)
    if any(True for _ in signature.get_setup_contexts()) or any(True for _ in signature.get_bundle_contexts()):
        return "it takes setup or bundle contexts"
    given = (core.DoFn.ElementParam, core.DoFn.TimestampParam, core.DoFn.WindowParam, core.DoFn.PaneInfoParam,
             core.DoFn.WindowedValueParam, core.DoFn.SideInputParam)
    if any(isinstance(d, (userstate.StateSpec, userstate.TimerSpec))
           or (isinstance(d, core._DoFnParam) and not any(d == g for g in given))
           for d in signature.process_method.defaults):
        return "it takes DoFn parameters other than the element's timestamp, window and pane"
    if signature.is_stateful_dofn() or signature.is_splittable_dofn():
        return "it is stateful or splittable"
    if dofn._process_batch_defined or dofn._process_yields_batches or not dofn._process_defined:
        return "it works on batches"
    return None


def direct_chain(transforms: Iterable[beam_runner_api_pb2.PTransform], *, input_coder: Any, output_coder: Any,
                 windowing_of: Callable[[str], Any], side_input: Callable[[str, str, str], tuple[int, Any] | None],
                 combine_fn: Callable[[beam_runner_api_pb2.CombinePayload], bytes],
                 shuffle: ShuffleWriter | None, partitions: int) -> DirectChain | None:
    """The stage's steps as a :class:`DirectChain`, or None if it is not one.

    ``windowing_of(pcollection id)``: its windowing strategy.
    ``side_input(transform name, tag, pcollection id)``: the side input's
    index among the stage's and its elements' coder, or None where it cannot
    be read whole. ``combine_fn(payload)``: a precombine's pickled
    ``(CombineFn, args, kwargs)``. ``shuffle``: how the output is written if
    it feeds a GroupByKey (its coder the real one, not the runner's bytes
    view), over ``partitions``. ``output_coder`` None: the stage has no
    output, its line ends the pipeline.
    """
    from apache_beam.internal import pickler
    from apache_beam.transforms import core, sideinputs
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
            continue
        if urn == bundle_processor.DATA_OUTPUT_URN:
            ends += 1
        elif urn == common_urns.primitives.FLATTEN.urn:
            if len(transform.inputs) != 1:
                return None
        elif urn not in (common_urns.primitives.PAR_DO.urn, _ASSIGN_WINDOWS, _PRECOMBINE) and urn not in _PHASES:
            return None
        main = [pcoll for tag, pcoll in transform.inputs.items() if not _is_side_tag(transform, tag)]
        if len(main) != 1 or main[0] in by_input:
            return None  # two consumers of one PCollection
        by_input[main[0]] = transform
    # No output coder: the line ends the pipeline, no buffer reads it.
    terminal = output_coder is None
    if start is None or ends != (0 if terminal else 1) or len(start.outputs) != 1:
        return None
    steps: list[DirectStep | DirectCombinePhase] = []
    precombine = None
    flattens = 0
    [pcoll] = start.outputs.values()
    while True:
        transform = by_input.get(pcoll)
        if transform is None and terminal and precombine is None:
            break
        if transform is None or precombine is not None and transform.spec.urn != bundle_processor.DATA_OUTPUT_URN:
            return None
        if transform.spec.urn == bundle_processor.DATA_OUTPUT_URN:
            break
        if len(transform.outputs) != 1:
            return None
        if transform.spec.urn == common_urns.primitives.FLATTEN.urn:
            # One input: the elements as they are (Beam's fusion puts one
            # before a Flatten's buffer where the coders differ; the output
            # is encoded with the buffer's coder).
            [pcoll] = transform.outputs.values()
            flattens += 1
            continue
        windowing = windowing_of(pcoll)
        if transform.spec.urn in _PHASES:
            payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.CombinePayload)
            steps.append(DirectCombinePhase(transform.unique_name, combine_fn(payload), _PHASES[transform.spec.urn]))
        elif transform.spec.urn == _ASSIGN_WINDOWS:
            # A WindowInto: its windows are its output's windowing strategy's.
            [out] = transform.outputs.values()
            assign = pickler.dumps((AssignWindows(windowing_of(out).windowfn), (), {}, None, None))
            steps.append(DirectStep(transform.unique_name, assign, windowing.windowfn))
        elif transform.spec.urn == _PRECOMBINE:
            if shuffle is None:
                return None
            payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.CombinePayload)
            precombine = DirectCombine(transform.unique_name, combine_fn(payload), windowing)
        else:
            payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
            if (payload.state_specs or payload.timer_family_specs or payload.restriction_coder_id
                    or payload.requests_finalization):
                return None
            try:
                dofn_data = core.DoFnInfo.from_runner_api(payload.do_fn, None).serialized_dofn_data()
            except ValueError:
                return None  # a DoFn of another SDK's or an unknown stateless kind
            if simple_dofn(dofn_data) is not None:
                return None
            views = []
            if payload.side_inputs:
                if not isinstance(windowing.windowfn, GlobalWindows):
                    return None
                for tag in sorted(payload.side_inputs, key=sideinputs.get_sideinput_index):
                    proto = payload.side_inputs[tag]
                    found = side_input(transform.unique_name, tag, transform.inputs[tag])
                    if (found is None or proto.access_pattern.urn != common_urns.side_inputs.ITERABLE.urn
                            or not isinstance(windowing_of(transform.inputs[tag]).windowfn, GlobalWindows)):
                        return None
                    index, coder = found
                    views.append(DirectSideInput(index, proto.view_fn.payload, coder))
            steps.append(DirectStep(transform.unique_name, dofn_data, windowing.windowfn, tuple(views)))
        [pcoll] = transform.outputs.values()
    if not steps and precombine is None:
        return None
    if len(steps) + (precombine is not None) + flattens + (1 if terminal else 2) != len(transforms):
        return None
    return DirectChain(tuple(steps), input_coder, output_coder, precombine=precombine, shuffle=shuffle,
                       partitions=partitions)


def _is_side_tag(transform: beam_runner_api_pb2.PTransform, tag: str) -> bool:
    if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
        return False
    from apache_beam.utils import proto_utils

    payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
    return tag in payload.side_inputs
