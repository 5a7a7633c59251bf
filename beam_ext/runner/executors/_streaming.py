"""The streaming executor: the batch plan run in micro-batches, until every watermark is +inf.

Each micro-batch takes what the sources have (the next TestStream event,
the impulse in the first batch, SDF residuals whose delay has passed) and
runs every stage that has work, in topological order, as Spark jobs:

* a stage runs when it has new input, or when a timer or residual of its
  saved state is due under its new input watermark or the batch's
  processing time; the others are skipped and keep their state;
* a GroupByKey runs after a barrier, in tasks of its own
  (:mod:`beam_ext.runner.worker._streaming_group`), so its consumer's input
  watermark includes every key's hold, as in Beam's model; a consumer that
  needs no input watermark (it keeps nothing between batches) and alone
  reads the grouping runs in the grouping's tasks;
* watermarks follow Beam's DirectRunner: a stage's input watermark is the
  minimum of its inputs' output watermarks, its output watermark the
  minimum of that and its holds (pending timers, panes, SDF watermark
  estimators). Stages run in topological order, so one batch carries a
  watermark advance from the sources to the sinks.

After the batch the driver commits its progress (:mod:`._commit_log`);
tasks have already written their state versions. Killing the driver
anywhere replays at most the uncommitted batch, from the committed state.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import logging
import shutil
import tempfile
import threading
import time
from typing import Any

from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2, metrics_pb2
from apache_beam.runners.common import ENCODED_IMPULSE_VALUE
from apache_beam.runners.portability.fn_api_runner.translations import IMPULSE_BUFFER, split_buffer_id
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from beam_ext.runner import native
from beam_ext.runner._element_batches import ElementBatches
from beam_ext.runner._errors import translate_spark_error
from beam_ext.runner._shuffle import ElementSplitter, identity_partition, unpack
from beam_ext.runner.executors._batch import (
    BatchExecutor,
    _drain,
    _encode_partition,
    _keyed_blobs,
    _round_robin,
    _tag,
)
from beam_ext.runner.executors._commit_log import CommitLog, Progress
from beam_ext.runner.executors._side_inputs import SideInputState, side_input_state
from beam_ext.runner.executors._watermarks import make_watermarks
from beam_ext.runner.planning import Plan, PlannedStage
from beam_ext.runner.state import _versioned as versioned
from beam_ext.runner.worker._streaming import (
    BatchContext,
    TaskSummary,
    run_chain_on,
    run_streaming_chain,
    run_streaming_partition,
)
from beam_ext.runner.worker._streaming_group import run_grouped_chain, run_streaming_group

_LOG = logging.getLogger("beam_ext.runner")


def _stage_task(spec, broadcast, context, report, partition, records):
    return run_streaming_partition(spec, broadcast.value if broadcast is not None else None,
                                   context, report, partition, records)


def _chain_task(chain, setup, bundle_bytes: int, broadcast, report, partition, records):
    return run_streaming_chain(chain, setup, bundle_bytes, broadcast.value if broadcast is not None else None,
                               report, partition, records)


def _objects_task(chain, setup, broadcast, report, partition, batches):
    return run_chain_on(chain, setup, batches, broadcast.value if broadcast is not None else None, report, partition)


def _group_task(group, context, previous_output, report, partition, records):
    return run_streaming_group(group, context, previous_output, report, partition,
                               (blob for _, blob in records))


def _grouped_chain_task(group, context, previous_output, group_report, chain, setup, bundle_bytes, broadcast,
                        chain_report, partition, records):
    return run_grouped_chain(group, context, previous_output, group_report, chain, setup, bundle_bytes,
                             broadcast.value if broadcast is not None else None, chain_report, partition,
                             (blob for _, blob in records))


def _keyed_records(splitter: ElementSplitter, partitions: int, index: int, chunks):
    for target, blob in _keyed_blobs(splitter, partitions, chunks):
        yield target, (index, blob)


def _unkeyed_chunk(record):
    # Keyed blobs hold (key, element) pairs; the stage reads the elements.
    index, blob = record
    if not isinstance(blob, bytes):
        return record  # a tracker marker
    return index, b"".join(element for _, element in unpack([blob]))


def fingerprint(plan: Plan, parallelism: int) -> str:
    """What a checkpoint records of the pipeline that wrote it: its stages and parallelism."""
    names = "\n".join(s.name for s in plan.stages)
    digest = hashlib.sha256(names.encode("utf-8")).hexdigest()[:16]
    return f"stages={len(plan.stages)} parallelism={parallelism} digest={digest}"


def _format_watermark(ts: Timestamp) -> str:
    if ts >= MAX_TIMESTAMP:
        return "+inf"
    if ts <= MIN_TIMESTAMP:
        return "-inf"
    return f"{float(ts):.3f}"


class StreamingExecutor(BatchExecutor):
    """Runs a :class:`Plan` in micro-batches until done or stopped.

    ``checkpoint_dir``: where state versions and commits live (a temporary
    directory, deleted when :meth:`run` returns or raises, when None).
    ``batch_interval``: seconds to wait before polling again when a batch
    had nothing to do.
    """

    def __init__(self, sc, plan: Plan, parallelism: int, checkpoint_dir: str | None,
                 batch_interval: float = 0.2, stop: threading.Event | None = None,
                 watermarks: str = "min", tracker_options: dict | None = None) -> None:
        super().__init__(sc, plan, parallelism)
        self._stop = stop or threading.Event()
        self._interval = batch_interval
        self._own_dir = checkpoint_dir is None
        root = checkpoint_dir or tempfile.mkdtemp(prefix="beam_ext-streaming-")
        self._log = CommitLog(root, self._fingerprint())
        self._producers: dict[bytes, list[int]] = {}
        for number, stage in enumerate(plan.stages):
            for buffer_id in stage.outputs:
                self._producers.setdefault(buffer_id, []).append(number)
        self._group_owner = {buffer_id: f"group{n}" for n, buffer_id in enumerate(sorted(plan.groups))}
        self._upstream = self._upstream_owners()
        self._uses_test_clock = any(s.test_stream is not None for s in plan.stages)
        self.progress = Progress()
        self._lock = threading.Lock()
        self._empties: dict[int, Any] = {}
        self._watermarks = make_watermarks(watermarks, self._sc, plan, parallelism, self._producers,
                                           self._group_owner, tracker_options)
        self._fused = self._fused_readers()

    def _fused_readers(self) -> dict[bytes, int]:
        """The groupings whose panes their reader's steps take in the group's
        own task, by buffer: the reader's stage number.

        A grouping qualifies when one stage reads it, as its one main input,
        and that stage runs steps on element objects that keep nothing
        between batches: such a stage's tasks need no input watermark, so
        running it inside the group's tasks changes nothing but the encoding
        and persisting of the panes between them. Its side inputs (bounded,
        complete before it runs) are listed before the group runs, as they
        are before the stage runs. The tracker's watermarks follow each
        buffer's records, so with it every grouping keeps its output.
        """
        if self._watermarks.mode != "min":
            return {}
        numbers = {id(stage): number for number, stage in enumerate(self._plan.stages)}
        fused = {}
        for buffer_id in self._group_owner:
            stage = self._only_reader(buffer_id)
            if (stage is not None and stage.direct is not None and stage.native is None
                    and not stage.keeps_state and not stage.spread):
                fused[buffer_id] = numbers[id(stage)]
        return fused

    def _upstream_owners(self) -> dict[str, frozenset[str]]:
        """Every stage's and group's upstream stages and groups (through main
        and side inputs): the only ones whose holds its input watermark reads."""
        def producers_of(buffer_id: bytes) -> list[str]:
            return [f"stage{n}" for n in self._producers.get(buffer_id, ())]

        def owners_of(buffer_id: bytes) -> list[str]:
            if buffer_id in self._group_owner:
                return [self._group_owner[buffer_id]]
            return producers_of(buffer_id)

        direct = {owner: producers_of(buffer_id) for buffer_id, owner in self._group_owner.items()}
        for number, stage in enumerate(self._plan.stages):
            direct[f"stage{number}"] = [owner for b in (*stage.inputs, *(s.buffer for s in stage.side_inputs))
                                        for owner in owners_of(b)]
        upstream: dict[str, frozenset[str]] = {}

        def visit(owner: str) -> frozenset[str]:
            if owner not in upstream:
                upstream[owner] = frozenset()  # a cycle is impossible; this stops one anyway
                found: set[str] = set()
                for producer in direct.get(owner, ()):
                    found.add(producer)
                    found |= visit(producer)
                upstream[owner] = frozenset(found)
            return upstream[owner]

        for owner in direct:
            visit(owner)
        return upstream

    def _fingerprint(self) -> str:
        return fingerprint(self._plan, self._parallelism)

    @property
    def watermark_stats(self) -> dict:
        """Counters of the watermark source (``--watermarks``): lag, messages."""
        return self._watermarks.stats()

    # -- the loop ----------------------------------------------------------
    def run(self) -> None:
        try:
            restored = self._log.latest()
            if restored is not None:
                self.progress = restored
                _LOG.info("resuming after committed batch %d from %s", restored.batch, self._log.root)
                self._keep_restrictions_in_state(restored)
            self._watermarks.start(self.progress)
            with self._lock:
                self.monitoring = {
                    stage: [metrics_pb2.MonitoringInfo.FromString(b) for b in infos]
                    for stage, infos in self.progress.monitoring.items()}
            while not self._stop.is_set() and not self.done():
                start = time.monotonic()
                worked = self._run_batch()
                if not worked:
                    self._stop.wait(self._idle_wait())
                else:
                    _LOG.debug("batch took %.3fs", time.monotonic() - start)
        finally:
            self._sc.setJobDescription(None)
            self._release()
            self._watermarks.stop()
            if self._own_dir:
                # Stopped, cancelled or failed alike: no restart can resume
                # from a directory nobody named, so keeping it only fills the disk.
                shutil.rmtree(self._log.root, ignore_errors=True)

    def _keep_restrictions_in_state(self, progress: Progress) -> None:
        """A checkpoint of an earlier release may hold what a bounded
        splittable ``DoFn`` deferred (its residuals, its watermark hold),
        which a stage reading restrictions whole would never resume: such a
        stage runs as it did then, on Beam's bundle processor with its state."""
        for number, stage in enumerate(self._plan.stages):
            summary = progress.summaries.get(f"stage{number}")
            if stage.reads_whole and summary is not None and (
                    summary.next_resume < MAX_TIMESTAMP or summary.hold < MAX_TIMESTAMP):
                _LOG.info("stage %s resumes the restrictions its checkpoint holds", stage.label)
                stage.reads_whole, stage.direct = False, None

    def stop(self) -> None:
        """Asks the loop to stop after the micro-batch under way."""
        self._stop.set()

    def done(self) -> bool:
        """Whether every source is exhausted and every watermark is +inf."""
        progress = self.progress
        if not progress.impulse_done:
            return False
        owners = [f"stage{n}" for n in range(len(self._plan.stages))] + list(self._group_owner.values())
        return all(progress.output_watermark(owner) >= MAX_TIMESTAMP for owner in owners)

    def _now(self, progress: Progress) -> Timestamp:
        if self._uses_test_clock:
            # Beam's TestClock starts at 0 and moves only with the TestStream.
            return progress.test_clock if progress.test_clock is not None else Timestamp(0)
        return Timestamp.now()

    def _idle_wait(self) -> float:
        if self._uses_test_clock:
            return 0.0
        now = Timestamp.now()
        due = min((min(s.next_processing_timer, s.next_resume) for s in self.progress.summaries.values()),
                  default=MAX_TIMESTAMP)
        if due >= MAX_TIMESTAMP:
            return self._interval
        return max(0.0, min(self._interval, float(due - now)))

    def _release(self) -> None:
        for rdd in self._persisted:
            rdd.unpersist()
        self._persisted = []
        self._buffers = {}
        self._values = {}
        self._grouped = {}
        self._buffer_owners = {}
        self._side_chunks = {}

    # -- one micro-batch ---------------------------------------------------
    def _run_batch(self) -> bool:
        progress = self.progress.successor()
        batch = progress.batch
        progress.monitoring = {}
        self._batch_progress = progress
        self._pending: list[_Pending] = []
        self._reached: list[tuple[str, tuple[bytes, ...]]] = []  # (owner, input buffers), in order
        self._buffer_owners: dict[bytes, list[str]] = {}
        self._reports.value = {}
        self._ran = 0
        self._input_count = 0
        start = time.monotonic()
        if self._uses_test_clock:
            self._advance_test_streams(progress)
        now = self._now(progress)
        try:
            for number, stage in enumerate(self._plan.stages):
                if stage.test_stream is not None:
                    continue  # its output was emitted by _advance_test_streams
                self._sc.setJobDescription(
                    f"beam_ext batch {batch}: {stage.label}")
                self._run_streaming_stage(number, stage, progress, now)
            self._settle(progress)
            self._keep_complete_side_inputs(progress)
            if not self._uses_test_clock and self._ran == 0 and progress.impulse_done:
                return False  # nothing ran and no source moved: nothing to commit
            progress.impulse_done = True
            progress.monitoring = {stage: [info.SerializeToString() for info in infos]
                                   for stage, infos in self.monitoring.items()}
            self._log.commit(progress)
            for owner, version in progress.state_versions.items():
                if self.progress.state_versions.get(owner) != version:
                    versioned.prune(self._log.state_root, owner, {version})
            self.progress = progress
        finally:
            self._release()
        worked = self._ran > 0 or self._input_count > 0
        if worked:
            self._log_batch(batch, progress, time.monotonic() - start)
        if self._uses_test_clock and not worked and self._test_streams_exhausted() and not self.done():
            held = [owner for owner, mark in progress.output_watermarks.items() if mark < MAX_TIMESTAMP]
            raise RuntimeError(
                "the pipeline's TestStreams are exhausted but watermarks are still held "
                f"({', '.join(held)}) with nothing left to run: a processing-time timer or "
                "trigger waits for processing time the TestStream never advances to")
        return worked or self._uses_test_clock

    def _test_streams_exhausted(self) -> bool:
        # Past the last event, each TestStream still takes one batch to move its outputs to +inf.
        progress = self.progress
        return all(progress.test_stream_positions.get(n, 0) >= len(s.test_stream.events)
                   and all(progress.source_watermarks.get((n, i), MIN_TIMESTAMP) >= MAX_TIMESTAMP
                           for i in s.test_stream.outputs)
                   for n, s in enumerate(self._plan.stages) if s.test_stream is not None)

    def _log_batch(self, batch: int, progress: Progress, seconds: float) -> None:
        marks = " ".join(
            f"{(stage.steps or (stage.name,))[0]}="
            f"{_format_watermark(progress.input_watermark(f'stage{n}'))}"
            for n, stage in enumerate(self._plan.stages) if stage.test_stream is None)
        lag = ""
        if not self._uses_test_clock:
            lowest = min((progress.input_watermark(f"stage{n}") for n in range(len(self._plan.stages))),
                         default=MAX_TIMESTAMP)
            if MIN_TIMESTAMP < lowest < MAX_TIMESTAMP:
                lag = f", lag {float(Timestamp.now() - lowest):.2f}s"
        _LOG.info("batch %d: %d stage runs, %d source elements in %.2fs%s; input watermarks: %s",
                  batch, self._ran, self._input_count, seconds, lag, marks)

    # -- sources -----------------------------------------------------------
    def _advance_test_streams(self, progress: Progress) -> None:
        for number, stage in enumerate(self._plan.stages):
            spec = stage.test_stream
            if spec is None:
                continue
            position = progress.test_stream_positions.get(number, 0)
            owner = f"stage{number}"
            if position >= len(spec.events):
                # Beam's TestStream ends by advancing every output to +inf.
                for index in spec.outputs:
                    progress.source_watermarks[(number, index)] = MAX_TIMESTAMP
            else:
                kind, index, value = spec.events[position]
                progress.test_stream_positions[number] = position + 1
                if kind == "elements":
                    records = self._watermarks.source_records(number, stage.outputs[index], value, progress)
                    self._write_from(owner, stage.outputs[index], self._sc.parallelize(records, 1))
                    self._input_count += spec.counts.get(position, 0)
                elif kind == "watermark":
                    progress.source_watermarks[(number, index)] = max(
                        progress.source_watermarks.get((number, index), MIN_TIMESTAMP), value)
                else:
                    progress.test_clock = (progress.test_clock or Timestamp(0)) + value
            watermark = min((progress.source_watermarks.get((number, i), MIN_TIMESTAMP)
                             for i in spec.outputs), default=MAX_TIMESTAMP)
            progress.input_watermarks[owner] = watermark
            progress.output_watermarks[owner] = watermark

    # -- watermarks --------------------------------------------------------
    def _buffer_watermark(self, buffer_id: bytes, progress: Progress) -> Timestamp:
        if buffer_id == IMPULSE_BUFFER:
            return MAX_TIMESTAMP  # the impulse is emitted in the first batch, then done
        if buffer_id in self._group_owner:
            return progress.output_watermark(self._group_owner[buffer_id])
        return self._produced_watermark(buffer_id, progress)

    def _produced_watermark(self, buffer_id: bytes, progress: Progress) -> Timestamp:
        marks = []
        for number in self._producers.get(buffer_id, ()):
            stage = self._plan.stages[number]
            if stage.test_stream is not None and buffer_id in stage.outputs:
                index = stage.outputs.index(buffer_id)
                marks.append(progress.source_watermarks.get((number, index), MIN_TIMESTAMP))
            else:
                marks.append(progress.output_watermark(f"stage{number}"))
        return min(marks, default=MAX_TIMESTAMP)

    def _input_watermark(self, owner: str, inputs: tuple[bytes, ...], progress: Progress) -> Timestamp:
        if owner.startswith("group"):
            mark = self._produced_watermark(inputs[0], progress)
        else:
            mark = min((self._buffer_watermark(b, progress) for b in inputs), default=MAX_TIMESTAMP)
        mark = self._watermarks.input_watermark(owner, mark, progress)
        return max(mark, self.progress.input_watermark(owner))  # watermarks never go back

    def _settle(self, progress: Progress, force: bool = True) -> None:
        """Runs every stage launched lazily so far (unless not ``force``), then
        brings the watermarks of the stages reached in this batch up to date,
        in topological order."""
        if force:
            self._force(progress)
        for owner, inputs in self._reached:
            mark = self._input_watermark(owner, inputs, progress)
            progress.input_watermarks[owner] = mark
            hold = progress.summaries.get(owner, TaskSummary()).hold
            progress.output_watermarks[owner] = min(mark, hold)

    def _barrier(self, progress: Progress, owner: str) -> None:
        """Brings the watermarks up to date before ``owner``, a stage whose
        tasks need their input watermark (timers, panes, side inputs).

        Stages launched lazily run first only when one of them may hold its
        watermark (``MinWatermarks.holds``) and is upstream of ``owner``:
        a stage without state, or a ``Reshuffle``'s grouping, holds nothing,
        so its output watermark is its input watermark whether it has run or
        not, and running it in the same Spark job as its consumer saves a job
        per micro-batch; a stage on another branch (another source's
        grouping) does not reach ``owner``'s input watermark at all. A
        pending stage's watermark is brought up to date when it runs, before
        any stage downstream of it runs.
        """
        upstream = self._upstream[owner]
        force = self._watermarks.needs_producers_run or any(
            p.owner in upstream and self._watermarks.holds(p.owner) for p in self._pending)
        self._settle(progress, force)

    def _force(self, progress: Progress) -> None:
        """One Spark job computes every pending stage (their outputs are persisted)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        steps = tuple(dict.fromkeys(step for p in pending for step in p.steps))
        # A pending stage another pending stage reads is computed (and kept,
        # its RDD is persisted) by that reader's tasks: draining only the
        # stages nobody reads runs each partition once, in fewer tasks.
        read = {owner for p in pending for owner in p.reads}
        leaves = [p.rdd for p in pending if p.owner not in read]
        started = time.monotonic()
        with translate_spark_error(steps):
            (leaves[0] if len(leaves) == 1 else self._sc.union(leaves)).foreachPartition(_drain)
        _LOG.debug("batch %d: one Spark job ran %s in %.3fs", progress.batch,
                   "; ".join("+".join(p.steps) or p.name for p in pending), time.monotonic() - started)
        reports = self._reports.value
        for p in pending:
            summary = TaskSummary()
            for (batch, owner, _), reported in reports.items():
                if batch == progress.batch and owner == p.owner:
                    summary = summary.merge(reported)
            if summary.metrics:
                self._merge_metrics(p.name, summary.metrics)
                self._input_count += _element_count(summary.metrics, p.source_pcolls)
            progress.summaries[p.owner] = summary.without_metrics()
            # Outputs nobody wrote to are dropped, so consumers skip them.
            for index, buffer_id in p.outputs.items():
                if not summary.output_bytes.get(index):
                    self._drop_output(buffer_id, p.owner)

    def _drop_output(self, buffer_id: bytes, owner: str) -> None:
        owners = self._buffer_owners.get(buffer_id, [])
        if owner not in owners:
            return
        position = owners.index(owner)
        owners.pop(position)
        if buffer_id in self._group_owner and buffer_id in self._grouped:
            del self._grouped[buffer_id]
        else:
            self._buffers[buffer_id].pop(position)

    # -- stages ------------------------------------------------------------
    def _read(self, buffer_id: bytes):
        if buffer_id == IMPULSE_BUFFER:
            if self._batch_progress.impulse_done:
                return self._empty(1)
            return self._sc.parallelize([ENCODED_IMPULSE_VALUE] + self._watermarks.impulse_records(), 1)
        if buffer_id in self._group_owner:
            return self._grouped.get(buffer_id) or self._empty(1)
        return super()._read(buffer_id)

    def _empty(self, partitions: int):
        """An RDD of ``partitions`` empty partitions, made once: a micro-batch
        reads several, and each ``parallelize`` writes a file for the JVM."""
        rdd = self._empties.get(partitions)
        if rdd is None:
            rdd = self._empties[partitions] = self._sc.parallelize([], partitions)
        return rdd

    def _write_from(self, owner: str, buffer_id: bytes, rdd) -> None:
        self._buffers.setdefault(buffer_id, []).append(rdd)
        self._buffer_owners.setdefault(buffer_id, []).append(owner)

    def _has_input(self, buffer_id: bytes) -> bool:
        if buffer_id == IMPULSE_BUFFER:
            return not self._batch_progress.impulse_done
        if buffer_id in self._group_owner:
            return buffer_id in self._grouped
        return bool(self._buffers.get(buffer_id)) or buffer_id in self._values

    def _run_streaming_stage(self, number: int, stage: PlannedStage, progress: Progress,
                             now: Timestamp) -> None:
        owner = f"stage{number}"
        # Side inputs a checkpoint of an earlier release kept as Fn API state
        # are read by Beam's bundle processor, as they were then.
        if (stage.inputs and self._fused.get(stage.inputs[0]) == number
                and not isinstance(progress.side_inputs.get(number), dict)):
            self._run_group(stage.inputs[0], progress, now, reader=number)
            return
        for buffer_id in stage.inputs:
            if buffer_id in self._group_owner and buffer_id not in self._grouped:
                self._run_group(buffer_id, progress, now)
        has_input = any(self._has_input(b) for b in stage.inputs)
        barrier = stage.keeps_state or bool(stage.side_inputs)
        if barrier:
            self._barrier(progress, owner)
            has_input = any(self._has_input(b) for b in stage.inputs)
        self._reached.append((owner, tuple(stage.inputs)))
        watermark = self._input_watermark(owner, tuple(stage.inputs), progress)
        summary = progress.summaries.get(owner, TaskSummary())
        if not has_input and not (stage.keeps_state and summary.has_due_work(watermark, now)):
            return
        if stage.native is not None:
            self._run_native_read(owner, stage)
            return
        broadcast = self._streaming_side_inputs(number, stage, progress)
        context = BatchContext(
            batch=progress.batch, owner=owner,
            state_root=self._log.state_root if stage.keeps_state else None,
            read_version=progress.state_versions.get(owner),
            previous_watermark=self.progress.input_watermark(owner),
            watermark=watermark, processing_time=now)
        reads = self._owners_read(stage.inputs)
        # Side inputs a checkpoint of an earlier release kept as Fn API state
        # are read by Beam's bundle processor, as they were then.
        on_objects = stage.direct is not None and not isinstance(progress.side_inputs.get(number), dict)
        handed = self._values.get(stage.inputs[0]) if on_objects else None
        if handed is not None:  # a native read's batches of objects
            records = handed.rdd
            task = functools.partial(_objects_task, stage.direct, stage.spec.worker_setup, broadcast)
        else:
            records = self._streaming_input(stage, owner, progress)
            if on_objects:
                _LOG.debug("stage %s runs its steps on element objects", stage.label)
                task = functools.partial(_chain_task, stage.direct, stage.spec.worker_setup,
                                         stage.spec.bundle_bytes, broadcast)
            else:
                task = functools.partial(_stage_task, stage.spec, broadcast, context)
        out = records.mapPartitionsWithIndex(self._watermarks.task(
            owner, task, self._reporter(progress.batch, owner), progress))
        self._launch(_Pending(owner, stage.name, out, stage.steps,
                              {i: b for i, b in enumerate(stage.outputs)}, stage.source_pcolls, reads))
        if stage.keeps_state:
            progress.state_versions[owner] = progress.batch
        for index, buffer_id in enumerate(stage.outputs):
            self._write_from(owner, buffer_id, out.filter(lambda r, i=index: r[0] == i).values())

    def _run_native_read(self, owner: str, stage: PlannedStage) -> None:
        """A bounded source of :data:`native.STREAMING_SOURCES` (a read, a Create), in the batch
        that has the impulse: its RDD is computed by its readers' tasks.

        It holds nothing back: its input is the impulse, whose watermark is
        +inf, so its elements (at Beam's minimum timestamp) reach the stages
        after it under the watermark they had before the batch, as an SDF
        read that finishes in its first batch leaves them. A stage on
        element objects that alone reads it takes its batches of objects,
        as in batch, never encoded (:meth:`_objects_read`).
        """
        from pyspark import StorageLevel

        spec = stage.native
        if spec.urn not in native.STREAMING_SOURCES:  # planning substitutes no other in streaming
            raise NotImplementedError(f"stage {stage.name!r} is Spark-native; streaming runs Beam expansions")
        context = native.NativeContext(sc=self._sc, parallelism=self._parallelism, step_name=spec.step_name,
                                       counter=_no_counter)
        with translate_spark_error(stage.steps):  # listing the files may fail, naming the step
            out = native.lookup_native(spec.urn)(spec.payload, self._read(stage.inputs[0]), context)
        if isinstance(out, native.ArrowRows):
            out = out.batches()
        self._ran += 1
        [buffer_id] = stage.outputs  # planning substitutes reads of one output
        if self._objects_read(buffer_id) and self._only_reader(buffer_id).direct is not None:
            self._values[buffer_id] = out if isinstance(out, ElementBatches) else ElementBatches.of(out)
            self._buffer_owners.setdefault(buffer_id, []).append(owner)
            return
        if isinstance(out, ElementBatches):
            out = out.elements()
        out = out.mapPartitions(functools.partial(_encode_partition, spec.output_coder))
        if self._readers.get(buffer_id, 0) > 1:
            out.persist(StorageLevel.MEMORY_AND_DISK)  # computed once, by the first reader's job
            self._persisted.append(out)
        self._write_from(owner, buffer_id, out)

    def _owners_read(self, buffers) -> frozenset[str]:
        """The owners whose outputs a stage reading ``buffers`` reads in this batch."""
        return frozenset(owner for b in buffers if self._has_input(b) for owner in self._buffer_owners.get(b, ()))

    def _launch(self, pending: _Pending) -> None:
        from pyspark import StorageLevel

        if not pending.rdd.is_cached:  # a grouping and its reader share one
            pending.rdd.persist(StorageLevel.MEMORY_AND_DISK)
            self._persisted.append(pending.rdd)
        self._pending.append(pending)
        self._ran += 1

    def _reporter(self, batch: int, owner: str):
        accumulator = self._reports
        return functools.partial(_report, accumulator, batch, owner)

    def _merge_metrics(self, stage_name: str, serialized: list[bytes]) -> None:
        infos = itertools.chain(
            self.monitoring.get(stage_name, []),
            itertools.chain.from_iterable(
                beam_fn_api_pb2.ProcessBundleResponse.FromString(s).monitoring_infos for s in serialized))
        merged = list(monitoring_infos.consolidate(infos))
        with self._lock:
            self.monitoring = {**self.monitoring, stage_name: merged}

    def _streaming_input(self, stage: PlannedStage, owner: str, progress: Progress):
        """The stage's records; for a stage with state, exactly one partition
        per state partition; a splittable ``DoFn``'s restrictions spread over
        them."""
        if not stage.keeps_state and not stage.spread:
            parts = [_tag(i, self._read(b)) for i, b in enumerate(stage.inputs) if self._has_input(b)]
            if not parts:
                return self._empty(1)
            return parts[0] if len(parts) == 1 else self._sc.union(parts)
        parts = []
        for i, buffer_id in enumerate(stage.inputs):
            if not self._has_input(buffer_id):
                continue
            splitter = ElementSplitter(stage.input_coders[i])
            rdd = self._read(buffer_id)
            if stage.keyed:
                parts.append(rdd.mapPartitionsWithIndex(self._watermarks.shuffle_side(
                    owner, functools.partial(_keyed_records, splitter, self._parallelism, i),
                    stage.input_coders[i], True, progress)))
            else:
                # A bounded read's few restrictions are split to fill the tasks, as in batch.
                parts.append(rdd.mapPartitionsWithIndex(self._watermarks.shuffle_side(
                    owner, functools.partial(_round_robin, splitter, i, self._parallelism, sdf_info=stage.sdf_info),
                    stage.input_coders[i], False, progress)))
        # Without input this batch (timers due), the state's partitions still run.
        blobs = self._sc.union(parts) if len(parts) > 1 else (parts[0] if parts else self._empty(1))
        records = blobs.partitionBy(self._parallelism, identity_partition).values()
        return records.map(_unkeyed_chunk) if stage.keyed else records

    def _streaming_side_inputs(self, number: int, stage: PlannedStage, progress: Progress):
        if not stage.side_inputs:
            return None
        state = self._side_input_state(number, stage, progress)
        broadcast = self._sc.broadcast(state if isinstance(state, list) else SideInputState.sealed(state))
        self._broadcasts.append(broadcast)
        return broadcast

    def _keep_complete_side_inputs(self, progress: Progress) -> None:
        """Stores the side inputs that completed in this batch, before its buffers are released.

        A stage may first run batches after its bounded side inputs were
        written (a TestStream's elements come later than the impulse).
        """
        for number, stage in enumerate(self._plan.stages):
            if stage.side_inputs and number not in progress.side_inputs and all(
                    self._produced_watermark(spec.buffer, progress) >= MAX_TIMESTAMP
                    for spec in stage.side_inputs):
                self._side_input_state(number, stage, progress)

    def _side_input_state(self, number: int, stage: PlannedStage, progress: Progress) -> dict | list:
        """The stage's side inputs, once they are complete: the encoded chunks
        of each, by index, for a stage on element objects; the Fn API state
        entries of all, for Beam's bundle processor."""
        state = progress.side_inputs.get(number)
        if state is None:
            for spec in stage.side_inputs:
                if self._produced_watermark(spec.buffer, progress) < MAX_TIMESTAMP:
                    raise NotImplementedError(
                        f"SparkRunner streaming: the side input {spec.tag!r} of {stage.steps[0]!r} "
                        "comes from an unbounded PCollection; side inputs must be bounded for now")
            self._collect_side_inputs(stage)
            state = [] if stage.direct is not None else {}
            for spec in stage.side_inputs:
                chunks = self._side_chunks[spec.buffer]
                if stage.direct is not None:
                    state.append(chunks)
                else:
                    state.update(side_input_state(spec, chunks))
            progress.side_inputs[number] = state
        return state

    def _collect_side_inputs(self, stage: PlannedStage) -> None:
        """Lists the stage's complete side inputs not listed yet, in one Spark job.

        One read by several stages (a write's initialization, read by its
        three steps) is collected once in the batch that completes it; each
        stage keeps its side inputs' state from then on.
        """
        wanted = list(dict.fromkeys(
            spec.buffer for spec in stage.side_inputs
            if spec.buffer not in self._side_chunks and self._has_input(spec.buffer)))
        if wanted:
            lists = self._collect_buffers(wanted, translate_spark_error(stage.steps))
            self._side_chunks.update(
                (buffer, [c for c in chunks if isinstance(c, bytes)])  # without tracker markers
                for buffer, chunks in zip(wanted, lists))
        for spec in stage.side_inputs:
            self._side_chunks.setdefault(spec.buffer, [])

    # -- GroupByKey --------------------------------------------------------
    def _run_group(self, buffer_id: bytes, progress: Progress, now: Timestamp, reader: int | None = None) -> None:
        """Runs the grouping of ``buffer_id`` in this batch, if it has input or
        due timers; with ``reader`` (:meth:`_fused_readers`), that stage's
        steps too, in the same tasks."""
        owner = self._group_owner[buffer_id]
        if reader is not None and self._plan.stages[reader].side_inputs:
            self._barrier(progress, f"stage{reader}")  # whether its side inputs are complete
        self._barrier(progress, owner)  # its tasks need the input watermark
        self._reached.append((owner, (buffer_id,)))
        if reader is not None:
            self._reached.append((f"stage{reader}", (buffer_id,)))
        watermark = self._input_watermark(owner, (buffer_id,), progress)
        summary = progress.summaries.get(owner, TaskSummary())
        has_input = bool(self._buffers.get(buffer_id))
        if not has_input and not summary.has_due_work(watermark, now):
            return
        if has_input:
            parts = self._buffers[buffer_id]
            blobs = (self._sc.union(parts) if len(parts) > 1 else parts[0]).partitionBy(
                self._parallelism, identity_partition)
        else:
            # Only timers are due (a watermark moved): the group's partitions
            # run without a shuffle, a Spark job of one stage instead of two.
            blobs = self._empty(self._parallelism)
        context = BatchContext(
            batch=progress.batch, owner=owner, state_root=self._log.state_root,
            read_version=progress.state_versions.get(owner),
            previous_watermark=self.progress.input_watermark(owner),
            watermark=watermark, processing_time=now)
        group = self._plan.groups[buffer_id]
        gbk = split_buffer_id(buffer_id)[1]
        # Logs and errors name the user's step; the transform id keys the
        # stage's metrics, in checkpoints too.
        reads = frozenset(self._buffer_owners.get(buffer_id, ()) if has_input else ())
        progress.state_versions[owner] = progress.batch
        if reader is None:
            out = blobs.mapPartitionsWithIndex(self._watermarks.task(
                owner, functools.partial(_group_task, group, context, self.progress.output_watermark(owner)),
                self._reporter(progress.batch, owner), progress))
            self._launch(_Pending(owner, f"GroupByKey {gbk}", out, (group.step,), {0: buffer_id}, reads=reads))
            self._grouped[buffer_id] = out
            self._buffer_owners[buffer_id] = [owner]
            return
        stage, stage_owner = self._plan.stages[reader], f"stage{reader}"
        _LOG.debug("stage %s runs in the tasks of the grouping it reads, %s", stage.label, group.step)
        broadcast = self._streaming_side_inputs(reader, stage, progress)
        out = blobs.mapPartitionsWithIndex(functools.partial(
            _grouped_chain_task, group, context, self.progress.output_watermark(owner),
            self._reporter(progress.batch, owner), stage.direct, stage.spec.worker_setup, stage.spec.bundle_bytes,
            broadcast, self._reporter(progress.batch, stage_owner)))
        # Two owners, one RDD: the grouping writes no output of its own, and
        # its reader's pending entry (which reads it) drains them both.
        self._launch(_Pending(owner, f"GroupByKey {gbk}", out, (group.step,), {}, reads=reads))
        self._launch(_Pending(stage_owner, stage.name, out, stage.steps,
                              dict(enumerate(stage.outputs)), stage.source_pcolls, frozenset({owner})))
        for index, output in enumerate(stage.outputs):
            self._write_from(stage_owner, output, out.filter(lambda r, i=index: r[0] == i).values())


@dataclasses.dataclass
class _Pending:
    """A stage launched lazily: its RDD is computed by the next :meth:`_force`."""

    owner: str
    name: str
    rdd: Any
    steps: tuple[str, ...]
    outputs: dict[int, bytes]  # output index -> buffer
    source_pcolls: tuple[str, ...] = ()
    reads: frozenset[str] = frozenset()  # owners of the inputs it reads in this batch


def _no_counter(namespace: str, name: str):
    raise NotImplementedError(f"streaming SparkRunner keeps no counters of native reads ({namespace}:{name})")


def _element_count(serialized: list[bytes], pcolls: tuple[str, ...]) -> int:
    """Elements the tasks' metrics count on ``pcolls`` (Beam's data-channel element counts)."""
    if not pcolls:
        return 0
    total = 0
    for blob in serialized:
        for info in beam_fn_api_pb2.ProcessBundleResponse.FromString(blob).monitoring_infos:
            if (info.urn == monitoring_infos.ELEMENT_COUNT_URN
                    and info.labels.get(monitoring_infos.PCOLLECTION_LABEL) in pcolls):
                total += monitoring_infos.extract_counter_value(info)
    return total


def _report(accumulator, batch: int, owner: str, partition: int, summary: TaskSummary) -> None:
    # Keyed by task: a recomputed partition replaces its report instead of adding to it.
    accumulator.add({(batch, owner, partition): summary})
