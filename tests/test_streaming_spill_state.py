"""Streaming on ``--spark_state_backend=spill``: bag state in a versioned SpillStore under the checkpoint.

The partition-level tests drive :mod:`beam_ext.runner.state._versioned_spill`
the way a streaming task does (open at the committed chains, append, clear,
seal, save the chains with the version); the pipeline tests compare
SparkRunner with the DirectRunner and an interrupted run with an
uninterrupted one.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import userstate, window
from apache_beam.transforms.timeutil import TimeDomain
from pipeline_outputs import AppendLines, read_lines, streaming_equals_direct

from beam_ext.runner import SparkRunner
from beam_ext.runner.state._versioned_spill import SpillPartitionBusy, open_partition_state
from beam_ext.state import SpillStore
from beam_ext.transforms.lateness import LateWindowedGroupByKey

TV = window.TimestampedValue
SPILL = ["--spark_state_backend=spill", "--spark_state_memory=2048"]


# -- one partition, as a task uses it ----------------------------------------------------------------
def _key(name: str) -> beam_fn_api_pb2.StateKey:
    return beam_fn_api_pb2.StateKey(bag_user_state=beam_fn_api_pb2.StateKey.BagUserState(
        transform_id="t", user_state_id="s", key=name.encode(), window=b"w"))


def _open(root: str, batch: int, chains: dict, **kwargs):
    return open_partition_state({}, root, "stage1", 0, batch, 2048, chains, **kwargs)


def _task(root: str, batch: int, chains: dict, appends=(), clears=()) -> dict:
    """One successful task: returns the chains it would save with version ``batch``."""
    state = _open(root, batch, chains)
    try:
        for name in clears:
            state.clear(_key(name))
        for name, data in appends:
            state.append_raw(_key(name), data)
        return state.seal()
    finally:
        state.close()


def _read(root: str, chains: dict, names, others=()) -> dict:
    state = _open(root, 99, chains, other_manifests=others)
    try:
        return {name: state.get_raw(_key(name))[0] for name in names}
    finally:
        state.close()


def _stored(root: str) -> set:
    """(state key, segment) of every segment in the partition's store."""
    with SpillStore(os.path.join(root, "stage1", "0", "spill")) as store:
        return set(store.windows())


def test_a_retried_batch_starts_from_the_committed_version_not_from_its_failed_attempt(tmp_path):
    root = str(tmp_path)
    v1 = _task(root, 1, {}, appends=[("a", b"1"), ("b", b"2")])
    # Batch 2's first attempt appends, clears, and dies before its version is written.
    failed = _open(root, 2, v1)
    failed.append_raw(_key("a"), b"X")
    failed.clear(_key("b"))
    failed.append_raw(_key("c"), b"Y")
    failed.close()
    assert _read(root, v1, "abc") == {"a": b"1", "b": b"2", "c": b""}
    v2 = _task(root, 2, v1, appends=[("a", b"3")], clears=["b"])
    # Until batch 2 is committed, batch 1 is what a restart reads (batch 2's file on disk beside it).
    assert _read(root, v1, "abc", others=[v2]) == {"a": b"1", "b": b"2", "c": b""}
    assert _read(root, v2, "abc") == {"a": b"13", "b": b"", "c": b""}


def test_segments_no_version_names_are_collected_once_a_later_version_is_read(tmp_path):
    root = str(tmp_path)
    v1 = _task(root, 1, {}, appends=[("a", b"1"), ("b", b"2")])
    v2 = _task(root, 2, v1, appends=[("c", b"3")], clears=["b"])
    assert len(_stored(root)) == 3  # b's segment is batch 1's: still there
    v3 = _task(root, 3, v2, appends=[("a", b"4")])  # opened at batch 2's chains: b's segment goes
    assert _stored(root) == {(key, seg) for key, chain in v3.items() for seg in chain}
    assert len(_stored(root)) == 3  # a: batches 1 and 3; c: batch 2
    assert _read(root, v3, "abc") == {"a": b"14", "b": b"", "c": b"3"}


def test_an_uncommitted_version_file_keeps_the_segments_it_names(tmp_path):
    # Attempt A of batch 2 wrote its version file; attempt B starts from batch 1
    # and must not delete what A's file names: the driver may commit A's outputs.
    root = str(tmp_path)
    v1 = _task(root, 1, {}, appends=[("a", b"1")])
    a = _task(root, 2, v1, appends=[("a", b"A")])
    b = _open(root, 2, v1, other_manifests=[a])
    b.close()
    assert _read(root, a, "a") == {"a": b"1A"}


def test_a_bag_appended_in_many_batches_is_read_back_whole_and_compacted(tmp_path):
    root = str(tmp_path)
    chains: dict = {}
    for batch in range(1, 13):
        chains = _task(root, batch, chains, appends=[("a", bytes([batch]))])
    key = _key("a").SerializeToString()
    assert len(chains[key]) == 12
    state = _open(root, 13, chains)
    assert state.get_raw(_key("a"))[0] == bytes(range(1, 13))
    compacted = state.seal()
    state.close()
    assert len(compacted[key]) == 1
    assert _read(root, compacted, "a") == {"a": bytes(range(1, 13))}


def test_state_beyond_the_memory_budget_reaches_disk(tmp_path):
    root = str(tmp_path)
    state = _open(root, 1, {})
    for i in range(200):
        state.append_raw(_key(f"k{i % 20}"), b"v" * 100)
    state.store.flush()  # waits for the writes under way: no end-of-batch seal yet
    assert state.store.stats["blocks_written"] > 0
    # Of 21,600 bytes added. The budget is soft: while the I/O thread is busy
    # the policy plans again only once memory has grown by another block
    # (here 2048 // 16 bytes), so the last appends may hold up to that much over it.
    assert state.store.memory_bytes() <= 2048 + 2048 // 16
    chains = state.seal()
    state.close()
    assert os.path.getsize(os.path.join(root, "stage1", "0", "spill", "data.mdb")) > 200 * 100
    assert _read(root, chains, ["k0"]) == {"k0": b"v" * 1000}


def _hold_partition(root: str, chains: dict, ready) -> None:
    state = _open(root, 2, chains)
    state.append_raw(_key("a"), b"zombie")
    ready.set()
    time.sleep(600)


def test_a_second_process_waits_for_the_partition_and_a_killed_holder_releases_it(tmp_path):
    root = str(tmp_path)
    v1 = _task(root, 1, {}, appends=[("a", b"1")])
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    zombie = context.Process(target=_hold_partition, args=(root, v1, ready))
    zombie.start()
    try:
        assert ready.wait(60)
        with pytest.raises(SpillPartitionBusy, match="stage1"):
            _open(root, 2, v1, lock_wait_seconds=0.3)
    finally:
        os.kill(zombie.pid, signal.SIGKILL)
        zombie.join()
    assert _read(root, v1, "a") == {"a": b"1"}  # the zombie's appends are not part of batch 1


# -- pipelines ------------------------------------------------------------------------------------------
def _late_stream() -> TestStream:
    return (TestStream()
            .add_elements([TV(("a", 1), 1), TV(("b", 2), 2), TV(("a", 3), 12)])
            .advance_watermark_to(11)
            .add_elements([TV(("a", 4), 4), TV(("b", 5), 15)])  # a's window is past: late
            .advance_watermark_to(22)
            .add_elements([TV(("a", 6), 6), TV(("b", 7), 13)])  # late again
            .advance_watermark_to(45)
            .add_elements([TV(("a", 8), 8)])  # past the cleanup: a dead letter
            .advance_watermark_to_infinity())


def _late_panes(p):
    panes, dead = (p | _late_stream() | beam.WindowInto(window.FixedWindows(10))
                   | LateWindowedGroupByKey(cleanup=20.0).with_dead_letters())
    shown = panes | "Show" >> beam.Map(
        lambda kv, w=beam.DoFn.WindowParam, p=beam.DoFn.PaneInfoParam:
        ["pane", kv[0], sorted(kv[1]), str(w), p.timing, p.index, p.is_last])
    return (shown, dead | "ShowDead" >> beam.Map(lambda kv: ["dead", kv[0], kv[1]])) | beam.Flatten()


def test_late_windowed_group_by_key_on_the_spill_backend_equals_the_direct_runner(spark, tmp_path):
    out = streaming_equals_direct(_late_panes, tmp_path, SPILL)
    assert ["pane", "a", [1, 4, 6], "[0.0, 10.0)", 2, 2, False] in out  # a second late pane
    assert ["dead", "a", 8] in out


class _Buffer(beam.DoFn):
    """Buffers values per key in a bag; flushes them at the end of the window."""

    BUFFER = userstate.BagStateSpec("buffer", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, kv, w=beam.DoFn.WindowParam, buffer=beam.DoFn.StateParam(BUFFER),
                flush=beam.DoFn.TimerParam(FLUSH)):
        buffer.add(kv[1])
        flush.set(w.end)

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, w=beam.DoFn.WindowParam, buffer=beam.DoFn.StateParam(BUFFER)):
        yield key, str(w), sorted(buffer.read())
        buffer.clear()


def _buffered(p, batches: int = 8):
    stream = TestStream()
    for i in range(batches):
        # 40 keys, a few hundred bytes each per batch: beyond a 2 KiB budget.
        stream = stream.add_elements([TV((f"k{k}", i * 100 + k), i) for k in range(40)]).advance_watermark_to(i)
    return p | stream.advance_watermark_to_infinity() | beam.WindowInto(window.FixedWindows(4)) | beam.ParDo(_Buffer())


def test_a_bag_state_dofn_on_the_spill_backend_equals_the_direct_runner(spark, tmp_path):
    out = streaming_equals_direct(_buffered, tmp_path, SPILL)
    assert ["k3", "[0.0, 4.0)", [3, 103, 203, 303]] in out


def test_a_stopped_run_restarted_from_its_checkpoint_gives_the_uninterrupted_output(spark, tmp_path):
    expected_path = str(tmp_path / "expected.jsonl")
    with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming", *SPILL])) as p:
        _ = _buffered(p) | beam.ParDo(AppendLines(expected_path))

    checkpoint = str(tmp_path / "ckpt")
    options = PipelineOptions(["--streaming", *SPILL, f"--checkpoint_dir={checkpoint}"])
    path = str(tmp_path / "out.jsonl")
    first = beam.Pipeline(runner=SparkRunner(), options=options)
    _ = _buffered(first) | beam.ParDo(AppendLines(path))
    result = first.run()
    while not os.path.exists(os.path.join(checkpoint, "commits", "6.commit")):
        assert result.state == PipelineState.RUNNING
        time.sleep(0.05)
    result.cancel()
    assert len(read_lines(path)) < len(read_lines(expected_path))
    # The buffered values of open windows are in the partitions' LMDB files.
    stores = [os.path.join(d, "spill") for d in _partition_dirs(checkpoint)]
    assert stores and all(os.path.getsize(os.path.join(s, "data.mdb")) > 0 for s in stores)
    with beam.Pipeline(runner=SparkRunner(), options=options) as second:
        _ = _buffered(second) | beam.ParDo(AppendLines(path))
    assert read_lines(path) == read_lines(expected_path)


def _partition_dirs(checkpoint: str) -> list[str]:
    found = []
    for dirpath, dirnames, _ in os.walk(os.path.join(checkpoint, "state")):
        if "spill" in dirnames:
            found.append(dirpath)
    return found
