"""SpillStore against an in-memory model, real LMDB, real crashes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from beam_ext.state import SpillStore, SpillStoreError

_KEYS = [b"a", b"bb", b""]
_WINDOWS = [(0.0, 20.0), (20.0, 40.0), (-20.0, 0.0)]


def _value(i: int) -> bytes:
    return b"v%d-" % i + b"x" * (i % 7)


def test_round_trip_through_destage_prestage_and_reopen(tmp_path):
    store = SpillStore(str(tmp_path), memory_budget_bytes=1 << 20, block_bytes=64)
    w = store.window(b"k", (0.0, 20.0))
    w.add([_value(i) for i in range(50)])
    w.destage()
    w.add([b"late"])
    assert list(w.iter()) == [_value(i) for i in range(50)] + [b"late"]
    w.prestage()
    store.flush()
    assert list(w.iter()) == [_value(i) for i in range(50)] + [b"late"]
    store._check()
    store.close()
    again = SpillStore(str(tmp_path), memory_budget_bytes=1 << 20, block_bytes=64)
    assert again.windows() == [(b"k", (0.0, 20.0))]
    assert list(again.window(b"k", (0.0, 20.0)).iter()) == [_value(i) for i in range(50)] + [b"late"]
    again.close()


def test_memory_stays_under_budget_with_many_past_windows(tmp_path):
    budget = 256 << 10
    store = SpillStore(str(tmp_path), memory_budget_bytes=budget, block_bytes=8 << 10)
    payload = b"p" * 1000
    peak = 0
    for i in range(40):
        w = store.window(b"k", (20.0 * i, 20.0 * i + 20))
        for _ in range(50):
            w.add([payload] * 4)
            peak = max(peak, store.memory_bytes())
        w.destage()
    store.flush()
    assert store.memory_bytes() == 0
    assert peak <= 2 * budget + (8 << 10)  # budget plus back-pressure slack
    total = sum(1 for i in range(40) for _ in store.window(b"k", (20.0 * i, 20.0 * i + 20)).iter())
    assert total == 40 * 200
    store._check()
    store.close()


def test_prestaging_is_admitted_in_deadline_order_within_its_allowance(tmp_path):
    values = [b"%04d" % i + b"z" * 200 for i in range(40)]
    store = SpillStore(str(tmp_path), memory_budget_bytes=1 << 20, block_bytes=1024)
    wins = [store.window(b"k", (20.0 * i, 20.0 * i + 20)) for i in range(3)]
    for w in wins:
        w.add(values)
        w.destage()
    store.flush()
    assert store.memory_bytes() == 0
    one_window = sum(len(v) for v in values)  # compressed blocks take less
    store._prestage_bytes = one_window  # room for about one window at a time
    for w, deadline in zip(reversed(wins), (3.0, 2.0, 1.0)):
        w.prestage(deadline)  # requested latest-first; the first one is admitted at once
    store._drain()
    staged_first = store.memory_bytes()
    assert 0 < staged_first <= one_window
    for w in (wins[2], wins[0], wins[1]):  # each read frees room for the next deadline
        store._drain()
        assert list(w.iter()) == values
        store._check()
    assert store.stats["reexecutions"] == 3
    assert store.stats["reexecutions_from_memory"] == 3
    assert store.memory_bytes() == 0 and store._prestaged == 0
    store.close()


def test_purge_removes_window_everywhere(tmp_path):
    store = SpillStore(str(tmp_path), block_bytes=16)
    w = store.window(b"k", (0.0, 1.0))
    w.add([b"aaaa"] * 20)
    w.destage()
    store.flush()
    w.purge()
    with pytest.raises(SpillStoreError, match="purged"):
        w.add([b"x"])
    assert list(store.window(b"k", (0.0, 1.0)).iter()) == []
    store.close()
    again = SpillStore(str(tmp_path))
    assert again.windows() == []
    again.close()


def test_bad_arguments_are_named(tmp_path):
    store = SpillStore(str(tmp_path))
    with pytest.raises(TypeError, match="key must be bytes"):
        store.window("k", (0, 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"values\[1\] must be bytes"):
        store.window(b"k", (0, 1)).add([b"a", "b"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        SpillStore(str(tmp_path / "x"), memory_budget_bytes=0)
    store.close()


def test_corrupt_environment_is_a_clear_error(tmp_path):
    path = tmp_path / "bad"
    path.mkdir()
    (path / "data.mdb").write_bytes(b"this is not an lmdb file" * 100)
    with pytest.raises(SpillStoreError, match="bad"):
        SpillStore(str(path))


class _StoreMachine(RuleBasedStateMachine):
    """Random interleavings against a dict of lists; close-and-reopen included."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="spill-hyp-")
        self.model: dict[tuple[bytes, tuple[float, float]], list[bytes]] = {}
        self.counter = 0
        self.open()

    def open(self) -> None:
        self.store = SpillStore(self.dir, memory_budget_bytes=2048, block_bytes=40,
                                m_bucket_bytes=100, prestage_bytes=60)

    @rule(k=st.sampled_from(_KEYS), w=st.sampled_from(_WINDOWS), n=st.integers(1, 12))
    def add(self, k, w, n):
        values = [_value(self.counter + i) for i in range(n)]
        self.counter += n
        self.store.window(k, w).add(values)
        self.model.setdefault((k, w), []).extend(values)

    @rule(k=st.sampled_from(_KEYS), w=st.sampled_from(_WINDOWS),
          keep=st.sampled_from([0.0, 0.5, 1.0]))
    def destage(self, k, w, keep):
        self.store.window(k, w).destage(keep)

    @rule(k=st.sampled_from(_KEYS), w=st.sampled_from(_WINDOWS))
    def expire(self, k, w):
        self.store.window(k, w).expire()

    @rule(k=st.sampled_from(_KEYS), w=st.sampled_from(_WINDOWS))
    def prestage(self, k, w):
        self.store.window(k, w).prestage()

    @rule(k=st.sampled_from(_KEYS), w=st.sampled_from(_WINDOWS),
          deadline=st.floats(0.0, 100.0))
    def prestage_by(self, k, w, deadline):
        self.store.window(k, w).prestage(deadline)  # queued: the allowance is small

    @rule(k=st.sampled_from(_KEYS), w=st.sampled_from(_WINDOWS))
    def release(self, k, w):
        self.store.window(k, w).release()

    @rule(k=st.sampled_from(_KEYS), w=st.sampled_from(_WINDOWS), take=st.integers(0, 30))
    def iterate(self, k, w, take):
        expected = self.model.get((k, w), [])
        it = self.store.window(k, w).iter()
        got = [v for _, v in zip(range(take), it)]
        assert got == expected[:take]
        del it  # an abandoned iterator must release the window

    @rule(k=st.sampled_from(_KEYS), w=st.sampled_from(_WINDOWS))
    def purge(self, k, w):
        self.store.window(k, w).purge()
        self.model.pop((k, w), None)

    @rule()
    def flush(self):
        self.store.flush()
        assert all(
            b.persisted for win in self.store._windows.values() for b in win.blocks)

    @rule()
    def reopen(self):
        self.store.close()
        self.open()

    @invariant()
    def consistent(self):
        self.store._check()

    def teardown(self):
        for (k, w), values in self.model.items():
            assert list(self.store.window(k, w).iter()) == values
        self.store.close()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


_StoreMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
TestSpillStoreModel = _StoreMachine.TestCase


_WRITER = textwrap.dedent("""
    import sys
    from beam_ext.state import SpillStore
    store = SpillStore(sys.argv[1], memory_budget_bytes=1 << 20, block_bytes=64)
    w = store.window(b"k", (0.0, 20.0))
    w.destage()
    i = 0
    while True:
        w.add([b"%08d" % j for j in range(i, i + 10)])
        i += 10
        if i % 200 == 0:
            store.flush()
            print(i, flush=True)
""")


def test_kill_9_loses_no_committed_block(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    committed = 0
    try:
        while committed < 2000:
            line = proc.stdout.readline()
            assert line, "writer exited early"
            committed = int(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    store = SpillStore(str(tmp_path))
    got = list(store.window(b"k", (0.0, 20.0)).iter())
    store.close()
    assert len(got) >= committed
    # Whole blocks only, in order: exactly a prefix of what was written.
    assert got == [b"%08d" % j for j in range(len(got))]


def test_bag_state_servicer_round_trips_fn_api_bag_state(tmp_path):
    from apache_beam.coders import VarIntCoder
    from apache_beam.portability.api import beam_fn_api_pb2

    from beam_ext.runner.state import SpillBagStateServicer

    store = SpillStore(str(tmp_path), memory_budget_bytes=1024, block_bytes=32)
    servicer = SpillBagStateServicer(store)
    key = beam_fn_api_pb2.StateKey(bag_user_state=beam_fn_api_pb2.StateKey.BagUserState(
        transform_id="t", user_state_id="s", key=b"k", window=b"w"))
    other = beam_fn_api_pb2.StateKey(bag_user_state=beam_fn_api_pb2.StateKey.BagUserState(
        transform_id="t", user_state_id="s", key=b"k2", window=b"w"))
    coder = VarIntCoder()
    for i in range(200):
        servicer.append_raw(key, coder.encode(i))
    servicer.append_raw(other, coder.encode(7))
    data, token = servicer.get_raw(key)
    assert token is None
    assert list(coder.get_impl().decode_all(data)) == list(range(200))
    assert store.memory_bytes() <= 2 * 1024 + 32
    servicer.clear(key)
    assert servicer.get_raw(key) == (b"", None)
    assert list(coder.get_impl().decode_all(servicer.get_raw(other)[0])) == [7]
    store.close()
