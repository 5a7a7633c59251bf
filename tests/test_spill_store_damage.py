"""SpillStore on damaged directories: clear errors naming the path, never a crash.

LMDB maps its data file and trusts it, and Arrow reads an unchecked batch
outside its buffers, so damage can kill the process (SIGBUS, SIGSEGV) instead
of raising. Opens and reads that can crash run first in a subprocess: a crash
then fails the test instead of killing pytest; once the subprocess shows a
clean error, the same open may run in-process.
"""
from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import lmdb
import pyarrow as pa
import pytest

from beam_ext.state import SpillStore, SpillStoreError
from beam_ext.state._arrow_blocks import encode_batch

_WINDOW = (0.0, 20.0)

_OPEN_AND_READ = textwrap.dedent("""
    import sys
    from beam_ext.state import SpillStore, SpillStoreError
    try:
        with SpillStore(sys.argv[1]) as store:
            n = sum(len(list(store.window(k, w).iter())) for k, w in store.windows())
    except SpillStoreError as e:
        print("SpillStoreError:", e)
    else:
        print("read", n)
""")


def _open_and_read_in_subprocess(path: str) -> str:
    """What opening and reading every window prints; fails the test if the process crashed."""
    proc = subprocess.run([sys.executable, "-c", _OPEN_AND_READ, path],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, (
        f"opening the store crashed the process (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout.strip()


def _fill(path: str, windows: int = 60) -> None:
    """A store whose blocks span many pages of data.mdb."""
    rng = random.Random(0)
    with SpillStore(path, block_bytes=1024) as store:
        for i in range(windows):
            w = store.window(b"k%d" % i, _WINDOW)
            w.add([rng.randbytes(50) for _ in range(100)])
            w.destage()


# -------------------------------------------------------------- corrupt blocks


def _only_block_key(path: str) -> bytes:
    env = lmdb.open(path, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            keys = list(txn.cursor().iternext(values=False))
    finally:
        env.close()
    assert len(keys) == 1
    return keys[0]


def _replace_block(path: str, key: bytes, data: bytes) -> None:
    env = lmdb.open(path, max_dbs=0)
    try:
        with env.begin(write=True) as txn:
            txn.put(key, data)
    finally:
        env.close()


def _store_with_one_block(path: str) -> bytes:
    with SpillStore(path, block_bytes=1 << 20) as store:
        w = store.window(b"k", _WINDOW)
        w.add([b"%05d" % i for i in range(300)])
        w.destage()
    return _only_block_key(path)


def test_block_failing_to_decompress_names_the_path_and_window(tmp_path):
    path = str(tmp_path / "store")
    key = _store_with_one_block(path)
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        block = bytearray(txn.get(key))
    env.close()
    block[12:40] = b"\xff" * 28  # the lz4 frame right after the block header
    _replace_block(path, key, bytes(block))
    with SpillStore(path) as store, pytest.raises(SpillStoreError) as info:
        list(store.window(b"k", _WINDOW).iter())
    message = str(info.value)
    assert path in message and "corrupt" in message and "(0.0, 20.0)" in message and "b'k'" in message


def test_block_with_offsets_past_its_data_is_an_error_not_a_crash(tmp_path):
    # Damage lz4 cannot see: a well-formed frame whose Arrow offsets point
    # past the values' bytes. Reading it unchecked reads outside the buffer.
    path = str(tmp_path / "store")
    key = _store_with_one_block(path)
    offsets = pa.py_buffer(pa.array([0, 4, 1 << 30, 8], pa.int32()).buffers()[1])
    bad = pa.Array.from_buffers(pa.binary(), 3, [None, offsets, pa.py_buffer(b"12345678")])
    _replace_block(path, key, encode_batch(pa.record_batch([bad], names=["v"])))
    out = _open_and_read_in_subprocess(path)
    assert out.startswith("SpillStoreError:") and path in out and "corrupt" in out, out
