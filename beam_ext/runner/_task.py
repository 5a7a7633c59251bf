"""One fused stage inside one Spark task, run by Beam's own bundle processor.

The task is an in-process SDK worker wired the way Beam's embedded worker is
(``EmbeddedWorkerHandler``): an in-memory data channel, a state servicer, and
``SdkWorker``. beam_ext supplies the loop around it: inputs cut into bundles,
timers fired until none is set (batch: the watermark is at +inf once the
input is consumed), SDF residuals fed back, and bundle metrics returned to
the driver as an extra record.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any, Iterable, Iterator, Mapping

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers
from apache_beam.runners.worker import bundle_processor, data_plane, sdk_worker
from apache_beam.runners.worker.statecache import StateCache

from beam_ext.runner._shuffle import Buckets, ShuffleWriter

_LOG = logging.getLogger(__name__)

METRICS_OUTPUT = -1  # output index of the record carrying the task's metrics

_SIDE_INPUT_TYPES = frozenset(
    ["iterable_side_input", "multimap_side_input", "multimap_keys_side_input",
     "multimap_keys_values_side_input"])


class StageFailed(RuntimeError):
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
    bundle_bytes: int
    partitions: int  # of the shuffles this stage writes
    state_backend: str = "memory"  # or "spill": bag state in an LMDB SpillStore
    state_memory_bytes: int = 256 << 20


class _SideInputsFirst:
    """Serves side inputs from the broadcast dictionary, user state from the base."""

    _side_inputs: Mapping[bytes, bytes]

    def get_raw(self, state_key, continuation_token=None):
        if state_key.WhichOneof("type") in _SIDE_INPUT_TYPES:
            return self._side_inputs.get(state_key.SerializeToString(), b""), None
        return super().get_raw(state_key, continuation_token)


class _MemoryState(_SideInputsFirst, worker_handlers.StateServicer):
    def __init__(self, side_inputs: Mapping[bytes, bytes]) -> None:
        super().__init__()
        self._side_inputs = side_inputs

    def close(self) -> None:
        pass


def _spill_state(side_inputs: Mapping[bytes, bytes], memory_bytes: int):
    # Imported here: only stages that asked for the spill backend need LMDB.
    import shutil
    import tempfile

    from beam_ext.state import SpillBagStateServicer, SpillStore

    class _SpillState(_SideInputsFirst, SpillBagStateServicer):
        def __init__(self) -> None:
            self._dir = tempfile.mkdtemp(prefix="beam_ext_state_")
            super().__init__(SpillStore(self._dir, memory_budget_bytes=memory_bytes))
            self._side_inputs = side_inputs

        def close(self) -> None:
            self.store.close()
            shutil.rmtree(self._dir, ignore_errors=True)

    return _SpillState()


_DESCRIPTORS: dict[bytes, beam_fn_api_pb2.ProcessBundleDescriptor] = {}


def _descriptor(spec: StageSpec) -> beam_fn_api_pb2.ProcessBundleDescriptor:
    # Parsed once per Python worker process: workers are reused across tasks.
    found = _DESCRIPTORS.get(spec.descriptor)
    if found is None:
        found = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(spec.descriptor)
        _DESCRIPTORS[spec.descriptor] = found
    return found


class _TaskWorker:
    _ids = itertools.count()

    def __init__(self, spec: StageSpec, side_inputs: Mapping[bytes, bytes]) -> None:
        self._spec = spec
        self._descriptor = _descriptor(spec)
        self._channel = data_plane.InMemoryDataChannel()
        self._state = (_spill_state(side_inputs, spec.state_memory_bytes)
                       if spec.state_backend == "spill" else _MemoryState(side_inputs))
        self._cache = sdk_worker.BundleProcessorCache(
            worker_handlers.FNAPI_RUNNER_CAPABILITIES,
            worker_handlers.SingletonStateHandlerFactory(
                sdk_worker.GlobalCachingStateHandler(StateCache(0), self._state)),
            data_plane.InMemoryDataChannelFactory(self._channel.inverse()),
            {self._descriptor.id: self._descriptor})
        self._worker = sdk_worker.SdkWorker(self._cache)
        self._monitoring: list = []
        self._pending_timers: dict[tuple[str, str], dict] = {}
        self._residuals: dict[str, list[bytes]] = {}
        self._buckets = {index: Buckets(spec.partitions) for index in spec.shuffle_writers}

    def close(self) -> None:
        self._cache.shutdown()
        self._state.close()

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
            self._residuals.setdefault(reader, []).append(delayed.application.element)
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

    def _take_timers(self) -> dict[tuple[str, str], bytes]:
        fired: dict[tuple[str, str], bytes] = {}
        for family, table in self._pending_timers.items():
            if not table:
                continue
            impl = self._spec.timer_coders[family].get_impl()
            out = create_OutputStream()
            # Earliest first, so a key's timers fire in timestamp order.
            for timer in sorted(table.values(), key=lambda t: t.fire_timestamp):
                impl.encode_to_stream(timer, out, True)
            fired[family] = out.get()
        self._pending_timers = {}
        return fired

    def drain(self) -> Iterator[tuple[int, Any]]:
        """Feeds residuals and fires timers until the stage is quiescent."""
        while True:
            residuals, self._residuals = self._residuals, {}
            timers = {} if residuals else self._take_timers()
            if not residuals and not timers:
                return
            yield from self.run_bundle(residuals, timers)

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
                        records: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    """Runs ``spec`` over one partition of ``(input index, chunk)`` records.

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
        yield from worker.drain()
        yield from worker.flush_shuffles()
        yield METRICS_OUTPUT, worker.monitoring_infos()
    finally:
        worker.close()
