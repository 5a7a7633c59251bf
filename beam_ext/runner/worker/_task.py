"""One fused stage inside one Spark task, run by Beam's own bundle processor.

The task is an in-process SDK worker wired the way Beam's embedded worker is
(``EmbeddedWorkerHandler``): an in-memory data channel, a state servicer
(:mod:`beam_ext.runner.state`), and ``SdkWorker``. beam_ext supplies the loop
around it: inputs cut into bundles, SDF residuals fed back, timers fired
while they are due under the watermark the task runs under, and bundle
metrics returned to the driver as an extra record.

The batch executor runs every task under the watermark +inf (all input is
present), so every timer fires, again and again until none is set. A
streaming executor passes each micro-batch's input watermark: event-time
timers past it stay pending, and so do processing-time timers, which fire
only at the end of input until the executor passes processing time.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import logging
from typing import Any, Iterable, Iterator, Mapping

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers
from apache_beam.runners.worker import bundle_processor, data_plane, sdk_worker
from apache_beam.runners.worker.statecache import StateCache
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_ext.errors import BeamExtError
from beam_ext.runner._shuffle import Buckets, KeyedValues, ShuffleWriter
from beam_ext.runner.state import task_state
from beam_ext.runner.worker._setup import WorkerSetup

_LOG = logging.getLogger(__name__)

METRICS_OUTPUT = -1  # output index of the record carrying the task's metrics

class StageFailed(BeamExtError, RuntimeError):
    """User code failed inside a stage; the message names the stage."""


@dataclasses.dataclass
class StageSpec:
    """What an executor needs to run one stage; pickled into the Spark closure."""

    name: str
    descriptor: bytes  # serialized ProcessBundleDescriptor
    inputs: tuple[str, ...]  # DATA_INPUT transform ids, by input index
    input_coders: tuple[Any, ...]  # their windowed coders, to cut chunks between elements
    outputs: Mapping[str, int]  # DATA_OUTPUT transform id -> output index
    shuffle_writers: Mapping[int, ShuffleWriter]  # outputs feeding a GroupByKey
    timer_families: tuple[tuple[str, str], ...]
    timer_coders: Mapping[tuple[str, str], Any]
    processing_time_timers: frozenset[tuple[str, str]]  # families in the processing-time domain
    bundle_bytes: int
    partitions: int  # of the shuffles this stage writes
    state_backend: str = "memory"  # or "spill": bag state in an LMDB SpillStore
    state_memory_bytes: int = 256 << 20
    worker_setup: WorkerSetup | None = None  # the job's pickler, main session, plugins


_DESCRIPTORS: dict[bytes, beam_fn_api_pb2.ProcessBundleDescriptor] = {}


def _descriptor(spec: StageSpec) -> beam_fn_api_pb2.ProcessBundleDescriptor:
    # Parsed once per Python worker process: workers are reused across tasks.
    found = _DESCRIPTORS.get(spec.descriptor)
    if found is None:
        found = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(spec.descriptor)
        _DESCRIPTORS[spec.descriptor] = found
    return found


class _SwitchableState:
    """The state servicer a pooled SDK worker talks to: the current task's."""

    def __init__(self) -> None:
        self.target = None

    def __getattr__(self, name: str):
        return getattr(self.target, name)


class _PooledSdk:
    """An SDK worker with its bundle processors, reused by the tasks of one
    Python worker process: creating Beam's bundle processor (unpickling every
    DoFn, building operations) costs more than a small micro-batch's work."""

    def __init__(self, descriptor: beam_fn_api_pb2.ProcessBundleDescriptor) -> None:
        self.state = _SwitchableState()
        self.channel = data_plane.InMemoryDataChannel()
        self.cache = sdk_worker.BundleProcessorCache(
            worker_handlers.FNAPI_RUNNER_CAPABILITIES,
            worker_handlers.SingletonStateHandlerFactory(
                sdk_worker.GlobalCachingStateHandler(StateCache(0), self.state)),
            data_plane.InMemoryDataChannelFactory(self.channel.inverse()),
            {descriptor.id: descriptor})
        self.worker = sdk_worker.SdkWorker(self.cache)


# (descriptor, side-input token) -> idle SDK workers, least recently used first.
_POOL: collections.OrderedDict[bytes, list[_PooledSdk]] = collections.OrderedDict()
_POOL_KEYS = 32  # a long-lived session runs many pipelines: keep the processors of the latest


def _pool_key(spec: StageSpec, side_inputs: Mapping[bytes, bytes]) -> bytes:
    # Beam's DoFn invoker reads global-window side inputs once, when the
    # processor is built: reuse one only for the same side-input content.
    if not side_inputs:
        return spec.descriptor
    token = getattr(side_inputs, "token", b"") or side_input_token(side_inputs)
    return spec.descriptor + b"\0side-inputs:" + token


def side_input_token(entries: Mapping[bytes, bytes]) -> bytes:
    """A digest of side-input state entries: equal content, equal token."""
    digest = hashlib.blake2b(digest_size=16)
    for key in sorted(entries):
        value = entries[key]
        digest.update(len(key).to_bytes(8, "big") + key + len(value).to_bytes(8, "big"))
        digest.update(value)
    return digest.digest()


class _TaskWorker:
    _ids = itertools.count()

    def __init__(self, spec: StageSpec, side_inputs: Mapping[bytes, bytes], state: Any = None) -> None:
        """``state``: the task's state servicer, if not the one of ``spec.state_backend``."""
        self._spec = spec
        if spec.worker_setup is not None:
            spec.worker_setup.apply()  # before the bundle processor unpickles DoFns
        self._descriptor = _descriptor(spec)
        self._state = state if state is not None else task_state(
            spec.state_backend, side_inputs, spec.state_memory_bytes)
        self._pool_key = _pool_key(spec, side_inputs)
        free = _POOL.get(self._pool_key)
        self._sdk = free.pop() if free else _PooledSdk(self._descriptor)
        self._sdk.state.target = self._state
        self._channel = self._sdk.channel
        self._worker = self._sdk.worker
        self._monitoring: list = []
        self._pending_timers: dict[tuple[str, str], dict] = {}
        # input transform id -> residual roots (DelayedBundleApplication) to feed back
        self._residuals: dict[str, list] = {}
        self._buckets = {index: KeyedValues(spec.partitions) if writer.trivial else Buckets(spec.partitions)
                         for index, writer in spec.shuffle_writers.items()}
        # A trivial grouping's key and value encoders, looked up once per task, not per output.
        self._encoders = {index: writer.value_encoders()
                          for index, writer in spec.shuffle_writers.items() if writer.trivial}
        self.completed = False  # set by the task's loop once it ran to its end

    def close(self) -> None:
        self._sdk.state.target = None
        self._state.close()
        if self.completed:
            _POOL.setdefault(self._pool_key, []).append(self._sdk)
            _POOL.move_to_end(self._pool_key)
            while len(_POOL) > _POOL_KEYS:
                for sdk in _POOL.popitem(last=False)[1]:
                    sdk.cache.shutdown()
        else:
            # A failed or abandoned task may leave a processor mid-bundle.
            self._sdk.cache.shutdown()

    # -- one bundle -------------------------------------------------------
    def run_bundle(self, inputs: Mapping[str, list[bytes]],
                   timers: Mapping[tuple[str, str], bytes]) -> Iterator[tuple[int, Any]]:
        spec = self._spec
        bundle_id = f"{spec.name}-{next(self._ids)}"
        for transform_id, family in spec.timer_families:
            out = self._channel.output_timer_stream(bundle_id, transform_id, family)
            data = timers.get((transform_id, family))
            if data:
                out.write(data)
            out.close()
        for transform_id in spec.inputs:
            out = self._channel.output_stream(bundle_id, transform_id)
            for chunk in inputs.get(transform_id, ()):
                out.write(chunk)
            out.close()
        response = self._worker.do_instruction(beam_fn_api_pb2.InstructionRequest(
            instruction_id=bundle_id,
            process_bundle=beam_fn_api_pb2.ProcessBundleRequest(
                process_bundle_descriptor_id=self._descriptor.id)))
        if response.error:
            # The driver names the stage; the SDK's error names the step.
            raise StageFailed(response.error)
        result = response.process_bundle
        self._monitoring.append(list(result.monitoring_infos))
        # Every bundle of the task may defer work: residuals accumulate until
        # drain() feeds them back.
        for delayed in result.residual_roots:
            reader = self._input_for(delayed.application.transform_id,
                                     delayed.application.input_id)
            self._residuals.setdefault(reader, []).append(delayed)
        if result.requires_finalization:
            finalized = self._worker.do_instruction(beam_fn_api_pb2.InstructionRequest(
                finalize_bundle=beam_fn_api_pb2.FinalizeBundleRequest(
                    instruction_id=bundle_id)))
            if finalized.error:
                raise StageFailed(f"finalizing the bundle failed:\n{finalized.error}")
        for output in self._channel.input_elements(bundle_id, []):
            if isinstance(output, beam_fn_api_pb2.Elements.Timers):
                self._collect_timers(output)
            elif output.data:
                index = spec.outputs[output.transform_id]
                writer = spec.shuffle_writers.get(index)
                if writer is None:
                    yield index, output.data
                elif writer.trivial:
                    for blob in self._buckets[index].add(writer.kvs(output.data), *self._encoders[index]):
                        yield index, blob
                else:
                    for blob in self._buckets[index].add(writer.split(output.data)):
                        yield index, blob

    def flush_shuffles(self) -> Iterator[tuple[int, Any]]:
        for index, buckets in self._buckets.items():
            for blob in buckets.flush():
                yield index, blob

    # -- timers and residuals --------------------------------------------
    def _collect_timers(self, output) -> None:
        family = (output.transform_id, output.timer_family_id)
        coder_impl = self._spec.timer_coders[family].get_impl()
        table = self._pending_timers.setdefault(family, {})
        for timer in coder_impl.decode_all(output.timers):
            ident = (timer.user_key, timer.dynamic_timer_tag, timer.windows[0])
            if timer.clear_bit:
                table.pop(ident, None)
            else:
                table[ident] = timer

    def _take_timers(self, watermark: Timestamp,
                     processing_time: Timestamp | None = None) -> dict[tuple[str, str], bytes]:
        """Removes and encodes the timers due, per family.

        Event-time timers are due under ``watermark``. Processing-time timers
        are due at ``processing_time``; without one (batch), at the end of
        input (``watermark`` +inf).
        """
        fired: dict[tuple[str, str], bytes] = {}
        at_end = watermark >= MAX_TIMESTAMP
        for family, table in self._pending_timers.items():
            if family in self._spec.processing_time_timers:
                if processing_time is None:
                    due = list(table) if at_end else []
                else:
                    due = [ident for ident, t in table.items() if t.fire_timestamp <= processing_time]
            else:
                due = [ident for ident, t in table.items() if t.fire_timestamp <= watermark]
            if not due:
                continue
            impl = self._spec.timer_coders[family].get_impl()
            out = create_OutputStream()
            # Earliest first, so a key's timers fire in timestamp order.
            for timer in sorted((table.pop(ident) for ident in due),
                                key=lambda t: t.fire_timestamp):
                impl.encode_to_stream(timer, out, True)
            fired[family] = out.get()
        return fired

    def drain(self, watermark: Timestamp) -> Iterator[tuple[int, Any]]:
        """Feeds residuals and fires due timers until nothing is due under ``watermark``."""
        while True:
            residuals, self._residuals = self._residuals, {}
            timers = {} if residuals else self._take_timers(watermark)
            if not residuals and not timers:
                return
            yield from self.run_bundle(
                {reader: [d.application.element for d in roots] for reader, roots in residuals.items()},
                timers)

    def _input_for(self, transform_id: str, input_id: str) -> str:
        transforms = self._descriptor.transforms
        pcoll = transforms[transform_id].inputs[input_id]
        for read_id, proto in transforms.items():
            if proto.spec.urn == bundle_processor.DATA_INPUT_URN and pcoll in proto.outputs.values():
                return read_id
            if (proto.spec.urn == common_urns.sdf_components.TRUNCATE_SIZED_RESTRICTION.urn
                    and pcoll in proto.outputs.values()):
                upstream = list(proto.inputs.values())[0]
                for grpc_read, other in transforms.items():
                    if (other.spec.urn == bundle_processor.DATA_INPUT_URN
                            and upstream in other.outputs.values()):
                        return grpc_read
        raise StageFailed(f"stage {self._spec.name!r}: no input feeds {transform_id}")

    def monitoring_infos(self) -> bytes:
        from apache_beam.metrics.monitoring_infos import consolidate

        merged = consolidate(itertools.chain.from_iterable(self._monitoring))
        return beam_fn_api_pb2.ProcessBundleResponse(
            monitoring_infos=list(merged)).SerializeToString()


def _elements(coder: Any, chunk: bytes) -> Iterator[bytes]:
    """The encoded elements of ``chunk``, as slices of it (no re-encoding)."""
    impl = coder.get_impl()
    stream = create_InputStream(chunk)
    start = 0
    while stream.size() > 0:
        impl.decode_from_stream(stream, True)
        end = len(chunk) - stream.size()
        yield chunk[start:end]
        start = end


def _bundles(spec: StageSpec,
             records: Iterable[tuple[int, bytes]]) -> Iterator[dict[str, list[bytes]]]:
    """Cuts ``(input index, chunk)`` records into bundles of ``spec.bundle_bytes``.

    A bundle closes once its input reaches ``bundle_bytes`` and holds at least
    one element; a chunk that does not fit is cut between its elements (so
    ``bundle_bytes=1`` gives one element per bundle). Chunks that fit whole
    are passed on undecoded.
    """
    limit = spec.bundle_bytes
    pending: dict[str, list[bytes]] = {}
    size = 0
    for index, chunk in records:
        target = pending.setdefault(spec.inputs[index], [])
        if size + len(chunk) < limit:
            target.append(chunk)
            size += len(chunk)
            continue
        for element in _elements(spec.input_coders[index], chunk):
            target.append(element)
            size += len(element)
            if size >= limit:
                yield pending
                pending, size = {}, 0
                target = pending.setdefault(spec.inputs[index], [])
    if size:
        yield pending


def run_stage_partition(spec: StageSpec, side_inputs: Mapping[bytes, bytes] | None,
                        records: Iterable[tuple[int, bytes]],
                        watermark: Timestamp = MAX_TIMESTAMP) -> Iterator[tuple[int, Any]]:
    """Runs ``spec`` over one partition of ``(input index, chunk)`` records under ``watermark``.

    Yields ``(output index, chunk)`` for materialized outputs,
    ``(output index, (target partition, blob))`` for shuffle outputs, and one final
    ``(METRICS_OUTPUT, serialized monitoring infos)``.
    """
    worker = _TaskWorker(spec, side_inputs or {})
    try:
        ran = False
        for bundle in _bundles(spec, records):
            yield from worker.run_bundle(bundle, {})
            ran = True
        if not ran:
            # An empty partition still runs one bundle: the stage may have
            # DoFns whose bundle methods emit (and Beam runs them on empty input).
            yield from worker.run_bundle({}, {})
        yield from worker.drain(watermark)
        yield from worker.flush_shuffles()
        yield METRICS_OUTPUT, worker.monitoring_infos()
        worker.completed = True
    finally:
        worker.close()
