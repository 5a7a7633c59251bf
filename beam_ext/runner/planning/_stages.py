"""Fused stages -> :class:`PlannedStage`: what an executor needs to run each one.

A :class:`Plan` is a list of stages in topological order; each names the
buffers it reads and writes, like the FnApiRunner's buffers: ``impulse``,
``materialize:<pcoll>``, ``group:<gbk transform>``. Executors (batch today,
streaming next) run the same plan.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from apache_beam.coders import WindowedValueCoder
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2, endpoints_pb2
from apache_beam.runners import pipeline_context
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.runners.portability.fn_api_runner.translations import Stage, TransformContext, split_buffer_id
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms.trigger import AccumulationMode, Always
from apache_beam.transforms.window import GlobalWindows, TimestampCombiner
from apache_beam.utils import proto_utils

from beam_ext.runner._batch_panes import reads_windows_and_values
from beam_ext.runner._pickled_values import PickledValues
from beam_ext.runner._row_columns import RowColumns
from beam_ext.runner._shuffle import ShuffleWriter
from beam_ext.runner.planning._direct_chain import DirectEnd, direct_chain
from beam_ext.runner.planning._phases import SDF_PROCESS_URN, outputs_bounded
from beam_ext.runner.planning._test_stream import TestStreamSpec, test_stream_spec
from beam_ext.runner.worker import StageSpec
from beam_ext.runner.worker._direct import DirectChain
from beam_ext.runner.worker._setup import WorkerSetup


@dataclasses.dataclass
class GroupSpec:
    """How to group one ``group:`` buffer after the shuffle."""

    pre_coder: WindowedValueCoder
    post_coder: WindowedValueCoder
    windowing: Any
    trivial: bool  # global window, default trigger: values stay encoded
    step: str = ""  # the GroupByKey's name, for metrics
    memory_bytes: int = 256 << 20  # a task's budget before it spills sorted runs
    # A trivial grouping's values shuffled as blocks: schema rows as columns, or objects Beam pickles.
    blocks: RowColumns | PickledValues | None = None
    # A Reshuffle's grouping, in streaming: its panes are read by nobody but
    # the Reshuffle's own last step, which gives each element its timestamp,
    # windows and pane back. So each key's values of a batch pass through as
    # the one pane Beam's driver would fire under the Reshuffle's Always()
    # trigger, and no state is kept: under Beam's random keys the driver's
    # state would be one entry per element, kept as long as the global
    # window lasts (worker/_streaming_group.py).
    passes_through: bool = False
    # Streaming, windows that do not merge, end-of-window output timestamps:
    # the trigger driver reads of an element only its value and windows, so
    # stages on objects ship values gathered per key and windows
    # (_shuffle.WindowedKeyedValues).
    by_window: bool = False
    # Batch, windows that do not merge, the default trigger, end-of-window
    # output times: the pane driver reads of an element only its windows and
    # value, so each shuffled payload is those, without the element's
    # timestamp and pane (_shuffle.ShuffleWriter).
    windows_apart: bool = False


def _fires_every_element(windowing: Any) -> bool:
    """Whether ``windowing`` is the one Beam's Reshuffle groups under: the
    global window, ``Always()``, discarding, earliest output timestamps."""
    return (isinstance(windowing.windowfn, GlobalWindows) and isinstance(windowing.triggerfn, Always)
            and windowing.accumulation_mode == AccumulationMode.DISCARDING
            and windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EARLIEST)


@dataclasses.dataclass
class SideInputSpec:
    """One side input of a stage: which buffer, for which transform and tag."""

    buffer: bytes
    transform_id: str
    tag: str
    access_pattern: beam_runner_api_pb2.FunctionSpec
    coder: WindowedValueCoder


@dataclasses.dataclass
class NativeSpec:
    urn: str
    payload: bytes
    step_name: str
    input_coder: WindowedValueCoder
    output_coder: WindowedValueCoder
    # The job's pickler, main session and classes of __main__, applied before
    # a task decodes the input's values (Beam's coder may unpickle them).
    worker_setup: WorkerSetup | None = None


@dataclasses.dataclass
class PlannedStage:
    name: str
    inputs: list[bytes]  # buffer ids, by input index
    outputs: list[bytes]  # buffer ids, by output index
    input_coders: list[WindowedValueCoder]
    spec: StageSpec | None = None  # None for a native stage
    native: NativeSpec | None = None
    side_inputs: list[SideInputSpec] = dataclasses.field(default_factory=list)
    steps: tuple[str, ...] = ()  # the user's top-level steps fused here, for errors
    keyed: bool = False  # stateful: partition input by key first
    spread: bool = False  # SDF processing: spread input elements over partitions
    # SDF processing (in streaming, of a bounded DoFn): its pickled DoFnInfo,
    # whose trackers split a few restrictions to fill the tasks.
    sdf_info: bytes | None = None
    # Streaming SDF processing of bounded outputs: each restriction is read
    # whole in the micro-batch it arrives in, on objects, keeping nothing.
    reads_whole: bool = False
    test_stream: TestStreamSpec | None = None  # streaming: the runner replays its events
    source_pcolls: tuple[str, ...] = ()  # outputs of its SDF reads: what a stream counts as input
    # Only Map-like steps (and a partial combine): the batch executor runs them on element objects.
    direct: DirectChain | None = None

    @property
    def label(self) -> str:
        """The user's steps fused here, for logs and Spark's UI (not the
        fused stage's id, which joins transform ids)."""
        label = "+".join(self.steps) if self.steps else self.name
        return label if len(label) <= 100 else label[:97] + "..."

    @property
    def keeps_state(self) -> bool:
        """Whether the stage has anything to keep between micro-batches
        (user state, timers, SDF residuals)."""
        return self.spec is not None and (self.keyed or self.spread and not self.reads_whole
                                          or bool(self.spec.timer_families))


@dataclasses.dataclass
class Plan:
    stages: list[PlannedStage]
    groups: dict[bytes, GroupSpec]


def _user_steps(stage: Stage) -> tuple[str, ...]:
    """The top-level steps (``"Create"``, ``"Parse"``) of a fused stage's transforms.

    The stage's own name joins transform ids; users know their step labels.
    """
    def top_level(transforms) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.unique_name.split("/")[0] for t in transforms))

    runner_made = (bundle_processor.DATA_INPUT_URN, bundle_processor.DATA_OUTPUT_URN)
    # A stage of only a read and a write, as Beam plans a Flatten before a
    # keyed stage ("Both/Read", "ref_PCollection_PCollection_6/Write"), is
    # named by its read: the write names a PCollection's id.
    return (top_level(t for t in stage.transforms if t.spec.urn not in runner_made)
            or top_level(t for t in stage.transforms if not t.unique_name.startswith("ref_"))
            or (stage.name,))


def _sdf_info(stage: Stage, components: beam_runner_api_pb2.Components, streaming: bool) -> bytes | None:
    """The pickled ``DoFnInfo`` of the one splittable ``DoFn`` whose sized
    restrictions a stage processes, or None (several, or another SDK's).

    In streaming, only a ``DoFn`` whose outputs are bounded (a bounded
    read's): an unbounded one's restriction (``PeriodicImpulse``'s ticks, a
    watch of new files) runs as long as the stream, and cutting it would
    turn one position into several, each holding the watermark.
    """
    from apache_beam.transforms import core

    processes = [t for t in stage.transforms if t.spec.urn == SDF_PROCESS_URN]
    if len(processes) != 1:
        return None
    if streaming and not outputs_bounded(processes[0], components):
        return None
    payload = proto_utils.parse_Bytes(processes[0].spec.payload, beam_runner_api_pb2.ParDoPayload)
    try:
        return core.DoFnInfo.from_runner_api(payload.do_fn, None).serialized_dofn_data()
    except ValueError:  # not a Python DoFn
        return None


class StagePlanner:
    """Turns Beam's fused stages into :class:`PlannedStage`s."""

    def __init__(self, context: TransformContext, native_urns: frozenset[str],
                 bundle_bytes: int, partitions: int) -> None:
        self._partitions = partitions
        self._context = context
        self._components = context.components
        self._pipeline_context = pipeline_context.PipelineContext(self._components)
        self._native_urns = native_urns
        self._bundle_bytes = bundle_bytes
        self._groups: dict[bytes, GroupSpec] = {}
        self._reshuffled: frozenset[str] | None = None
        self.state = ("memory", 256 << 20)
        self.group_memory = 256 << 20
        self.streaming = False
        self.gather_by_window = True  # streaming: GroupSpec.by_window where the windowing allows
        self.reads_whole = True  # streaming: PlannedStage.reads_whole where a DoFn's outputs are bounded

    def _coder(self, coder_id: str, safe: bool = False):
        if safe:
            coder_id = self._context.safe_coders.get(coder_id, coder_id)
        return self._pipeline_context.coders[coder_id]

    def _channel_coder(self, pcoll: str, safe: bool = False):
        return self._coder(self._context.data_channel_coders[pcoll], safe)

    def plan(self, stages: list[Stage]) -> Plan:
        return Plan([self._plan_stage(s) for s in stages], self._groups)

    def _group_spec(self, buffer_id: bytes) -> GroupSpec:
        if buffer_id not in self._groups:
            _, gbk_id = split_buffer_id(buffer_id)
            gbk = self._components.transforms[gbk_id]
            in_pcoll = translations.only_element(list(gbk.inputs.values()))
            out_pcoll = translations.only_element(list(gbk.outputs.values()))
            if in_pcoll not in self._context.data_channel_coders:
                # No stage writes it: the Flatten before the grouping was
                # dropped (write_flattens_to_their_grouping), its inputs write.
                self._context.add_data_channel_coder(in_pcoll)
            windowing = self._pipeline_context.windowing_strategies[
                self._components.pcollections[in_pcoll].windowing_strategy_id]
            # In streaming every group runs Beam's trigger driver on whole
            # windowed values (worker/_streaming_group.py), never the bytes-only path.
            trivial = windowing.is_default() and not self.streaming
            # Stages on objects write a trivial grouping's rows of plain fields, or the
            # objects Beam's coder would pickle one by one, as blocks.
            blocks = None
            if trivial:
                value_coder = self._channel_coder(in_pcoll).wrapped_value_coder.value_coder()
                blocks = RowColumns.of(value_coder) or PickledValues.of(value_coder)
            # Default windowing can keep keys and values as opaque bytes (the
            # safe coders); anything else needs the real windows and keys.
            self._groups[buffer_id] = GroupSpec(
                pre_coder=self._channel_coder(in_pcoll, safe=trivial),
                post_coder=self._channel_coder(out_pcoll, safe=trivial),
                windowing=windowing, trivial=trivial, step=gbk.unique_name,
                memory_bytes=self.group_memory, blocks=blocks,
                passes_through=self.streaming and gbk_id in self._reshuffle_groups()
                and _fires_every_element(windowing),
                by_window=self.streaming and self.gather_by_window and not windowing.windowfn.is_merging()
                and windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW,
                windows_apart=not self.streaming and reads_windows_and_values(windowing))
        return self._groups[buffer_id]

    def _reshuffle_groups(self) -> frozenset[str]:
        """The ids of the GroupByKeys inside Beam's ``Reshuffle`` composites."""
        if self._reshuffled is not None:
            return self._reshuffled
        found, todo = set(), [t for t in self._components.transforms.values()
                              if t.spec.urn == common_urns.composites.RESHUFFLE.urn]
        while todo:
            transform = todo.pop()
            for sub in transform.subtransforms:
                child = self._components.transforms[sub]
                if child.spec.urn == common_urns.primitives.GROUP_BY_KEY.urn:
                    found.add(sub)
                todo.append(child)
        self._reshuffled = frozenset(found)
        return self._reshuffled

    def _plan_stage(self, stage: Stage) -> PlannedStage:
        inputs, outputs, input_ids, output_ids, input_coders = [], [], [], {}, []
        output_pcolls: list[str] = []
        shuffle_writers = {}
        native_transform = None
        test_stream = None
        side_inputs: list[SideInputSpec] = []
        for transform in stage.transforms:
            urn = transform.spec.urn
            if urn == bundle_processor.DATA_INPUT_URN:
                buffer_id = transform.spec.payload
                pcoll = translations.only_element(transform.outputs.values())
                input_ids.append(transform.unique_name)
                inputs.append(buffer_id)
                input_coders.append(self._channel_coder(pcoll))
                self._set_port(transform, pcoll)
            elif urn == bundle_processor.DATA_OUTPUT_URN:
                buffer_id = transform.spec.payload
                pcoll = translations.only_element(transform.inputs.values())
                output_ids[transform.unique_name] = len(outputs)
                if split_buffer_id(buffer_id)[0] == "group":
                    group = self._group_spec(buffer_id)
                    shuffle_writers[len(outputs)] = ShuffleWriter(group.pre_coder, group.trivial,
                                                                  windows_apart=group.windows_apart)
                outputs.append(buffer_id)
                output_pcolls.append(pcoll)
                self._set_port(transform, pcoll)
            elif urn == common_urns.primitives.TEST_STREAM.urn:
                test_stream = transform
            elif urn in self._native_urns:
                native_transform = transform
            elif urn in translations.PAR_DO_URNS:
                payload = proto_utils.parse_Bytes(
                    transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
                for tag, si in payload.side_inputs.items():
                    pcoll = transform.inputs[tag]
                    side_inputs.append(SideInputSpec(
                        buffer=translations.create_buffer_id(pcoll),
                        transform_id=transform.unique_name, tag=tag,
                        access_pattern=si.access_pattern,
                        coder=self._channel_coder(pcoll, safe=True)))
            elif urn == common_urns.primitives.GROUP_BY_KEY.urn:
                raise NotImplementedError(
                    f"SparkRunner: runner transform {transform.unique_name!r} ({urn}) "
                    "was not expanded by planning")
        planned = PlannedStage(name=stage.name, inputs=inputs, outputs=outputs,
                               input_coders=input_coders, side_inputs=side_inputs,
                               steps=_user_steps(stage))
        if test_stream is not None:
            planned.test_stream = test_stream_spec(
                test_stream, output_pcolls, self._pipeline_context, self._channel_coder)
            planned.steps = (test_stream.unique_name,)
            return planned
        if native_transform is not None:
            planned.native = self._native_spec(native_transform)
            planned.steps = (native_transform.unique_name,)
            return planned
        planned.keyed = stage.is_stateful()
        planned.spread = any(t.spec.urn == SDF_PROCESS_URN for t in stage.transforms)
        if planned.spread:
            planned.sdf_info = _sdf_info(stage, self._components, self.streaming)
            # A bounded DoFn's restriction read whole in the micro-batch it
            # arrives in, as batch reads it, gives what reading it over several
            # would, its outputs sooner: nothing is kept, no watermark held.
            planned.reads_whole = self.streaming and self.reads_whole and planned.sdf_info is not None
        planned.source_pcolls = tuple(pcoll for t in stage.transforms if t.spec.urn == SDF_PROCESS_URN
                                      for pcoll in t.outputs.values())
        planned.spec = StageSpec(
            name=stage.name,
            descriptor=self._descriptor(stage).SerializeToString(),
            inputs=tuple(input_ids),
            input_coders=tuple(input_coders),
            outputs=output_ids,
            shuffle_writers=shuffle_writers,
            timer_families=tuple(sorted(stage.timers)),
            timer_coders=self._timer_coders(stage),
            processing_time_timers=self._processing_time_timers(stage),
            bundle_bytes=self._bundle_bytes,
            partitions=self._partitions,
            state_backend=self.state[0] if planned.keyed else "memory",
            state_memory_bytes=self.state[1])
        # A stateful stage runs on objects a key at a time, its state held in
        # memory for that key alone: with the in-memory state backend, which
        # holds every key's (with the spill backend, Beam's bundle processor
        # and its state servicer keep the user's choice). In streaming only a
        # stage that keeps nothing between micro-batches does (no state, no
        # timers, no SDF residuals): the rest is the streaming task worker's.
        if self.streaming:
            on_objects = not planned.keeps_state
        else:
            on_objects = planned.keyed and self.state[0] == "memory" or not planned.keyed and not stage.timers
        if len(inputs) == 1 and on_objects:
            planned.direct = self._direct_chain(stage, input_coders[0], output_ids, outputs, output_pcolls,
                                                side_inputs, keyed=planned.keyed)
        return planned

    def _direct_chain(self, stage: Stage, input_coder: Any, output_ids: dict[str, int], outputs: list[bytes],
                      output_pcolls: list[str], side_inputs: list[SideInputSpec],
                      keyed: bool = False) -> DirectChain | None:
        from apache_beam.internal import pickler
        from apache_beam.transforms import core

        def side_input(transform_name: str, tag: str, pcoll: str) -> tuple[int, Any] | None:
            for index, spec in enumerate(side_inputs):
                if spec.transform_id == transform_name and spec.tag == tag:
                    return index, self._channel_coder(pcoll)
            return None

        def combine_fn(payload: beam_runner_api_pb2.CombinePayload) -> bytes:
            return pickler.dumps((core.CombineFn.from_runner_api(payload.combine_fn, self._pipeline_context), [], {}))

        ends = {}
        for transform_id, index in output_ids.items():
            coder = self._channel_coder(output_pcolls[index])
            shuffle = None
            if split_buffer_id(outputs[index])[0] == "group":
                # The real coder, not the runner's bytes view: the chain encodes objects.
                group = self._group_spec(outputs[index])
                shuffle = ShuffleWriter(coder, group.trivial, group.blocks, group.by_window, group.windows_apart)
            ends[transform_id] = DirectEnd(index, coder, shuffle)
        return direct_chain(stage.transforms, input_coder=input_coder, ends=ends, windowing_of=self._windowing,
                            side_input=side_input, combine_fn=combine_fn, partitions=self._partitions,
                            keyed_memory=self.group_memory if keyed else 0)

    def _windowing(self, pcoll: str):
        strategy = self._components.pcollections[pcoll].windowing_strategy_id
        return self._pipeline_context.windowing_strategies[strategy]

    def _set_port(self, transform: beam_runner_api_pb2.PTransform, pcoll: str) -> None:
        port = beam_fn_api_pb2.RemoteGrpcPort(coder_id=self._context.data_channel_coders[pcoll])
        transform.spec.payload = port.SerializeToString()

    @staticmethod
    def _timer_specs(stage: Stage):
        """``((transform id, timer family), TimerFamilySpec)`` of every timer in ``stage``."""
        for transform in stage.transforms:
            if transform.spec.urn in translations.PAR_DO_URNS:
                payload = proto_utils.parse_Bytes(
                    transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
                for family, spec in payload.timer_family_specs.items():
                    yield (transform.unique_name, family), spec

    def _timer_coders(self, stage: Stage) -> dict:
        return {family: self._coder(spec.timer_family_coder_id)
                for family, spec in self._timer_specs(stage)}

    def _processing_time_timers(self, stage: Stage) -> frozenset[tuple[str, str]]:
        return frozenset(family for family, spec in self._timer_specs(stage)
                         if spec.time_domain == beam_runner_api_pb2.TimeDomain.PROCESSING_TIME)

    def _native_spec(self, transform: beam_runner_api_pb2.PTransform) -> NativeSpec:
        in_pcoll = translations.only_element(transform.inputs.values())
        out_pcoll = translations.only_element(transform.outputs.values())
        return NativeSpec(
            urn=transform.spec.urn, payload=transform.spec.payload,
            step_name=transform.unique_name,
            input_coder=self._channel_coder(in_pcoll),
            output_coder=self._output_coder(out_pcoll))

    def _output_coder(self, pcoll: str):
        """The channel coder of a native step's output, or, if nothing reads
        it (the pipeline ends there; the step still runs, for its counters),
        its windowed element coder."""
        if pcoll in self._context.data_channel_coders:
            return self._channel_coder(pcoll)
        proto = self._components.pcollections[pcoll]
        windowing = self._pipeline_context.windowing_strategies[proto.windowing_strategy_id]
        return WindowedValueCoder(self._pipeline_context.coders[proto.coder_id],
                                  windowing.windowfn.get_window_coder())

    def _descriptor(self, stage: Stage) -> beam_fn_api_pb2.ProcessBundleDescriptor:
        components = self._components
        return beam_fn_api_pb2.ProcessBundleDescriptor(
            id=stage.name,
            transforms={t.unique_name: t for t in stage.transforms},
            pcollections=dict(components.pcollections.items()),
            coders=dict(components.coders.items()),
            windowing_strategies=dict(components.windowing_strategies.items()),
            environments=dict(components.environments.items()),
            # Timers travel on the data channel; the SDK needs an endpoint set.
            timer_api_service_descriptor=endpoints_pb2.ApiServiceDescriptor(url="in-process"))
