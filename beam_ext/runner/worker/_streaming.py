"""One micro-batch of one stage inside one Spark task, for the streaming executor.

The task is the batch task worker (:mod:`._task`) with what a stage keeps
between micro-batches restored before and saved after: user state, pending
timers and deferred SDF residuals of its partition, versioned by batch in
the job's checkpoint directory (:mod:`beam_ext.runner.state._versioned`).

Order inside a micro-batch is the Python DirectRunner's: new elements are
processed under the watermark the stage had *before* this batch (they were
sent while it held), then timers fire under the new input watermark and the
batch's processing time, until nothing more is due. SDF residuals wait for
the next micro-batch (their requested delay, counted in processing time), so
an unbounded read never loops inside one task.

The task ends by reporting a summary to the driver (through a Spark
accumulator, so no extra pass over the outputs): the partition's watermark
hold, when it next has work (earliest timer, earliest residual), its output
sizes and metrics. The driver needs them to compute output watermarks and
to skip stages with nothing to do.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, Iterator, Mapping

from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp

from beam_ext.runner.state import _versioned as versioned
from beam_ext.runner.state._versioned_spill import PartitionSpillState, open_partition_state, version_files
from beam_ext.runner.worker._direct import DirectChain, decoded_batches, run_direct_chain
from beam_ext.runner.worker._setup import WorkerSetup
from beam_ext.runner.worker._task import StageSpec, _bundles, _TaskWorker

ReportFn = Callable[[int, "TaskSummary"], None]  # (partition, summary) -> sent to the driver


@dataclasses.dataclass(frozen=True)
class BatchContext:
    """What the driver tells every task of one stage in one micro-batch."""

    batch: int
    owner: str  # the stage's key in the checkpoint directory
    state_root: str | None  # None: the stage keeps nothing between batches
    read_version: int | None  # batch whose saved state to restore (None: fresh)
    previous_watermark: Timestamp  # input watermark before this batch: elements run under it
    watermark: Timestamp  # input watermark after this batch: timers fire under it
    processing_time: Timestamp


@dataclasses.dataclass
class TaskSummary:
    """What one task reports besides its outputs and metrics."""

    hold: Timestamp = MAX_TIMESTAMP  # the partition's output watermark hold
    next_event_timer: Timestamp = MAX_TIMESTAMP
    next_processing_timer: Timestamp = MAX_TIMESTAMP
    next_resume: Timestamp = MAX_TIMESTAMP  # earliest deferred residual
    output_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
    metrics: list[bytes] = dataclasses.field(default_factory=list)  # serialized ProcessBundleResponses
    # Every hold of the partition, not only the earliest: --watermarks=tracker
    # reports each one (a hold behind the earliest must not look released).
    holds: frozenset[Timestamp] = frozenset()

    def merge(self, other: TaskSummary) -> TaskSummary:
        bytes_ = dict(self.output_bytes)
        for index, n in other.output_bytes.items():
            bytes_[index] = bytes_.get(index, 0) + n
        return TaskSummary(
            min(self.hold, other.hold), min(self.next_event_timer, other.next_event_timer),
            min(self.next_processing_timer, other.next_processing_timer),
            min(self.next_resume, other.next_resume), bytes_, self.metrics + other.metrics,
            self.holds | other.holds)

    def without_metrics(self) -> TaskSummary:
        """What the driver keeps between batches."""
        return dataclasses.replace(self, output_bytes={}, metrics=[], holds=frozenset())

    def has_due_work(self, watermark: Timestamp, processing_time: Timestamp) -> bool:
        return (self.next_event_timer <= watermark or self.next_processing_timer <= processing_time
                or self.next_resume <= processing_time)


class _StreamingTaskWorker(_TaskWorker):
    """The batch task worker plus state restored from and saved to a version."""

    def restore(self, saved: Mapping[str, Any]) -> None:
        self._state._state.update(saved["state"])
        for family, encoded in saved["timers"].items():
            impl = self._spec.timer_coders[family].get_impl()
            table = self._pending_timers.setdefault(family, {})
            for timer in impl.decode_all(encoded):
                table[(timer.user_key, timer.dynamic_timer_tag, timer.windows[0])] = timer
        self._deferred = list(saved["deferred"])

    def save(self) -> dict[str, Any]:
        timers = {}
        for family, table in self._pending_timers.items():
            if table:
                impl = self._spec.timer_coders[family].get_impl()
                out = create_OutputStream()
                for timer in table.values():
                    impl.encode_to_stream(timer, out, True)
                timers[family] = out.get()
        saved = {"state": {k: list(v) for k, v in self._state._state.items() if v},
                 "timers": timers, "deferred": self._deferred}
        if isinstance(self._state, PartitionSpillState):
            saved["spill"] = self._state.seal()
        return saved

    def defer_residuals(self, now: Timestamp) -> None:
        """Moves this batch's residuals to the deferred list, due after their delay."""
        for reader, roots in self._residuals.items():
            for delayed in roots:
                delay = Duration(micros=delayed.requested_time_delay.ToMicroseconds())
                watermarks = [Timestamp.from_proto(w)
                              for w in delayed.application.output_watermarks.values()]
                self._deferred.append(
                    (reader, delayed.application.SerializeToString(), now + delay,
                     min(watermarks) if watermarks else MIN_TIMESTAMP))
        self._residuals = {}

    def take_due_residuals(self, now: Timestamp) -> dict[str, list[bytes]]:
        due: dict[str, list[bytes]] = {}
        keep = []
        for entry in self._deferred:
            reader, application, resume_at, _ = entry
            if resume_at <= now:
                due.setdefault(reader, []).append(
                    beam_fn_api_pb2.BundleApplication.FromString(application).element)
            else:
                keep.append(entry)
        self._deferred = keep
        return due

    def fire_due(self, watermark: Timestamp, now: Timestamp) -> Iterator[tuple[int, Any]]:
        """Fires timers due under ``watermark`` and ``now`` until none is left."""
        while True:
            timers = self._take_timers(watermark, now)
            if not timers:
                return
            yield from self.run_bundle({}, timers)

    def summary(self) -> TaskSummary:
        summary = TaskSummary()
        for family, table in self._pending_timers.items():
            if not table:
                continue
            fires = min(t.fire_timestamp for t in table.values())
            if family in self._spec.processing_time_timers:
                summary.next_processing_timer = min(summary.next_processing_timer, fires)
            else:
                summary.next_event_timer = min(summary.next_event_timer, fires)
                # A pending event-time timer holds its output timestamp back.
                holds = {t.hold_timestamp for t in table.values()}
                summary.hold = min(summary.hold, min(holds))
                summary.holds |= holds
        for _, _, resume_at, watermark in self._deferred:
            summary.next_resume = min(summary.next_resume, resume_at)
            summary.hold = min(summary.hold, watermark)
            summary.holds |= {watermark}
        return summary


def _counted(outputs: Iterable[tuple[int, Any]], output_bytes: dict[int, int]) -> Iterator[tuple[int, Any]]:
    """Passes a task's ``(output index, chunk or (partition, blob))`` records
    on, adding each output's bytes to ``output_bytes`` (for the summary)."""
    for index, data in outputs:
        if index >= 0:
            size = len(data) if isinstance(data, bytes) else len(data[1])
            output_bytes[index] = output_bytes.get(index, 0) + size
        yield index, data


def run_streaming_partition(spec: StageSpec, side_inputs: Mapping[bytes, bytes] | None,
                            context: BatchContext, report: ReportFn, partition: int,
                            records: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    """Runs ``spec`` over one partition's records of one micro-batch.

    Yields the outputs as :func:`~beam_ext.runner.worker.run_stage_partition`
    does (without its metrics record); the task's :class:`TaskSummary`, its
    metrics included, goes to ``report`` at the end.
    """
    saved = None
    if context.state_root is not None and context.read_version is not None:
        saved = versioned.read(context.state_root, context.owner, partition, context.read_version)
    state = None
    if spec.state_backend == "spill" and context.state_root is not None:
        state = _open_spill(spec, side_inputs or {}, context, partition, saved)
    try:
        worker = _StreamingTaskWorker(spec, side_inputs or {}, state)
    except BaseException:
        if state is not None:
            state.close()
        raise
    worker._deferred = []
    try:
        if saved is not None:
            worker.restore(saved)
        output_bytes: dict[int, int] = {}
        counted = functools.partial(_counted, output_bytes=output_bytes)
        now = context.processing_time
        for bundle in _bundles(spec, records):
            yield from counted(worker.run_bundle(bundle, {}))
        due = worker.take_due_residuals(now)
        if due:
            yield from counted(worker.run_bundle(due, {}))
        yield from counted(worker.fire_due(context.watermark, now))
        worker.defer_residuals(now)
        yield from counted(worker.flush_shuffles())
        if context.state_root is not None:
            versioned.write(context.state_root, context.owner, partition, context.batch, worker.save())
        summary = worker.summary()
        summary.output_bytes = output_bytes
        summary.metrics = [worker.monitoring_infos()]
        report(partition, summary)
        worker.completed = True
    finally:
        worker.close()


def run_streaming_chain(chain: DirectChain, setup: WorkerSetup | None, bundle_bytes: int,
                        side_inputs: list[list[bytes]] | None, report: ReportFn, partition: int,
                        records: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    """Runs a stage that keeps nothing between micro-batches on element
    objects (:mod:`._direct`), as the batch executor runs it.

    Yields what :func:`run_streaming_partition` does: ``(output index,
    encoded chunk)``, or ``(output index, (target partition, blob))`` for a
    GroupByKey's input. Its summary holds no watermark back and names no
    due work; the task's metrics go with it to ``report``.
    """
    batches = decoded_batches(chain.input_coder, bundle_bytes, (chunk for _, chunk in records),
                              bundles=chain.sees_bundles())
    yield from run_chain_on(chain, setup, batches, side_inputs, report, partition)


def run_chain_on(chain: DirectChain, setup: WorkerSetup | None, batches: Iterator[Any],
                 side_inputs: list[list[bytes]] | None, report: ReportFn, partition: int) -> Iterator[tuple[int, Any]]:
    """:func:`run_streaming_chain` over ``batches`` of element objects (and
    :data:`BUNDLE_END` markers, if the chain sees bundles)."""
    metrics: list[bytes] = []
    output_bytes: dict[int, int] = {}
    yield from _counted(run_direct_chain(chain, setup, batches, metrics, side_inputs or (), indexed=True),
                        output_bytes)
    report(partition, TaskSummary(output_bytes=output_bytes, metrics=metrics))


def _open_spill(spec: StageSpec, side_inputs: Mapping[bytes, bytes], context: BatchContext, partition: int,
                saved: Mapping[str, Any] | None) -> PartitionSpillState:
    """The partition's spill state at the committed version the task reads.

    Segments named by another version file on disk are kept too: another
    attempt of this batch may have written one, and the driver may commit
    that attempt's outputs (a speculative copy, a retry racing a slow task).
    """
    root, owner = context.state_root, context.owner
    others = []
    for version in version_files(root, owner, partition):
        if version != context.read_version:
            other = versioned.read(root, owner, partition, version)
            if other is not None:
                others.append(other.get("spill", {}))
    return open_partition_state(side_inputs, root, owner, partition, context.batch,
                                spec.state_memory_bytes, (saved or {}).get("spill", {}), others)
