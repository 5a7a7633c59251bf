"""The batch executor: plan stages -> Spark RDD operations, one Spark job per stage.

Buffers are RDDs: ``materialize`` buffers hold chunks of encoded elements,
``group`` buffers hold ``(encoded key, payload)`` pairs that become a Spark
shuffle when a stage reads them. Each stage's output is persisted and
counted once (the action also brings back the stage's metrics), so a buffer
read by several stages is computed once and metrics are never doubled.
"""
from __future__ import annotations

import functools
import itertools
import logging
import time
from typing import Any, Iterator

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.common import ENCODED_IMPULSE_VALUE
from apache_beam.runners.portability.fn_api_runner.translations import IMPULSE_BUFFER, split_buffer_id

from beam_ext.runner import native
from beam_ext.runner._errors import translate_spark_error
from beam_ext.runner._shuffle import Buckets, ElementSplitter, GroupReader, identity_partition, unpack
from beam_ext.runner.executors._side_inputs import side_input_state
from beam_ext.runner.planning import Plan, PlannedStage
from beam_ext.runner.worker import METRICS_OUTPUT, run_stage_partition

_LOG = logging.getLogger("beam_ext.runner")


def _tag(index: int, rdd):
    return rdd.map(lambda chunk: (index, chunk))


def _keyed_blobs(splitter: ElementSplitter, partitions: int, chunks) -> Iterator:
    buckets = Buckets(partitions)
    for chunk in chunks:
        yield from buckets.add(
            (splitter.key_of(wv), splitter.encode(wv)) for wv in splitter.elements(chunk))
    yield from buckets.flush()


def _rekeyed_chunks(index: int, blobs) -> Iterator:
    # Elements of one key arrive together in one partition; chunk them back up.
    out, size = [], 0
    for _, element in unpack(blobs):
        out.append(element)
        size += len(element)
        if size >= 4 << 20:
            yield index, b"".join(out)
            out, size = [], 0
    if out:
        yield index, b"".join(out)


def _round_robin(splitter: ElementSplitter, index: int, partitions: int, source: int,
                 chunks) -> Iterator:
    # Explicit targets: PySpark's repartition() moves pickled batches of
    # elements, which would keep a handful of SDF restrictions together.
    target = source
    for chunk in chunks:
        for wv in splitter.elements(chunk):
            yield target % partitions, (index, splitter.encode(wv))
            target += 1


def _stage_task(spec, broadcast, records):
    return run_stage_partition(spec, broadcast.value if broadcast is not None else None, records)


def _decode_chunks(coder, chunks):
    impl = coder.get_impl()
    for chunk in chunks:
        stream = create_InputStream(chunk)
        while stream.size() > 0:
            yield impl.decode_from_stream(stream, True)


def _encode_partition(coder, values):
    impl = coder.get_impl()
    out = create_OutputStream()
    for value in values:
        impl.encode_to_stream(value, out, True)
        if out.size() >= 4 << 20:
            yield out.get()
            out = create_OutputStream()
    if out.size():
        yield out.get()


class _SparkCounter:
    def __init__(self, accumulator, key):
        self._acc = accumulator
        self._key = key

    def inc(self, n: int = 1) -> None:
        self._acc.add({self._key: n})


class BatchExecutor:
    """Runs a :class:`Plan` once over bounded input, each task under the watermark +inf."""

    def __init__(self, spark, plan: Plan, parallelism: int) -> None:
        self._spark = spark
        self._sc = spark.sparkContext
        self._plan = plan
        self._parallelism = parallelism
        self._buffers: dict[bytes, list] = {}
        self._grouped: dict[bytes, Any] = {}
        self._persisted: list = []
        self._broadcasts: list = []
        self.monitoring: dict[str, list] = {}

    def run(self) -> None:
        from pyspark import StorageLevel

        try:
            for number, stage in enumerate(self._plan.stages, 1):
                start = time.monotonic()
                self._sc.setJobDescription(f"beam_ext stage {number}/{len(self._plan.stages)}: {stage.name}")
                if stage.native is not None:
                    self._run_native(stage)
                else:
                    self._run_stage(stage, StorageLevel.MEMORY_AND_DISK)
                _LOG.info("stage %d/%d %s done in %.2fs", number, len(self._plan.stages),
                          stage.name, time.monotonic() - start)
        finally:
            self._sc.setJobDescription(None)
            for rdd in self._persisted:
                rdd.unpersist()
            for broadcast in self._broadcasts:
                broadcast.unpersist()

    # -- buffers ---------------------------------------------------------
    def _read(self, buffer_id: bytes):
        if buffer_id == IMPULSE_BUFFER:
            return self._sc.parallelize([ENCODED_IMPULSE_VALUE], 1)
        kind, _ = split_buffer_id(buffer_id)
        if kind == "group":
            return self._read_grouped(buffer_id)
        parts = self._buffers.get(buffer_id)
        if not parts:
            return self._sc.parallelize([], 1)
        return parts[0] if len(parts) == 1 else self._sc.union(parts)

    def _read_grouped(self, buffer_id: bytes):
        if buffer_id not in self._grouped:
            parts = self._buffers.get(buffer_id) or [self._sc.parallelize([], 1)]
            blobs = parts[0] if len(parts) == 1 else self._sc.union(parts)
            reader = GroupReader(**vars(self._plan.groups[buffer_id]))
            self._grouped[buffer_id] = blobs.partitionBy(
                self._parallelism, identity_partition).values().mapPartitions(reader.read)
        return self._grouped[buffer_id]

    def _write(self, buffer_id: bytes, rdd) -> None:
        self._buffers.setdefault(buffer_id, []).append(rdd)

    # -- stages ----------------------------------------------------------
    def _stage_input(self, stage: PlannedStage):
        parts = []
        for i, buffer_id in enumerate(stage.inputs):
            rdd = self._read(buffer_id)
            splitter = ElementSplitter(stage.input_coders[i])
            if stage.keyed:
                # A stateful stage owns its keys: all elements of a key in one task.
                rdd = rdd.mapPartitions(functools.partial(
                    _keyed_blobs, splitter, self._parallelism)).partitionBy(
                        self._parallelism, identity_partition).values().mapPartitions(
                            functools.partial(_rekeyed_chunks, i))
            elif stage.spread:
                rdd = rdd.mapPartitionsWithIndex(functools.partial(
                    _round_robin, splitter, i, self._parallelism)).partitionBy(
                        self._parallelism, identity_partition).values()
            else:
                rdd = _tag(i, rdd)
            parts.append(rdd)
        return parts[0] if len(parts) == 1 else self._sc.union(parts)

    def _side_inputs(self, stage: PlannedStage):
        if not stage.side_inputs:
            return None
        state: dict[bytes, bytes] = {}
        for spec in stage.side_inputs:
            # Collecting runs the side input's grouping (a shuffle) here, in
            # this stage's name: its failures read like the stage's own.
            with translate_spark_error(stage.steps):
                chunks = self._read(spec.buffer).collect()
            state.update(side_input_state(spec, chunks))
        broadcast = self._sc.broadcast(state)
        self._broadcasts.append(broadcast)
        return broadcast

    def _run_stage(self, stage: PlannedStage, storage_level) -> None:
        records = self._stage_input(stage)
        broadcast = self._side_inputs(stage)
        out = records.mapPartitions(functools.partial(_stage_task, stage.spec, broadcast))
        out.persist(storage_level)
        self._persisted.append(out)
        with translate_spark_error(stage.steps):
            metrics = out.filter(lambda r: r[0] == METRICS_OUTPUT).values().collect()
        self._record_metrics(stage.name, metrics)
        for index, buffer_id in enumerate(stage.outputs):
            self._write(buffer_id, out.filter(lambda r, i=index: r[0] == i).values())

    def _record_metrics(self, stage_name: str, serialized: list[bytes]) -> None:
        infos = itertools.chain.from_iterable(
            beam_fn_api_pb2.ProcessBundleResponse.FromString(s).monitoring_infos
            for s in serialized)
        self.monitoring[stage_name] = list(monitoring_infos.consolidate(infos))

    def _run_native(self, stage: PlannedStage) -> None:
        from pyspark import StorageLevel

        spec = stage.native
        fn = native.lookup_native(spec.urn)
        counters = self._sc.accumulator({}, _DictSumParam())
        context = native.NativeContext(
            spark=self._spark, parallelism=self._parallelism, step_name=spec.step_name,
            counter=lambda namespace, name: _SparkCounter(counters, (namespace, name)))
        values = self._read(stage.inputs[0]).mapPartitions(
            functools.partial(_decode_chunks, spec.input_coder))
        result = fn(spec.payload, values, context)
        out = result.mapPartitions(functools.partial(_encode_partition, spec.output_coder))
        out.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(out)
        with translate_spark_error(stage.steps):
            out.count()
        self.monitoring[stage.name] = [
            monitoring_infos.int64_user_counter(namespace, name, value, ptransform=spec.step_name)
            for (namespace, name), value in counters.value.items()]
        for buffer_id in stage.outputs:
            self._write(buffer_id, out)


try:
    from pyspark.accumulators import AccumulatorParam as _AccumulatorParam
except ImportError:  # pragma: no cover - pyspark is a hard dependency
    _AccumulatorParam = object


class _DictSumParam(_AccumulatorParam):
    def zero(self, value):
        return {}

    def addInPlace(self, a, b):
        for key, n in b.items():
            a[key] = a.get(key, 0) + n
        return a
