"""The planning phases: Beam's own, plus ours, as named functions.

Beam's phases are those the FnApiRunner applies (combiner packing and
lifting, SDF expansion, GroupByKey and Flatten expansion, greedy fusion, ...).
Ours:

* :func:`substitute_natives` (on the proto, before Beam's phases): a
  composite that declares a Spark-native URN with an implementation in the
  runner's table becomes one runner-executed leaf::

      ... -> SlidingAggregate{Map, GroupByKey, ParDo} -> ...
      becomes
      ... -> SlidingAggregate[beam_ext:sliding_aggregate:v1] -> ...

  Every composite that declares a URN but keeps its Beam expansion is
  logged, with the reason. A ``beam.Create`` is declared here, from the
  proto (:mod:`beam_ext.runner.planning._create`).
* :func:`spread_sdf_processing` (among Beam's phases, after SDF expansion):
  the stage that processes SDF restrictions starts a new stage, so the
  runner can spread the initial splits over all partitions (without it a big
  read is processed by the one task that ran the impulse)::

      Impulse -> PairWithRestriction -> SplitAndSize -> Process
      becomes
      [Impulse -> PairWithRestriction -> SplitAndSize] -> [Process]

* :func:`split_after_splittable` (streaming, before fusion): the steps after
  a splittable ``DoFn`` (an unbounded read) start a stage of their own,
  which keeps nothing between micro-batches and so runs on element objects::

      [Process -> Map -> WindowInto -> shuffle]
      becomes
      [Process] [Map -> WindowInto -> shuffle]

  Not after one of bounded outputs whose stage reads each restriction
  whole on element objects itself (``PlannedStage.reads_whole``).

* :func:`write_flattens_to_their_grouping` (after fusion): the
  inputs of a Flatten that a GroupByKey reads at once (``CoGroupByKey``),
  or after elementwise steps only, write the GroupByKey's shuffle
  themselves, each running those steps::

      [A -> Flatten buffer] [B -> Flatten buffer] [Flatten buffer -> Map -> shuffle]
      becomes
      [A -> Map -> shuffle] [B -> Map -> shuffle]

  and a stage writing several of its inputs flattens them itself::

      [A -> Partition -> Flatten buffer (twice)] [Flatten buffer -> Map -> shuffle]
      becomes
      [A -> Partition -> Flatten -> Map -> shuffle]

* :func:`sort_stages_by_name` (in place of Beam's ``sort_stages``): the
  same topological order, with ties broken by stage name rather than by the
  memory addresses Beam's sets of stages iterate in, so every process plans
  a pipeline with the same stage numbers. A streaming job keeps its state
  under those numbers and resumes from them after a restart.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Iterable, Iterator

from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.runners.portability.fn_api_runner.translations import Stage, TransformContext
from apache_beam.runners.worker import bundle_processor

from beam_ext.runner import native
from beam_ext.runner.planning._create import declare_native_creates
from beam_ext.runner.planning._reshuffle import declare_native_reshuffles

_LOG = logging.getLogger("beam_ext.runner")

RUNNER_URNS = frozenset([common_urns.primitives.FLATTEN.urn,
                         common_urns.primitives.GROUP_BY_KEY.urn])
SDF_PROCESS_URN = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn


def outputs_bounded(transform: beam_runner_api_pb2.PTransform, components: beam_runner_api_pb2.Components) -> bool:
    """Whether every output of ``transform`` is a bounded PCollection (a
    splittable ``DoFn``'s: a bounded read's, not ``PeriodicImpulse``'s)."""
    return all(components.pcollections[pcoll].is_bounded == beam_runner_api_pb2.IsBounded.BOUNDED
               for pcoll in transform.outputs.values())


# Steps that split_after_splittable starts a stage at: those a stage on objects runs.
_SPLIT_STEP_URNS = frozenset([common_urns.primitives.PAR_DO.urn, common_urns.primitives.ASSIGN_WINDOWS.urn])

Phase = Callable[[Iterable[Stage], TransformContext], Iterable[Stage]]


def spread_sdf_processing(stages: Iterable[Stage], context: TransformContext):
    """Makes each stage that processes SDF restrictions a root of its own."""
    for stage in stages:
        if any(t.spec.urn == SDF_PROCESS_URN for t in stage.transforms):
            stage.forced_root = True
        yield stage


def split_after_splittable(stages: Iterable[Stage], context: TransformContext,
                           after_bounded: bool = True) -> list[Stage]:
    """Streaming: the steps after a splittable ``DoFn`` start a stage of their own.

    ``after_bounded`` False: not after a ``DoFn`` whose outputs are all
    bounded, whose stage keeps nothing either (``PlannedStage.reads_whole``).

    Fusion puts them in the ``DoFn``'s stage, which keeps SDF residuals
    between micro-batches and so runs on Beam's bundle processor; on their
    own they keep nothing and run on element objects.

    The steps after a stateful ``DoFn`` stay in its stage: a new stage
    boundary would carry their elements' timestamps in Beam's encoding,
    which keeps milliseconds, and a timer's output at a window's end
    (x.999999 s) would reach them as x.999 s, where the DirectRunner and the
    fused stage give x.999999 s.
    """
    stages = list(stages)
    source_outputs = {pcoll for stage in stages for t in stage.transforms if t.spec.urn == SDF_PROCESS_URN
                      and (after_bounded or not outputs_bounded(t, context.components))
                      for pcoll in t.outputs.values()}
    for stage in stages:
        if not stage.transforms or any(t.spec.urn not in _SPLIT_STEP_URNS for t in stage.transforms):
            continue
        side = set(stage.side_inputs())
        if any(pcoll in source_outputs and pcoll not in side
               for t in stage.transforms for pcoll in t.inputs.values()):
            stage.forced_root = True
    return stages


def sort_stages_by_name(stages: Iterable[Stage], context: TransformContext) -> list[Stage]:
    """Orders stages for sequential execution: producers first, ties broken by name.

    Beam's ``sort_stages`` visits ``must_follow`` (a frozenset of stages
    hashed by address): two processes planning one pipeline get different
    orders.
    """
    stages = list(stages)
    members = set(stages)
    producers = {pcoll: stage for stage in stages for t in stage.transforms for pcoll in t.outputs.values()}
    seen: set[Stage] = set()
    ordered: list[Stage] = []

    def visit(stage: Stage) -> None:
        if stage in seen or stage not in members:
            return
        seen.add(stage)
        outputs = {pcoll for t in stage.transforms for pcoll in t.outputs.values()}
        before = set(stage.must_follow) | {
            producers[pcoll] for t in stage.transforms for pcoll in t.inputs.values()
            if pcoll not in outputs and pcoll in producers}
        for previous in sorted(before, key=lambda s: s.name):
            visit(previous)
        ordered.append(stage)

    for stage in sorted(stages, key=lambda s: s.name):
        visit(stage)
    return ordered


def write_flattens_to_their_grouping(stages: Iterable[Stage], context: TransformContext,
                                     in_stage: bool = True) -> list[Stage]:
    """Drops each stage that only moves a Flatten's buffer into a GroupByKey's
    shuffle, maybe through elementwise steps: the stages writing the buffer
    run those steps and write the shuffle instead.

    Beam's ``sink_flattens`` makes every input of a multi-input Flatten write
    one buffer (``<flatten>/Write/<input>``) and a stage read it back
    (``<flatten>/Read``). Where a GroupByKey follows at once, as in every
    ``CoGroupByKey``, that stage does nothing but decode each element and
    encode it again for the shuffle, a Spark job's worth of work over all of
    the Flatten's elements. A GroupByKey reads the union of what its writers
    shuffle, so the Flatten's inputs can shuffle their elements themselves.
    Steps between the Flatten and the GroupByKey that see one element at a
    time (a ``ParDo`` without state, timers, side inputs or restrictions, a
    ``WindowInto``, a lifted combine's pre-combining) give each element the
    same outputs in whichever stage runs them, so each writer runs a copy.
    Done only where each writer is a stage of Beam transforms (a native
    step's output is not shuffled by it) whose elements carry the Flatten's
    coder and windowing (``fix_flatten_coders`` transcodes the inputs to the
    Flatten's coder where they differ). With steps to copy, a stage writing
    several of the Flatten's inputs (a ``Partition``'s outputs flattened
    back, a ``DoFn``'s main and tagged outputs) runs a ``Flatten`` of them
    and one copy of the steps after it; ``in_stage`` False leaves such a
    Flatten's stage in place, as earlier releases planned it.
    """
    stages = list(stages)
    pcolls = context.components.pcollections
    strategies = context.components.windowing_strategies
    runner_urns = context.known_runner_urns - {common_urns.primitives.FLATTEN.urn,
                                                common_urns.primitives.GROUP_BY_KEY.urn}

    def encoding(pcoll: str) -> tuple[str, str]:
        return pcolls[pcoll].coder_id, strategies[pcolls[pcoll].windowing_strategy_id].window_coder_id

    def same_elements(pcoll: str, flattened: str, steps: bool) -> bool:
        # Steps copied onto a writer's own input also see its windowing.
        return encoding(pcoll) == encoding(flattened) and (not steps or strategy(pcoll) == strategy(flattened))

    def strategy(pcoll: str) -> bytes:
        return strategies[pcolls[pcoll].windowing_strategy_id].SerializeToString(deterministic=True)

    def only(transforms, urn: str) -> list:
        return [t for t in transforms if t.spec.urn == urn]

    dropped: set[Stage] = set()
    for relay in stages:
        reads = only(relay.transforms, bundle_processor.DATA_INPUT_URN)
        writes = only(relay.transforms, bundle_processor.DATA_OUTPUT_URN)
        if len(reads) != 1 or len(writes) != 1:
            continue
        [read], [write] = reads, writes
        steps = [t for t in relay.transforms if t is not read and t is not write]
        flatten = read.unique_name.removesuffix("/Read")
        if (flatten == read.unique_name or read.spec.payload != translations.create_buffer_id(flatten)
                or translations.split_buffer_id(write.spec.payload)[0] != "group"
                or not all(_elementwise(t) for t in steps)
                or (not steps and list(read.outputs.values()) != list(write.inputs.values()))):
            continue
        [flattened] = read.outputs.values()
        writers = [(stage, t) for stage in stages if stage is not relay
                   for t in only(stage.transforms, bundle_processor.DATA_OUTPUT_URN)
                   if t.spec.payload == read.spec.payload]
        others = [stage for stage in stages if stage is not relay
                  for t in only(stage.transforms, bundle_processor.DATA_INPUT_URN)
                  if t.spec.payload == read.spec.payload]
        by_stage: dict[int, tuple[Stage, list]] = {}
        for stage, t in writers:
            by_stage.setdefault(id(stage), (stage, []))[1].append(t)
        if (not writers or others
                or steps and not in_stage and len(by_stage) != len(writers)
                or any(not t.unique_name.startswith(flatten + "/Write/")
                       or any(u.spec.urn in runner_urns for u in stage.transforms)
                       or not same_elements(translations.only_element(t.inputs.values()), flattened, bool(steps))
                       for stage, t in writers)):
            continue
        for stage, writes in by_stage.values():
            if not steps:
                for t in writes:
                    t.spec.payload = write.spec.payload
                continue
            # A copy per writing stage: planning later rewrites a data
            # transform's payload in place, and each writer feeds its own input in.
            if len(writes) == 1:
                pcoll = translations.only_element(writes[0].inputs.values())
                copies = [_copied(u, {flattened: pcoll}) for u in (*steps, write)]
            else:
                # Several inputs of the Flatten are this stage's (a Partition's
                # outputs, say): a Flatten of them in the stage, the steps once after it.
                copies = [_flatten_of(flatten, [translations.only_element(t.inputs.values()) for t in writes],
                                      flattened),
                          *(_copied(u, {}) for u in (*steps, write))]
            written = {id(t) for t in writes}
            stage.transforms = [u for u in stage.transforms if id(u) not in written] + copies
        dropped.add(relay)
    if not dropped:
        return stages
    kept = [stage for stage in stages if stage not in dropped]
    for stage in kept:
        # What had to follow a dropped stage follows what it had to follow.
        follows = set(stage.must_follow)
        while follows & dropped:
            for relay in follows & dropped:
                follows.discard(relay)
                follows |= relay.must_follow
        stage.must_follow = frozenset(follows)
    return kept


_ELEMENTWISE_URNS = frozenset([common_urns.primitives.ASSIGN_WINDOWS.urn,
                               common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn])


def _elementwise(transform: beam_runner_api_pb2.PTransform) -> bool:
    """Whether ``transform`` gives each element its outputs alone, whichever stage runs it."""
    if transform.spec.urn in _ELEMENTWISE_URNS:
        return True
    if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
        return False
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    return not (payload.side_inputs or payload.state_specs or payload.timer_family_specs
                or payload.restriction_coder_id or payload.requests_finalization
                or payload.requires_stable_input or payload.requires_time_sorted_input)


def _flatten_of(name: str, pcolls: list[str], flattened: str) -> beam_runner_api_pb2.PTransform:
    """A Flatten of ``pcolls`` into ``flattened``, inside a stage."""
    return beam_runner_api_pb2.PTransform(
        unique_name=name, spec=beam_runner_api_pb2.FunctionSpec(urn=common_urns.primitives.FLATTEN.urn),
        inputs={f"in{n}": pcoll for n, pcoll in enumerate(pcolls)}, outputs={"out": flattened})


def _copied(transform: beam_runner_api_pb2.PTransform, renamed: dict[str, str]) -> beam_runner_api_pb2.PTransform:
    copy = beam_runner_api_pb2.PTransform()
    copy.CopyFrom(transform)
    for tag, pcoll in copy.inputs.items():
        copy.inputs[tag] = renamed.get(pcoll, pcoll)
    return copy


def lift_combiners_keeping_element_timestamps(stages: Iterable[Stage],
                                             context: TransformContext) -> Iterator[Stage]:
    """Beam's combiner lifting, except for a CombinePerKey whose output
    timestamp is not the end of the window: that one runs unlifted.

    A streaming GroupByKey gives an element no watermark hold when it is
    behind the output watermark. Pre-combining merges the timestamps of a
    key's elements into one (the earliest, say) before the shuffle, so a pane
    of elements partly behind the watermark would be timestamped by the ones
    behind it; the DirectRunner, which does not lift in streaming, keeps each
    element's own timestamp (trigger_transcripts.yaml,
    known_late_data_watermark). At the end of the window the timestamp does
    not depend on the elements, so lifting changes nothing.
    """
    for stage in stages:
        transform = stage.transforms[0] if len(stage.transforms) == 1 else None
        if (transform is not None and transform.spec.urn == common_urns.composites.COMBINE_PER_KEY.urn
                and _output_time(transform, context) != beam_runner_api_pb2.OutputTime.END_OF_WINDOW):
            for sub in transform.subtransforms:
                yield Stage(sub, [context.components.transforms[sub]],
                            downstream_side_inputs=stage.downstream_side_inputs,
                            must_follow=stage.must_follow, parent=stage.name,
                            environment=stage.environment)
        else:
            yield from translations.lift_combiners([stage], context)


def _output_time(transform: beam_runner_api_pb2.PTransform, context: TransformContext):
    [pcoll] = transform.inputs.values()
    strategy = context.components.pcollections[pcoll].windowing_strategy_id
    return context.components.windowing_strategies[strategy].output_time


def optimize_phases(streaming: bool = False, split_splittable: bool = True,
                    flattens_write_groupings: bool = True, flattens_in_stage: bool = True,
                    split_after_bounded: bool = True) -> list[Phase]:
    """Beam's standard phases in Beam's order, with ours where they belong.

    ``split_splittable``, ``flattens_write_groupings`` and
    ``flattens_in_stage`` False (streaming) plan as releases before those
    phases did, for their checkpoints. ``split_after_bounded``: see
    :func:`split_after_splittable`."""
    t = translations
    return [
        t.annotate_downstream_side_inputs,
        t.annotate_stateful_dofns_as_roots,
        t.fix_side_input_pcoll_coders,
        t.pack_combiners,
        lift_combiners_keeping_element_timestamps if streaming else t.lift_combiners,
        t.expand_sdf,
        spread_sdf_processing,
        t.expand_gbk,
        t.sink_flattens,
        *((functools.partial(split_after_splittable, after_bounded=split_after_bounded),)
          if streaming and split_splittable else ()),
        t.greedily_fuse,
        *((functools.partial(write_flattens_to_their_grouping, in_stage=flattens_in_stage),)
          if flattens_write_groupings or not streaming else ()),
        t.read_to_impulse,
        t.impulse_to_input,
        sort_stages_by_name,
        t.add_impulse_to_dangling_transforms,
        t.setup_timer_mapping,
        t.populate_data_channel_coders,
    ]


def substitute_natives(proto: beam_runner_api_pb2.Pipeline, only: frozenset[str] | None = None) -> frozenset[str]:
    """Turns composites with a Spark-native implementation into leaves; returns their URNs.

    ``only``: the URNs that may be substituted (a streaming plan's); the
    runner's own declarations are then made only for those among them
    (a Create's; a Reshuffle's never)."""
    if only is None or native.CREATE_URN in only:
        declare_native_creates(proto)
    if only is None:
        declare_native_reshuffles(proto)
    urns = set()
    for transform in proto.components.transforms.values():
        urn_bytes = transform.annotations.get(native.NATIVE_URN_ANNOTATION)
        if not urn_bytes or not transform.subtransforms:
            continue
        urn = urn_bytes.decode("utf-8")
        if only is not None and urn not in only:
            continue
        if native.lookup_native(urn) is None:
            _LOG.info("step %r: no Spark-native implementation of %s; running its Beam expansion",
                      transform.unique_name, urn)
            continue
        # No input: a read; planning gives it the impulse as input.
        if len(transform.inputs) > 1 or len(transform.outputs) != 1:
            _LOG.info("step %r: %s needs at most one input and one output, it has %d and %d; "
                      "running its Beam expansion", transform.unique_name, urn,
                      len(transform.inputs), len(transform.outputs))
            continue
        if urn in native.ONE_WINDOW_PER_ELEMENT:
            window_fn = _input_window_fn(proto, transform)
            if window_fn not in _ONE_WINDOW_FNS:
                _LOG.info("step %r: %s needs global or fixed windows, its input has %s; "
                          "running its Beam expansion", transform.unique_name, urn, window_fn)
                continue
        transform.spec.urn = urn
        transform.spec.payload = transform.annotations[native.NATIVE_PAYLOAD_ANNOTATION]
        del transform.subtransforms[:]
        _LOG.info("step %r runs Spark-natively (%s)", transform.unique_name, urn)
        urns.add(urn)
    return frozenset(urns)


_ONE_WINDOW_FNS = frozenset({common_urns.global_windows.urn, common_urns.fixed_windows.urn})


def _input_window_fn(proto: beam_runner_api_pb2.Pipeline,
                     transform: beam_runner_api_pb2.PTransform) -> str:
    """The URN of the window function of ``transform``'s only input."""
    [pcoll_id] = transform.inputs.values()
    components = proto.components
    strategy = components.pcollections[pcoll_id].windowing_strategy_id
    return components.windowing_strategies[strategy].window_fn.urn


def unsupported_leaves(proto: beam_runner_api_pb2.Pipeline,
                       runner_urns: frozenset[str]) -> list[tuple[str, str]]:
    """(step, URN) of every leaf neither Beam's worker nor the runner can run."""
    known = (set(bundle_processor.BeamTransformFactory._known_urns) | RUNNER_URNS | runner_urns
             | {common_urns.primitives.IMPULSE.urn} | set(translations.KNOWN_COMPOSITES)
             # Composites whose expansion turned out empty (e.g. a reshuffle
             # that was not needed) are leaves carrying no work.
             | {python_urns.PICKLED_TRANSFORM, python_urns.GENERIC_COMPOSITE_TRANSFORM})
    return [(t.unique_name, t.spec.urn) for t in proto.components.transforms.values()
            if not t.subtransforms and t.spec.urn and t.spec.urn not in known]


def check_flattens(proto: beam_runner_api_pb2.Pipeline) -> None:
    """Refuses, naming it, a ``Flatten`` of inputs whose windows are of another kind than its output's.

    Beam's Python SDK builds such a ``Flatten`` without complaint (Beam's
    Java SDK refuses it). Its output's coder then reads an input's windows
    with another window coder: Beam's FnApiRunner fails decoding them, and
    a stage here would read garbage as elements, e.g. a global window's
    element as None.
    """
    components = proto.components

    def window_kind(pcoll: str) -> str:
        strategy = components.windowing_strategies[components.pcollections[pcoll].windowing_strategy_id]
        return components.coders[strategy.window_coder_id].spec.urn

    for transform_id, transform in components.transforms.items():
        if transform.spec.urn != common_urns.primitives.FLATTEN.urn or not transform.outputs:
            continue
        [out] = transform.outputs.values()
        wanted = window_kind(out)
        for tag, pcoll in transform.inputs.items():
            kind = window_kind(pcoll)
            if kind != wanted:
                name = transform.unique_name or transform_id
                raise ValueError(
                    f"Flatten {name!r}: its input {tag!r} ({components.pcollections[pcoll].unique_name}) has "
                    f"windows of another kind ({kind}) than its output ({wanted}); apply the same WindowInto "
                    "to every input of a Flatten first")


def check_supported(proto: beam_runner_api_pb2.Pipeline, runner_urns: frozenset[str]) -> None:
    """Refuses, naming the transform, any leaf neither Beam's worker nor the runner can run."""
    for name, urn in unsupported_leaves(proto, runner_urns)[:1]:
        hint = (" (TestStream needs --streaming)"
                if urn == common_urns.primitives.TEST_STREAM.urn else "")
        raise NotImplementedError(
            f"SparkRunner cannot run transform {name!r}: "
            f"unknown URN {urn!r}{hint}")
