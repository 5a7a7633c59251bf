"""The streaming executor: the batch plan run in micro-batches, until every watermark is +inf.

Each micro-batch takes what the sources have (the next TestStream event,
the impulse in the first batch, SDF residuals whose delay has passed) and
runs every stage that has work, in topological order, as Spark jobs:

* a stage runs when it has new input, or when a timer or residual of its
  saved state is due under its new input watermark or the batch's
  processing time; the others are skipped and keep their state;
* a GroupByKey runs as its own job between its producers and its consumer
  (:mod:`beam_ext.runner.worker._streaming_group`), so the consumer's input
  watermark includes every key's hold, as in Beam's model;
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

import functools
import hashlib
import itertools
import logging
import shutil
import tempfile
import threading
import time

from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2, metrics_pb2
from apache_beam.runners.common import ENCODED_IMPULSE_VALUE
from apache_beam.runners.portability.fn_api_runner.translations import IMPULSE_BUFFER, split_buffer_id
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from beam_ext.runner._errors import translate_spark_error
from beam_ext.runner._shuffle import ElementSplitter, identity_partition, unpack
from beam_ext.runner.executors._batch import BatchExecutor, _keyed_blobs, _round_robin, _tag
from beam_ext.runner.executors._commit_log import CommitLog, Progress
from beam_ext.runner.executors._side_inputs import side_input_state
from beam_ext.runner.planning import Plan, PlannedStage
from beam_ext.runner.state import _versioned as versioned
from beam_ext.runner.worker import METRICS_OUTPUT
from beam_ext.runner.worker._streaming import SUMMARY_OUTPUT, BatchContext, TaskSummary, run_streaming_partition
from beam_ext.runner.worker._streaming_group import run_streaming_group

_LOG = logging.getLogger("beam_ext.runner")


def _stage_task(spec, broadcast, context, partition, records):
    return run_streaming_partition(spec, broadcast.value if broadcast is not None else None,
                                   context, partition, records)


def _group_task(group, context, previous_output, partition, records):
    return run_streaming_group(group, context, previous_output, partition,
                               (blob for _, blob in records))


def _keyed_records(splitter: ElementSplitter, partitions: int, index: int, chunks):
    for target, blob in _keyed_blobs(splitter, partitions, chunks):
        yield target, (index, blob)


def _unkeyed_chunk(record):
    # Keyed blobs hold (key, element) pairs; the stage reads the elements.
    index, blob = record
    return index, b"".join(element for _, element in unpack([blob]))


def _format_watermark(ts: Timestamp) -> str:
    if ts >= MAX_TIMESTAMP:
        return "+inf"
    if ts <= MIN_TIMESTAMP:
        return "-inf"
    return f"{float(ts):.3f}"


class StreamingExecutor(BatchExecutor):
    """Runs a :class:`Plan` in micro-batches until done or stopped.

    ``checkpoint_dir``: where state versions and commits live (a temporary
    directory, deleted at the end, when None). ``batch_interval``: seconds
    to wait before polling again when a batch had nothing to do.
    """

    def __init__(self, spark, plan: Plan, parallelism: int, checkpoint_dir: str | None,
                 batch_interval: float = 0.2, stop: threading.Event | None = None) -> None:
        super().__init__(spark, plan, parallelism)
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
        self._uses_test_clock = any(s.test_stream is not None for s in plan.stages)
        self.progress = Progress()
        self._lock = threading.Lock()

    def _fingerprint(self) -> str:
        names = "\n".join(s.name for s in self._plan.stages)
        digest = hashlib.sha256(names.encode("utf-8")).hexdigest()[:16]
        return f"stages={len(self._plan.stages)} parallelism={self._parallelism} digest={digest}"

    # -- the loop ----------------------------------------------------------
    def run(self) -> None:
        try:
            restored = self._log.latest()
            if restored is not None:
                self.progress = restored
                _LOG.info("resuming after committed batch %d from %s", restored.batch, self._log.root)
            with self._lock:
                self.monitoring = {
                    stage: [metrics_pb2.MonitoringInfo.FromString(b) for b in infos]
                    for stage, infos in self.progress.monitoring.items()}
            while not self._stop.is_set() and not self.done():
                start = time.monotonic()
                worked = self._run_batch(self.progress.batch + 1)
                if not worked:
                    self._stop.wait(self._idle_wait())
                else:
                    _LOG.debug("batch took %.3fs", time.monotonic() - start)
        finally:
            self._sc.setJobDescription(None)
            self._release()
            if self._own_dir and self.done():
                shutil.rmtree(self._log.root, ignore_errors=True)

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
        self._grouped = {}

    # -- one micro-batch ---------------------------------------------------
    def _run_batch(self, batch: int) -> bool:
        progress = Progress(**{**vars(self.progress)})
        progress.batch = batch
        progress.input_watermarks = dict(self.progress.input_watermarks)
        progress.output_watermarks = dict(self.progress.output_watermarks)
        progress.summaries = dict(self.progress.summaries)
        progress.state_versions = dict(self.progress.state_versions)
        progress.test_stream_positions = dict(self.progress.test_stream_positions)
        progress.source_watermarks = dict(self.progress.source_watermarks)
        progress.side_inputs = dict(self.progress.side_inputs)
        self._batch_progress = progress
        self._written: set[bytes] = set()
        self._ran = 0
        self._input_count = 0
        start = time.monotonic()
        if self._uses_test_clock:
            self._advance_test_streams(progress)
        now = self._now(progress)
        try:
            for number, stage in enumerate(self._plan.stages):
                self._sc.setJobDescription(f"beam_ext batch {batch} stage {number + 1}/"
                                           f"{len(self._plan.stages)}: {stage.name}")
                if stage.test_stream is not None:
                    continue  # its output was emitted by _advance_test_streams
                self._run_streaming_stage(number, stage, progress, now)
            self._keep_complete_side_inputs(progress)
            if not progress.impulse_done:
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
        worked = self._ran > 0 or bool(self._written)
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
            f"{stage.steps[0] if stage.steps else stage.name}={_format_watermark(progress.input_watermark(f'stage{n}'))}"
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
                    self._write(stage.outputs[index], self._sc.parallelize([value], 1))
                    self._written.add(stage.outputs[index])
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

    # -- stages ------------------------------------------------------------
    def _read(self, buffer_id: bytes):
        if buffer_id == IMPULSE_BUFFER:
            if self._batch_progress.impulse_done:
                return self._sc.parallelize([], 1)
            return self._sc.parallelize([ENCODED_IMPULSE_VALUE], 1)
        if buffer_id in self._group_owner:
            return self._grouped.get(buffer_id) or self._sc.parallelize([], 1)
        return super()._read(buffer_id)

    def _has_input(self, buffer_id: bytes) -> bool:
        if buffer_id == IMPULSE_BUFFER:
            return not self._batch_progress.impulse_done
        return buffer_id in self._written

    def _run_streaming_stage(self, number: int, stage: PlannedStage, progress: Progress,
                             now: Timestamp) -> None:
        owner = f"stage{number}"
        for buffer_id in stage.inputs:
            if buffer_id in self._group_owner and buffer_id not in self._grouped:
                self._run_group(buffer_id, progress, now)
        previous = progress.input_watermark(owner)
        watermark = min((self._buffer_watermark(b, progress) for b in stage.inputs), default=MAX_TIMESTAMP)
        watermark = max(watermark, previous)  # watermarks never go back
        progress.input_watermarks[owner] = watermark
        summary = progress.summaries.get(owner, TaskSummary())
        has_input = any(self._has_input(b) for b in stage.inputs)
        if not has_input and not (stage.keeps_state and summary.has_due_work(watermark, now)):
            progress.output_watermarks[owner] = min(watermark, summary.hold)
            return
        if stage.native is not None:
            raise NotImplementedError(f"stage {stage.name!r} is Spark-native; streaming runs Beam expansions")
        broadcast = self._streaming_side_inputs(number, stage, progress)
        context = BatchContext(
            batch=progress.batch, owner=owner,
            state_root=self._log.state_root if stage.keeps_state else None,
            read_version=progress.state_versions.get(owner), previous_watermark=previous,
            watermark=watermark, processing_time=now)
        records = self._streaming_input(stage)
        out = records.mapPartitionsWithIndex(functools.partial(_stage_task, stage.spec, broadcast, context))
        summary = self._collect(stage, out, owner)
        if stage.keeps_state:
            progress.state_versions[owner] = progress.batch
        progress.summaries[owner] = summary
        progress.output_watermarks[owner] = min(watermark, summary.hold)
        for index, buffer_id in enumerate(stage.outputs):
            if summary.output_bytes.get(index):
                self._write(buffer_id, out.filter(lambda r, i=index: r[0] == i).values())
                self._written.add(buffer_id)

    def _collect(self, stage: PlannedStage, out, owner: str) -> TaskSummary:
        from pyspark import StorageLevel

        out.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(out)
        with translate_spark_error(stage.steps):
            records = out.filter(lambda r: r[0] < 0).collect()
        self._ran += 1
        summary = TaskSummary()
        metrics = []
        for kind, value in records:
            if kind == SUMMARY_OUTPUT:
                summary = summary.merge(value)
            elif kind == METRICS_OUTPUT:
                metrics.append(value)
        if metrics:
            self._merge_metrics(stage.name, metrics)
        return summary

    def _merge_metrics(self, stage_name: str, serialized: list[bytes]) -> None:
        infos = itertools.chain(
            self.monitoring.get(stage_name, []),
            itertools.chain.from_iterable(
                beam_fn_api_pb2.ProcessBundleResponse.FromString(s).monitoring_infos for s in serialized))
        merged = list(monitoring_infos.consolidate(infos))
        with self._lock:
            self.monitoring = {**self.monitoring, stage_name: merged}

    def _streaming_input(self, stage: PlannedStage):
        """The stage's records; for a stage with state, exactly one partition per state partition."""
        if not stage.keeps_state:
            parts = [_tag(i, self._read(b)) for i, b in enumerate(stage.inputs) if self._has_input(b)]
            if not parts:
                return self._sc.parallelize([], 1)
            return parts[0] if len(parts) == 1 else self._sc.union(parts)
        parts = [self._sc.parallelize([], 1)]
        for i, buffer_id in enumerate(stage.inputs):
            if not self._has_input(buffer_id):
                continue
            splitter = ElementSplitter(stage.input_coders[i])
            rdd = self._read(buffer_id)
            if stage.keyed:
                parts.append(rdd.mapPartitions(functools.partial(
                    _keyed_records, splitter, self._parallelism, i)))
            else:
                parts.append(rdd.mapPartitionsWithIndex(functools.partial(
                    _round_robin, splitter, i, self._parallelism)))
        records = self._sc.union(parts).partitionBy(self._parallelism, identity_partition).values()
        return records.map(_unkeyed_chunk) if stage.keyed else records

    def _streaming_side_inputs(self, number: int, stage: PlannedStage, progress: Progress):
        if not stage.side_inputs:
            return None
        broadcast = self._sc.broadcast(self._side_input_state(number, stage, progress))
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

    def _side_input_state(self, number: int, stage: PlannedStage, progress: Progress) -> dict:
        state = progress.side_inputs.get(number)
        if state is None:
            state = {}
            for spec in stage.side_inputs:
                if self._produced_watermark(spec.buffer, progress) < MAX_TIMESTAMP:
                    raise NotImplementedError(
                        f"SparkRunner streaming: the side input {spec.tag!r} of {stage.steps[0]!r} "
                        "comes from an unbounded PCollection; side inputs must be bounded for now")
                with translate_spark_error(stage.steps):
                    chunks = super()._read(spec.buffer).collect() if spec.buffer in self._written else []
                state.update(side_input_state(spec, chunks))
            progress.side_inputs[number] = state
        return state

    # -- GroupByKey --------------------------------------------------------
    def _run_group(self, buffer_id: bytes, progress: Progress, now: Timestamp) -> None:
        owner = self._group_owner[buffer_id]
        previous = progress.input_watermark(owner)
        previous_output = progress.output_watermark(owner)
        watermark = max(previous, self._produced_watermark(buffer_id, progress))
        progress.input_watermarks[owner] = watermark
        summary = progress.summaries.get(owner, TaskSummary())
        has_input = buffer_id in self._written
        if not has_input and not summary.has_due_work(watermark, now):
            progress.output_watermarks[owner] = min(watermark, summary.hold)
            return
        parts = [self._sc.parallelize([], 1)] + (list(self._buffers.get(buffer_id, [])) if has_input else [])
        blobs = self._sc.union(parts).partitionBy(self._parallelism, identity_partition)
        context = BatchContext(
            batch=progress.batch, owner=owner, state_root=self._log.state_root,
            read_version=progress.state_versions.get(owner), previous_watermark=previous,
            watermark=watermark, processing_time=now)
        out = blobs.mapPartitionsWithIndex(functools.partial(
            _group_task, self._plan.groups[buffer_id], context, previous_output))
        from pyspark import StorageLevel

        out.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(out)
        with translate_spark_error((f"GroupByKey {split_buffer_id(buffer_id)[1]}",)):
            records = out.filter(lambda r: r[0] < 0).collect()
        self._ran += 1
        summary = TaskSummary()
        for _, value in records:
            summary = summary.merge(value)
        progress.state_versions[owner] = progress.batch
        progress.summaries[owner] = summary
        progress.output_watermarks[owner] = min(watermark, summary.hold)
        if summary.output_bytes.get(0):
            self._grouped[buffer_id] = out.filter(lambda r: r[0] == 0).values()
            self._written.add(buffer_id)

