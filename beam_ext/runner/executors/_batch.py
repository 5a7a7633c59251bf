"""The batch executor: plan stages -> Spark RDD operations, one Spark job per pipeline.

Buffers are RDDs: ``materialize`` buffers hold chunks of encoded elements,
``group`` buffers hold ``(encoded key, payload)`` pairs that become a Spark
shuffle when a stage reads them. Stages are chained lazily: a stage's output
is persisted only when more than one reader needs it (two consumers, or a
side input and a consumer), and one Spark job at the end computes every
stage whose outputs nobody reads. Side inputs are collected when their
reader is planned. Task metrics come back through an accumulator keyed by
(stage, partition), so a recomputed partition replaces its report instead
of adding to it, and no pass over the data is spent on them.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import time
from typing import Any, Callable, Iterator

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.common import ENCODED_IMPULSE_VALUE
from apache_beam.runners.portability.fn_api_runner.translations import IMPULSE_BUFFER, split_buffer_id

from beam_ext.runner import native
from beam_ext.runner._element_batches import BATCH, ElementBatches, Marker, windowed
from beam_ext.runner._errors import PipelineError, translate_spark_error
from beam_ext.runner._group_spill import SpillStats
from beam_ext.runner._metrics import RUNNER_NAMESPACE
from beam_ext.runner._shuffle import Buckets, ElementSplitter, GroupReader, identity_partition, unpack
from beam_ext.runner.executors._side_inputs import SideInputState, side_input_state
from beam_ext.runner.planning import Plan, PlannedStage
from beam_ext.runner.worker import METRICS_OUTPUT, run_stage_partition
from beam_ext.runner.worker._direct import decoded_batches, run_direct_chain
from beam_ext.runner.worker._initial_splits import spread_filled
from beam_ext.runner.worker._stateful import keyed_groups

_LOG = logging.getLogger("beam_ext.runner")


#: Largest main input (a Create's encoded payload) of a stage that gathers
#: its side inputs: the stage runs as one task, its input passing the JVM.
_GATHERED_MAIN_BYTES = 64 * 1024


def _tag(index: int, rdd):
    return rdd.map(lambda chunk: (index, chunk))


def _keyed_blobs(splitter: ElementSplitter, partitions: int, chunks, objects: bool = False) -> Iterator:
    """``(target partition, blob)`` of encoded ``chunks`` of KV elements by key, or of
    element batches handed on as ``objects`` (each element encoded once)."""
    buckets = Buckets(partitions)
    for part in chunks:
        if not objects:
            yield from buckets.add(splitter.keyed(splitter.elements(part)))
        elif type(part) is not Marker:
            yield from buckets.add(splitter.keyed(windowed(part)))
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
                 chunks, sdf_info: bytes | None = None) -> Iterator:
    # Explicit targets: PySpark's repartition() moves pickled batches of
    # elements, which would keep a handful of SDF restrictions together.
    elements = (wv for chunk in chunks for wv in splitter.elements(chunk))
    if sdf_info is not None:
        elements = spread_filled(sdf_info, elements, partitions)
    for target, wv in enumerate(elements, source):
        yield target % partitions, (index, splitter.encode(wv))


def _stage_task(spec, broadcast, reports, stage_name: str, partition: int, records):
    for index, payload in run_stage_partition(spec, broadcast.value if broadcast is not None else None, records):
        if index == METRICS_OUTPUT:
            reports.add({(stage_name, partition): payload})
        else:
            yield index, payload


def _direct_task(chain, setup, side_inputs, reports, stage_name: str, batches_out: bool, indexed: bool,
                 partition: int, batches) -> Iterator:
    report: list[bytes] = []
    yield from run_direct_chain(chain, setup, batches, report, side_inputs.value if side_inputs is not None else (),
                                batches_out, indexed)
    for serialized in report:
        reports.add({(stage_name, partition): serialized})


class _Gathered:
    """Side inputs a task gathered itself, held as a broadcast holds them (``value``)."""

    def __init__(self, value: list[list[bytes]]) -> None:
        self.value = value


def _gathering_task(sides: int, chain, setup, reports, stage_name: str, batches_out: bool, indexed: bool,
                    partition: int, items) -> Iterator:
    """A stage over the few main-input batches tagged -1, with its ``sides``
    side inputs' encoded chunks tagged by index (see ``_gathers_side_inputs``)."""
    chunks: list[list[bytes]] = [[] for _ in range(sides)]
    batches = []
    for tag, item in items:
        (batches if tag < 0 else chunks[tag]).append(item)
    yield from _direct_task(chain, setup, _Gathered(chunks), reports, stage_name, batches_out, indexed,
                            partition, batches)


def _group_task(read: Callable, step: str, reports, partition: int, blobs) -> Iterator:
    """A grouping task: ``read(blobs, stats=...)`` (a GroupReader's encoded or
    object read, or a stateful stage's ``keyed_groups``), then what spilled,
    reported under the grouping's ``step`` (the GroupByKey, or the stateful step)."""
    stats = SpillStats()
    yield from read(blobs, stats=stats)
    if stats.runs:
        reports.add({(step, partition): (stats.runs, stats.bytes)})


def _drain(records) -> None:
    for _ in records:
        pass


def _drained(records) -> Iterator:
    _drain(records)
    return iter(())


def _decode_chunks(coder, setup, chunks):
    if setup is not None:
        setup.apply()  # the values may be instances of the job's classes of __main__
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

    def __init__(self, sc, plan: Plan, parallelism: int) -> None:
        self._sc = sc
        self._plan = plan
        self._parallelism = parallelism
        self._buffers: dict[bytes, list] = {}
        self._grouped: dict[bytes, Any] = {}
        self._persisted: list = []
        self._broadcasts: list = []
        self.monitoring: dict[str, list] = {}
        self._reports = self._sc.accumulator({}, _LatestReport())
        # (GroupByKey step, partition) -> (runs, bytes) spilled by the task that grouped it.
        self._group_spills = self._sc.accumulator({}, _LatestReport())
        self._readers = _count_readers(plan)
        self._unread: list = []  # stage outputs nobody reads: the final job computes them
        # Jobs of writes nobody reads, run in the final job: (rdd, what to do with its elements).
        self._last_jobs: list[tuple[Any, Callable[[list], Any]]] = []
        self._chained: list[PlannedStage] = []  # stages computed by the next Spark action
        self._native_counters: list[tuple[str, str, Any]] = []  # (stage, step, accumulator)
        # Buffers a native step left as Arrow tables for native readers of columns.
        self._arrow_rows: dict[bytes, native.ArrowRows] = {}
        self._one_by_one = False  # set when stages are run one Spark job each, to name a failing step
        # Buffers left as batches of element objects, between native steps
        # and the Map-like stages next to them: no encode and decode in between.
        self._values: dict[bytes, ElementBatches] = {}
        # Outputs of native steps the driver lists without Spark (a Create's):
        # buffer -> (coder, elements when called); side inputs read them from here.
        self._driver_values: dict[bytes, tuple[Any, Callable[[], list]]] = {}
        self._driver_bytes: dict[bytes, int] = {}  # the encoded size of each, without listing it
        # Side inputs collected to the driver, by buffer: encoded chunks.
        self._side_chunks: dict[bytes, list[bytes]] = {}

    def run(self) -> None:
        try:
            try:
                self._run_chained()
            except PipelineError as failure:
                if failure.step is not None or len(self._chained) < 2:
                    raise
                # A dead Python worker leaves no step in Spark's message, and
                # the failed job ran several stages: run them one job each to
                # name the one that fails.
                _LOG.info("pipeline failed in a job of %d stages; running them one by one "
                          "to name the failing step", len(self._chained))
                self._reset()
                self._run_stage_by_stage()
                raise
        finally:
            self._reset()

    def _reset(self) -> None:
        self._sc.setJobDescription(None)
        for rdd in self._persisted:
            rdd.unpersist()
        for broadcast in self._broadcasts:
            broadcast.unpersist()
        self._persisted, self._broadcasts, self._buffers, self._grouped = [], [], {}, {}
        self._arrow_rows, self._values, self._driver_values, self._side_chunks = {}, {}, {}, {}
        self._driver_bytes, self._unread, self._chained, self._last_jobs = {}, [], [], []

    def _run_chained(self) -> None:
        start = time.monotonic()
        total = len(self._plan.stages)
        for number, stage in enumerate(self._plan.stages, 1):
            _LOG.info("stage %d/%d: %s", number, total, stage.label)
            # Spark's UI and progress bar show the job of the stage that asks for one.
            self._sc.setJobDescription(f"beam_ext stage {number}/{total}: {stage.label}")
            if stage.native is not None:
                self._run_native(stage)
            else:
                self._chain_stage(stage)
        self._sc.setJobDescription(f"beam_ext stages up to {total}/{total}: {self._plan.stages[-1].label}"
                                   if total else None)
        self._compute_unread()
        _LOG.info("%d stages done in %.2fs", total, time.monotonic() - start)
        for step, (runs, size) in self._spills_by_step().items():
            _LOG.info("%s: its grouping spilled %d runs, %.1f MB (--spark_group_memory)", step, runs, size / 1e6)

    def _run_stage_by_stage(self) -> None:
        self._readers = {}  # nothing shared: every stage is persisted and computed on its own
        self._one_by_one = True  # natives too, and no objects handed between steps
        for stage in self._plan.stages:
            self._chained = []
            if stage.native is not None:
                self._run_native(stage)
                continue
            self._chain_stage(stage, persist=True)
            self._compute_unread()

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

    def _read_grouped(self, buffer_id: bytes, objects: tuple[Any, int] | None = None):
        """The grouped elements of a ``group:`` buffer: encoded chunks, or, given
        ``objects`` (the reader's coder and bundle bytes), batches of element objects."""
        if buffer_id not in self._grouped:
            parts = self._buffers.get(buffer_id) or [self._sc.parallelize([], 1)]
            blobs = parts[0] if len(parts) == 1 else self._sc.union(parts)
            group = self._plan.groups[buffer_id]
            reader = GroupReader(group.pre_coder, group.post_coder, group.windowing, group.trivial, group.step,
                                 group.memory_bytes, group.blocks, group.windows_apart)
            if objects is None:
                read = reader.read
            else:
                coder, limit_bytes = objects
                read = functools.partial(reader.read_batches, coder=coder, limit_bytes=limit_bytes, batch_size=BATCH)
            self._grouped[buffer_id] = blobs.partitionBy(
                self._parallelism, identity_partition).values().mapPartitionsWithIndex(
                    functools.partial(_group_task, read, reader.step, self._group_spills))
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
                rdd = self._keyed(rdd.mapPartitions(functools.partial(
                    _keyed_blobs, splitter, self._parallelism))).mapPartitions(functools.partial(_rekeyed_chunks, i))
            elif stage.spread:
                rdd = rdd.mapPartitionsWithIndex(functools.partial(
                    _round_robin, splitter, i, self._parallelism, sdf_info=stage.sdf_info)).partitionBy(
                        self._parallelism, identity_partition).values()
            else:
                rdd = _tag(i, rdd)
            parts.append(rdd)
        return parts[0] if len(parts) == 1 else self._sc.union(parts)

    def _keyed(self, blobs):
        """``(target partition, blob)`` pairs moved to their partitions; the blobs."""
        return blobs.partitionBy(self._parallelism, identity_partition).values()

    def _side_input_chunks(self, stage: PlannedStage) -> list[list[bytes]]:
        """The encoded chunks of each of the stage's side inputs, by index."""
        wanted = list(dict.fromkeys(
            spec.buffer for spec in stage.side_inputs
            if spec.buffer not in self._driver_values and spec.buffer not in self._side_chunks))
        if wanted:
            # One Spark job collects them, and the side inputs of later stages
            # that the stages chained so far complete: each would take a job
            # of its own (one per CombineGlobally, whose default reads its
            # result as a side input). The job computes the stages chained so
            # far that they need; a failure names their steps too.
            wanted += self._complete_side_inputs(stage, wanted)
            self._side_chunks.update(zip(wanted, self._collect_buffers(wanted, self._action(stage))))
        chunks: list[list[bytes]] = []
        for spec in stage.side_inputs:
            listed = self._driver_values.get(spec.buffer)
            if listed is None:
                chunks.append(self._side_chunks[spec.buffer])
                continue
            _LOG.debug("side input %s of %s listed on the driver", spec.tag, stage.label)
            coder, values = listed
            chunks.append(list(_encode_partition(coder, values())))
        return chunks

    def _collect_buffers(self, buffers: list[bytes], action) -> list[list]:
        """The chunks of each of ``buffers``, listed on the driver in one Spark
        job run under ``action`` (which names the steps a failure comes from)."""
        # The batch reading: the streaming executor's own _read serves its
        # groupings and impulse, which side inputs do not read through here.
        tagged = [_tag(i, BatchExecutor._read(self, buffer)) for i, buffer in enumerate(buffers)]
        with action:
            collected = (tagged[0] if len(tagged) == 1 else self._sc.union(tagged)).collect()
        lists: list[list] = [[] for _ in buffers]
        for index, chunk in collected:
            lists[index].append(chunk)
        return lists

    def _complete_side_inputs(self, stage: PlannedStage, wanted: list[bytes]) -> list[bytes]:
        """Side inputs of the stages after ``stage`` (not in ``wanted``) whose
        every writer comes before it: what the stages chained so far complete."""
        if self._one_by_one:
            return []
        stages = self._plan.stages
        before = stages[:stages.index(stage)]
        found: list[bytes] = []
        for later in stages[len(before) + 1:]:
            for spec in later.side_inputs:
                buffer = spec.buffer
                if (buffer in wanted or buffer in found or buffer in self._side_chunks
                        or buffer in self._driver_values):
                    continue
                if (any(buffer in s.outputs for s in before)
                        and not any(buffer in s.outputs for s in stages[len(before):])):
                    found.append(buffer)
        return found

    def _broadcast(self, value):
        broadcast = self._sc.broadcast(value)
        self._broadcasts.append(broadcast)
        return broadcast

    def _side_inputs(self, stage: PlannedStage):
        if not stage.side_inputs:
            return None
        state: dict[bytes, bytes] = {}
        for spec, spec_chunks in zip(stage.side_inputs, self._side_input_chunks(stage)):
            state.update(side_input_state(spec, spec_chunks))
        return self._broadcast(SideInputState.sealed(state))

    def _chain_stage(self, stage: PlannedStage, persist: bool = False) -> None:
        """Adds ``stage`` to the lineage; the next Spark action computes it."""
        if stage.direct is not None and not self._one_by_one:
            self._chain_direct(stage)
            return
        records = self._stage_input(stage)
        broadcast = self._side_inputs(stage)
        self._chained.append(stage)
        out = records.mapPartitionsWithIndex(
            functools.partial(_stage_task, stage.spec, broadcast, self._reports, stage.name))
        self._hold(out, sum(self._readers.get(buffer_id, 0) for buffer_id in stage.outputs), persist)
        for index, buffer_id in enumerate(stage.outputs):
            self._write(buffer_id, out.filter(lambda r, i=index: r[0] == i).values())

    def _hold(self, out, readers: int, persist: bool = False) -> None:
        """Persists a chained stage's output that several reads (or ``persist``)
        need, and queues one that nobody reads for the final job.

        Unpersisted, each reader's job would run the stage again: a random or
        time-dependent step would give each reader other elements."""
        from pyspark import StorageLevel

        if persist or readers > 1:
            out.persist(StorageLevel.MEMORY_AND_DISK)
            self._persisted.append(out)
        if readers == 0:
            self._unread.append(out)

    def _chain_direct(self, stage: PlannedStage) -> None:
        """Adds a stage of Map-like steps run on element objects (``worker/_direct.py``)."""
        chain = stage.direct
        _LOG.debug("stage %s runs its steps on element objects", stage.label)
        handed = self._values.get(stage.inputs[0])
        gathers = self._gathers_side_inputs(stage, handed)
        side_inputs = (self._broadcast(self._side_input_chunks(stage))
                       if stage.side_inputs and not gathers else None)
        if gathers:
            _LOG.debug("stage %s gathers its side inputs in its one task", stage.label)
            batches = self._sc.union([_tag(-1, handed.rdd)] + [
                _tag(index, self._read(spec.buffer)) for index, spec in enumerate(stage.side_inputs)]).coalesce(1)
        elif chain.keyed_memory:
            # A stateful DoFn's stage: its input by key, a key's elements together.
            _LOG.debug("stage %s runs its stateful DoFn on element objects, a key at a time", stage.label)
            splitter = ElementSplitter(chain.input_coder)
            source = handed.rdd if handed is not None else self._read(stage.inputs[0])
            blobs = source.mapPartitions(functools.partial(
                _keyed_blobs, splitter, self._parallelism, objects=handed is not None))
            # A DoFn that sees bundles gets them of whole keys, of about the size Beam's bundle processor cuts.
            read = functools.partial(keyed_groups, chain.keyed_memory,
                                     bundle_bytes=stage.spec.bundle_bytes if chain.sees_bundles() else 0)
            batches = self._keyed(blobs).mapPartitionsWithIndex(functools.partial(
                _group_task, read, chain.steps[0].name, self._group_spills))
        elif stage.spread:
            # A splittable DoFn's sized restrictions, one by one over the tasks (see _round_robin).
            batches = self._stage_input(stage).values().mapPartitions(functools.partial(
                decoded_batches, chain.input_coder, stage.spec.bundle_bytes, bundles=chain.sees_bundles()))
        elif handed is not None:
            batches = handed.rdd
        elif self._groups_read_as_objects(stage):
            _LOG.debug("stage %s takes its groups as objects", stage.label)
            batches = self._read_grouped(stage.inputs[0], (chain.input_coder, stage.spec.bundle_bytes))
        else:
            # A DoFn that sees bundles gets them cut from the encoded input, as Beam's bundle processor would.
            batches = self._read(stage.inputs[0]).mapPartitions(functools.partial(
                decoded_batches, chain.input_coder, stage.spec.bundle_bytes, bundles=chain.sees_bundles()))
        self._chained.append(stage)
        buffers = list(dict.fromkeys(stage.outputs))  # a Partition's branches may all write one Flatten's
        shuffles = any(end.shuffle is not None for end in chain.ends())
        # No output: the pipeline's last steps, run by the final job, their batches dropped.
        handing = not buffers or len(buffers) == 1 and not shuffles and self._objects_read(buffers[0])
        indexed = len(buffers) > 1
        if gathers:
            out = batches.mapPartitionsWithIndex(functools.partial(
                _gathering_task, len(stage.side_inputs), chain, stage.spec.worker_setup, self._reports,
                stage.name, handing, indexed))
        else:
            out = batches.mapPartitionsWithIndex(functools.partial(
                _direct_task, chain, stage.spec.worker_setup, side_inputs, self._reports, stage.name, handing,
                indexed))
        if not buffers:
            self._hold(out, 0)
            return
        if handing:
            self._values[buffers[0]] = ElementBatches(out)
            return
        if not chain.branches and chain.shuffle is None:
            out = out.mapPartitions(functools.partial(_encode_partition, chain.output_coder))
        self._hold(out, sum(self._readers.get(buffer_id, 0) for buffer_id in buffers))
        if not indexed:
            self._write(buffers[0], out)
            return
        for buffer_id in buffers:
            indices = frozenset(i for i, b in enumerate(stage.outputs) if b == buffer_id)
            self._write(buffer_id, out.filter(lambda r, ix=indices: r[0] in ix).values())

    def _gathers_side_inputs(self, stage: PlannedStage, handed: ElementBatches | None) -> bool:
        """Whether ``stage`` runs as one task that reads its side inputs itself,
        in the job that computes them, instead of a job collecting them first.

        So it does where its main input is a small ``Create`` in one
        partition, which runs as one task anyway (a ``CombineGlobally``
        injects its default from a ``Create`` of one element, its result read
        as a side input), and no side input is listed or collected already."""
        if (self._one_by_one or not stage.side_inputs or handed is None or stage.spread
                or stage.direct.keyed_memory
                or self._driver_bytes.get(stage.inputs[0], _GATHERED_MAIN_BYTES + 1) > _GATHERED_MAIN_BYTES):
            return False
        if any(spec.buffer in self._driver_values or spec.buffer in self._side_chunks
               for spec in stage.side_inputs):
            return False
        return handed.rdd.getNumPartitions() == 1

    def _readers_of(self, buffer_id: bytes) -> list[PlannedStage]:
        return [s for s in self._plan.stages
                if buffer_id in s.inputs or any(spec.buffer == buffer_id for spec in s.side_inputs)]

    def _only_reader(self, buffer_id: bytes) -> PlannedStage | None:
        """The stage reading ``buffer_id``, if it is read once, as its one main input.

        Objects or Arrow tables handed on are not persisted, so a second
        read would compute them again: a buffer read twice is encoded and
        persisted instead."""
        if self._readers.get(buffer_id) != 1:
            return None
        [reader] = self._readers_of(buffer_id)
        return reader if reader.inputs == [buffer_id] else None

    def _groups_read_as_objects(self, stage: PlannedStage) -> bool:
        """Whether ``stage`` (a Map-like stage on objects) takes the grouped
        elements of a GroupByKey it alone reads as objects, never encoded."""
        [buffer_id] = stage.inputs
        return (buffer_id != IMPULSE_BUFFER and split_buffer_id(buffer_id)[0] == "group"
                and self._only_reader(buffer_id) is stage and _takes_objects(stage))

    def _written_once(self, buffer_id: bytes) -> bool:
        """Whether one stage writes ``buffer_id`` (a Flatten writes a buffer several times)."""
        return sum(buffer_id in s.outputs for s in self._plan.stages) == 1

    def _objects_read(self, buffer_id: bytes) -> bool:
        """Whether ``buffer_id``'s only reader is a native step or a Map-like stage
        taking element objects, and it is written once."""
        reader = self._only_reader(buffer_id)
        return reader is not None and self._written_once(buffer_id) and _takes_objects(reader)

    def _all_read_as_objects(self, buffer_id: bytes) -> bool:
        """Whether every stage reading ``buffer_id`` (written once) as a main
        input takes it as its one input, on element objects; side inputs
        read it as listed on the driver.

        Used for a step whose values the driver lists (a ``Create``): each
        reader computes it again, which costs less than encoding, persisting
        and counting it in a job of its own, as a buffer read twice is."""
        readers = [s for s in self._readers_of(buffer_id) if buffer_id in s.inputs]
        return (self._written_once(buffer_id) and buffer_id in self._driver_values and bool(readers)
                and all(s.inputs == [buffer_id] and _takes_objects(s) for s in readers))

    @contextlib.contextmanager
    def _action(self, stage: PlannedStage | None = None):
        """Runs a Spark action over the stages chained so far, then keeps their metrics."""
        stages = self._chained + ([stage] if stage is not None else [])
        with translate_spark_error(tuple(dict.fromkeys(step for s in stages for step in s.steps))):
            yield
        self._record_metrics()

    def _compute_unread(self) -> None:
        """The last job: stage outputs nobody reads, and the writes nobody
        reads (each finalized on the driver after it, in plan order)."""
        if self._unread or self._last_jobs:
            unread, self._unread = self._unread, []
            jobs, self._last_jobs = self._last_jobs, []
            parts = [rdd.mapPartitions(_drained) for rdd in unread] + [
                _tag(index, rdd) for index, (rdd, _) in enumerate(jobs)]
            with self._action():
                collected = (parts[0] if len(parts) == 1 else self._sc.union(parts)).collect()
                by_job: list[list] = [[] for _ in jobs]
                for index, value in collected:
                    by_job[index].append(value)
                for (_, then), values in zip(jobs, by_job):
                    then(values)
        self._record_metrics()

    def _record_metrics(self) -> None:
        by_stage: dict[str, list[bytes]] = {}
        for (stage_name, _), serialized in self._reports.value.items():
            by_stage.setdefault(stage_name, []).append(serialized)
        for stage_name, serialized in by_stage.items():
            infos = itertools.chain.from_iterable(
                beam_fn_api_pb2.ProcessBundleResponse.FromString(s).monitoring_infos
                for s in serialized)
            self.monitoring[stage_name] = list(monitoring_infos.consolidate(infos))
        for step, (runs, size) in self._spills_by_step().items():
            self.monitoring[f"group {step}"] = [
                monitoring_infos.int64_user_counter(RUNNER_NAMESPACE, "group_spilled_runs", runs, ptransform=step),
                monitoring_infos.int64_user_counter(RUNNER_NAMESPACE, "group_spilled_bytes", size, ptransform=step)]
        for stage_name, step_name, counters in self._native_counters:
            self.monitoring[stage_name] = [
                monitoring_infos.int64_user_counter(namespace, name, value, ptransform=step_name)
                for (namespace, name), value in counters.value.items()]

    def _spills_by_step(self) -> dict[str, tuple[int, int]]:
        totals: dict[str, tuple[int, int]] = {}
        for (step, _), (runs, size) in self._group_spills.value.items():
            old_runs, old_size = totals.get(step, (0, 0))
            totals[step] = (old_runs + runs, old_size + size)
        return totals

    def _run_native(self, stage: PlannedStage) -> None:
        from pyspark import StorageLevel

        spec = stage.native
        fn = native.lookup_native(spec.urn)
        listed = native.DRIVER_VALUES.get(spec.urn)
        if listed is not None and len(stage.outputs) == 1 and self._written_once(stage.outputs[0]):
            self._driver_values[stage.outputs[0]] = (spec.output_coder, functools.partial(listed, spec.payload))
            self._driver_bytes[stage.outputs[0]] = len(spec.payload)
        counters = self._sc.accumulator({}, _DictSumParam())
        readers = sum(self._readers.get(buffer_id, 0) for buffer_id in stage.outputs)
        done_unread = readers == 0 and spec.urn in native.DONE_ON_RETURN  # a write nobody reads
        context = native.NativeContext(
            sc=self._sc, parallelism=self._parallelism, step_name=spec.step_name,
            counter=lambda namespace, name: _SparkCounter(counters, (namespace, name)))
        if done_unread and not self._one_by_one:
            # Its job joins the pipeline's last one, which runs every such write's tasks side by side.
            context.run_job = lambda rdd, then: self._last_jobs.append((rdd, then))
        values = self._arrow_rows.get(stage.inputs[0]) or self._values.get(stage.inputs[0])
        if values is None:
            values = self._read(stage.inputs[0]).mapPartitions(
                functools.partial(_decode_chunks, spec.input_coder, spec.worker_setup))
        elif isinstance(values, ElementBatches) and spec.urn not in native.READS_BATCHES:
            values = values.elements()
        self._native_counters.append((stage.name, spec.step_name, counters))
        # Inside the action: an implementation may run Spark jobs itself (a
        # write finalizes its files on the driver); their errors name the step too.
        with self._action(stage):
            out = fn(spec.payload, values, context)
            if out is None:  # its job deferred to the last one (run_job above)
                self._chained.append(stage)
                return
            if isinstance(out, native.ArrowRows):
                if (not self._one_by_one and stage.outputs
                        and all(self._reads_arrow_rows(buffer_id) for buffer_id in stage.outputs)):
                    self._chained.append(stage)
                    for buffer_id in stage.outputs:
                        self._arrow_rows[buffer_id] = out
                    return
                out = out.batches()
            if not self._one_by_one and len(stage.outputs) == 1 and (
                    self._objects_read(stage.outputs[0])
                    or listed is not None and self._all_read_as_objects(stage.outputs[0])):
                self._chained.append(stage)
                self._values[stage.outputs[0]] = out if isinstance(out, ElementBatches) else ElementBatches.of(out)
                return
            if isinstance(out, ElementBatches):
                out = out.elements()
            out = out.mapPartitions(functools.partial(_encode_partition, spec.output_coder))
            if done_unread:
                pass  # its job ran (stage by stage); another would only list the files' names again
            elif readers <= 1 and not self._one_by_one:
                # Read once (or never): computed in the same pass as its reader,
                # as a fused Beam step would be, instead of persisted first.
                self._chained.append(stage)
                if readers == 0:
                    self._unread.append(out)
            else:
                out.persist(StorageLevel.MEMORY_AND_DISK)
                self._persisted.append(out)
                out.count()
        for buffer_id in stage.outputs:
            self._write(buffer_id, out)

    def _reads_arrow_rows(self, buffer_id: bytes) -> bool:
        """Whether ``buffer_id``'s only reader is a native step taking Arrow tables as its input."""
        reader = self._only_reader(buffer_id)
        return reader is not None and reader.native is not None and reader.native.urn in native.READS_ARROW_ROWS


try:
    from pyspark.accumulators import AccumulatorParam as _AccumulatorParam
except ImportError:  # pragma: no cover - pyspark is a hard dependency
    _AccumulatorParam = object


class _LatestReport(_AccumulatorParam):
    """Per-task reports: a key written again (a retried or recomputed task) replaces its value."""

    def zero(self, value):
        return {}

    def addInPlace(self, a, b):
        a.update(b)
        return a


def _takes_objects(stage: PlannedStage) -> bool:
    """Whether ``stage`` may take its input as element objects: a native step,
    or steps on objects none of which sees bundles (those are cut from the
    encoded input by its size, ``--spark_bundle_size``, as Beam's bundle
    processor cuts them), or a stateful DoFn's (its bundles are cut from its
    input grouped by key, which the keyed shuffle encodes either way). Not a
    splittable DoFn's: its sized restrictions are spread over the tasks one
    by one, encoded."""
    direct = stage.direct
    return stage.native is not None or direct is not None and not stage.spread and (
        bool(direct.keyed_memory) or not direct.sees_bundles())


def _count_readers(plan: Plan) -> dict[bytes, int]:
    """How many times each buffer is read: by stages, as input or side input."""
    readers: dict[bytes, int] = {}
    for stage in plan.stages:
        for buffer_id in (*stage.inputs, *(spec.buffer for spec in stage.side_inputs)):
            readers[buffer_id] = readers.get(buffer_id, 0) + 1
    return readers


class _DictSumParam(_AccumulatorParam):
    def zero(self, value):
        return {}

    def addInPlace(self, a, b):
        for key, n in b.items():
            a[key] = a.get(key, 0) + n
        return a
