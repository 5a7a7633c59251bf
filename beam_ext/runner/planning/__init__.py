"""Planning: a Runner API pipeline -> a :class:`Plan` of fused stages.

The steps, each in its own module: :mod:`._phases` (our phases on the
proto, then Beam's translation phases with ours among them), :mod:`._create`
(a ``beam.Create`` found in the proto, given its native step),
:mod:`._reshuffle` (a Reshuffle a native Create makes needless, dropped),
:mod:`._stages` (each fused stage -> a :class:`PlannedStage` an executor can
run), and :mod:`._test_stream` and :mod:`._io_overrides` (pipeline overrides
applied before the proto is made).
"""
from __future__ import annotations

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import translations

from beam_ext.runner import native
from beam_ext.runner.planning._io_overrides import io_overrides, swap_native_io
from beam_ext.runner.planning._phases import (
    RUNNER_URNS,
    check_flattens,
    check_supported,
    optimize_phases,
    substitute_natives,
)
from beam_ext.runner.planning._reshuffle import drop_reshuffles_after_create
from beam_ext.runner.planning._stages import GroupSpec, NativeSpec, Plan, PlannedStage, SideInputSpec, StagePlanner
from beam_ext.runner.planning._test_stream import TestStreamAsBoundedSource, TestStreamSpec

__all__ = ["GroupSpec", "NativeSpec", "Plan", "PlannedStage", "SideInputSpec",
           "TestStreamAsBoundedSource", "TestStreamSpec", "plan_pipeline", "io_overrides", "swap_native_io"]


def plan_pipeline(proto: beam_runner_api_pb2.Pipeline, bundle_bytes: int,
                  partitions: int, state_backend: str = "memory",
                  state_memory_bytes: int = 256 << 20, is_drain: bool = False,
                  streaming: bool = False, group_memory_bytes: int = 256 << 20,
                  split_after_splittable: bool = True, flattens_write_groupings: bool = True,
                  gather_by_window: bool = True, flattens_in_stage: bool = True,
                  native_reads: bool = True, reads_whole: bool = True, native_creates: bool = True) -> Plan:
    """Plans ``proto`` (modified in place by native substitution).

    ``streaming``: TestStream stays a runner-executed source, and composites
    keep their Beam expansion but for the bounded file reads
    (:data:`~beam_ext.runner.native.STREAMING_READS`) and ``beam.Create``,
    which run Spark-natively in the first micro-batch, a ``Reshuffle`` right
    after a Create dropped as in batch; ``native_reads`` False keeps the
    reads' expansions too, and ``native_creates`` False the Creates' (and
    their Reshuffles), as earlier releases did, for their checkpoints.
    ``split_after_splittable`` (streaming): the steps after a splittable
    ``DoFn`` get a stage of their own (:func:`._phases.split_after_splittable`);
    False plans as releases before it did, for their checkpoints.
    ``flattens_write_groupings`` (streaming): a Flatten read at once by a
    GroupByKey is written to its shuffle by its inputs
    (:func:`._phases.write_flattens_to_their_grouping`, always in batch);
    False plans as releases before 2026-11-30 did, for their checkpoints.
    ``flattens_in_stage`` (streaming): a stage writing several inputs of such
    a Flatten with steps after it runs a Flatten of them itself; False plans
    as earlier releases did, for their checkpoints.
    ``gather_by_window`` (streaming): stages on objects may ship a grouping's
    values gathered per key and windows, without timestamps
    (``GroupSpec.by_window``); False where something reads each element's
    timestamp from the shuffle (``--watermarks=tracker``).
    ``reads_whole`` (streaming): a splittable ``DoFn`` of bounded outputs
    reads each restriction whole in the micro-batch it arrives in, on
    element objects (``PlannedStage.reads_whole``), the steps after it in
    its stage; False where something follows its records
    (``--watermarks=tracker``), and as earlier releases planned, for their
    checkpoints.
    """
    if streaming:
        native_urns = substitute_natives(proto, (native.STREAMING_READS if native_reads else frozenset())
                                         | ({native.CREATE_URN} if native_creates else frozenset()))
    else:
        native_urns = substitute_natives(proto)
    drop_reshuffles_after_create(proto)  # none to drop without a native Create
    runner_urns = RUNNER_URNS | native_urns
    if streaming:
        runner_urns |= {common_urns.primitives.TEST_STREAM.urn}
    check_supported(proto, runner_urns)
    check_flattens(proto)
    context, stages = translations.create_and_optimize_stages(
        proto, phases=optimize_phases(streaming, split_after_splittable, flattens_write_groupings,
                                      flattens_in_stage, split_after_bounded=not reads_whole),
        known_runner_urns=runner_urns, is_drain=is_drain)
    planner = StagePlanner(context, native_urns, bundle_bytes, partitions)
    planner.state = (state_backend, state_memory_bytes)
    planner.group_memory = group_memory_bytes
    planner.streaming = streaming
    planner.gather_by_window = gather_by_window
    planner.reads_whole = reads_whole
    return planner.plan(stages)
