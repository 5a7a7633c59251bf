"""SpillStore on damaged directories: clear errors naming the path, never a crash.

LMDB maps its data file and trusts it, and Arrow reads an unchecked batch
outside its buffers, so damage can kill the process (SIGBUS, SIGSEGV) instead
of raising. Opens and reads that can crash run first in a subprocess: a crash
then fails the test instead of killing pytest; once the subprocess shows a
clean error, the same open may run in-process.
"""
from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import textwrap

import lmdb
import pyarrow as pa
import pytest

from beam_ext.state import SpillStore, SpillStoreError, _lmdb_file
from beam_ext.state._arrow_blocks import encode_batch, encode_values
from beam_ext.state.spill_store import _SEQ, _prefix

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


# ------------------------------------------------------------ truncated data.mdb


def test_half_truncated_data_file_is_a_clear_error_not_sigbus(tmp_path):
    path = str(tmp_path / "store")
    _fill(path)
    data = os.path.join(path, "data.mdb")
    os.truncate(data, os.path.getsize(data) // 2)
    out = _open_and_read_in_subprocess(path)
    assert out.startswith("SpillStoreError:") and path in out and "truncated" in out, out
    with pytest.raises(SpillStoreError, match="truncated") as info:
        SpillStore(path)
    assert path in str(info.value)


def test_meta_pages_read_from_the_file_agree_with_lmdb(tmp_path):
    path = str(tmp_path / "store")
    _fill(path, windows=5)
    meta = _lmdb_file.read_meta(os.path.join(path, "data.mdb"))
    env = lmdb.open(path, readonly=True, lock=False)
    try:
        info, stat = env.info(), env.stat()
    finally:
        env.close()
    assert (meta.page_size, meta.last_page, meta.txnid) == (
        stat["psize"], info["last_pgno"], info["last_txnid"])
    assert meta.main.entries == stat["entries"] > 0
    assert meta.main.depth == stat["depth"]


def test_tree_walk_counts_every_page_lmdb_counts(tmp_path):
    path = str(tmp_path / "store")
    _fill(path, windows=40)
    with SpillStore(path) as store:  # purges leave pages on the free list
        for i in range(0, 40, 3):
            store.window(b"k%d" % i, _WINDOW).purge()
    data = os.path.join(path, "data.mdb")
    env = lmdb.open(path, readonly=True, lock=False)
    try:
        stat = env.stat()
    finally:
        env.close()
    meta = _lmdb_file.read_meta(data)
    walked = _lmdb_file.count_pages(data)
    for name, record in (("free", meta.free), ("main", meta.main)):
        got = walked[name]
        assert (got.branch, got.leaf, got.overflow, got.entries) == (
            record.branch_pages, record.leaf_pages, record.overflow_pages, record.entries), name
    main = walked["main"]
    assert (main.branch, main.leaf, main.overflow, main.entries) == (
        stat["branch_pages"], stat["leaf_pages"], stat["overflow_pages"], stat["entries"])
    assert main.overflow > 0 and walked["free"].entries > 0  # both kinds of page were followed


def _short_but_valid_store(path: str) -> list[bytes]:
    """A store written straight through LMDB whose data.mdb ends before its last page.

    A page allocated and freed again within one transaction (a "loose" page)
    is never written, so LMDB legitimately leaves the file shorter than
    ``(last page + 1) * page size``. Puts and deletes mixed in one transaction
    make that happen within a few transactions. Returns the values of the one
    window written as a real block; the other windows hold filler bytes.
    """
    rng = random.Random(37)  # short after 8 transactions with LMDB 0.9.x
    env = lmdb.open(path, map_size=64 << 20, sync=False, metasync=False, max_dbs=0)
    psize = env.stat()["psize"]
    filler: list[bytes] = []
    kept = [b"kept-%d" % i for i in range(10)]
    with env.begin(write=True) as txn:
        txn.put(_prefix(b"keep", _WINDOW) + _SEQ.pack(0), encode_values(kept))
    for _ in range(600):
        with env.begin(write=True) as txn:
            if rng.random() < 0.6 or not filler:
                for _ in range(rng.choice([1, 1, 5, 40])):
                    k = _prefix(b"f" + rng.randbytes(rng.choice([4, 20, 100])), _WINDOW) + _SEQ.pack(0)
                    txn.put(k, rng.randbytes(rng.choice([10, 500, 3000, 9000])))
                    filler.append(k)
            else:
                rng.shuffle(filler)
                n = rng.randint(1, len(filler))
                for k in filler[:n]:
                    txn.delete(k)
                del filler[:n]
        if os.path.getsize(os.path.join(path, "data.mdb")) < (env.info()["last_pgno"] + 1) * psize:
            break
    env.close()
    return kept


def test_file_shorter_than_its_last_page_opens_when_no_page_in_use_is_missing(tmp_path):
    path = str(tmp_path / "store")
    kept = _short_but_valid_store(path)
    data = os.path.join(path, "data.mdb")
    meta = _lmdb_file.read_meta(data)
    assert os.path.getsize(data) < (meta.last_page + 1) * meta.page_size, "no unwritten last page"
    with SpillStore(path) as store:
        assert (b"keep", _WINDOW) in store.windows()
        assert list(store.window(b"keep", _WINDOW).iter()) == kept


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


# ------------------------------------------------------ data.mdb lost after commit


@pytest.mark.parametrize("damage", ["deleted", "emptied"])
def test_store_that_lost_its_committed_data_refuses_to_open(tmp_path, damage):
    path = str(tmp_path / "store")
    _fill(path, windows=3)
    data = os.path.join(path, "data.mdb")
    if damage == "deleted":
        os.remove(data)
    else:
        os.truncate(data, 0)
    with pytest.raises(SpillStoreError, match="lost") as info:
        SpillStore(path)
    assert path in str(info.value) and "on_lost_data" in str(info.value)


def test_lost_data_can_be_accepted_with_a_loud_warning(tmp_path, caplog):
    path = str(tmp_path / "store")
    _fill(path, windows=3)
    os.remove(os.path.join(path, "data.mdb"))
    with caplog.at_level(logging.ERROR, logger="beam_ext.state.spill_store"):
        store = SpillStore(path, on_lost_data="warn")
    assert store.windows() == []
    store.close()
    assert any(r.levelno == logging.ERROR and path in r.getMessage() and "lost" in r.getMessage()
               for r in caplog.records), caplog.text
    with pytest.raises(ValueError, match="on_lost_data"):
        SpillStore(path, on_lost_data="ignore")


def test_store_that_never_wrote_to_lmdb_reopens_empty_without_complaint(tmp_path, caplog):
    path = str(tmp_path / "store")
    with SpillStore(path) as store:
        store.window(b"k", _WINDOW).add([b"in memory only"])
        store.window(b"k", _WINDOW).purge()
    os.remove(os.path.join(path, "data.mdb"))
    with caplog.at_level(logging.WARNING), SpillStore(path) as store:
        assert store.windows() == []
    assert not caplog.records


def test_store_emptied_by_purges_reopens_empty(tmp_path):
    path = str(tmp_path / "store")
    _fill(path, windows=3)
    with SpillStore(path) as store:
        for k, w in store.windows():
            store.window(k, w).purge()
    with SpillStore(path) as store:
        assert store.windows() == []


# ------------------------------------------------------------ unusable directory


def test_file_at_the_path_is_a_spill_store_error(tmp_path):
    path = tmp_path / "store"
    path.write_text("not a directory")
    with pytest.raises(SpillStoreError, match="store") as info:
        SpillStore(str(path))
    assert str(path) in str(info.value)


def test_path_under_a_regular_file_is_a_spill_store_error(tmp_path):
    # Root ignores directory permissions, so a read-only parent does not fail
    # when the tests run as root. A regular file in the middle of the path
    # fails for every user through the same code path (creating the
    # directory raises OSError); the read-only case runs below when not root.
    (tmp_path / "file").write_text("x")
    path = str(tmp_path / "file" / "store")
    with pytest.raises(SpillStoreError) as info:
        SpillStore(path)
    assert path in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
def test_read_only_parent_is_a_spill_store_error(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(SpillStoreError) as info:
            SpillStore(str(parent / "store"))
    finally:
        parent.chmod(0o755)
    assert str(parent / "store") in str(info.value)


# ------------------------------------------------------ failures while reading


_READ_AFTER_BLOCK_VANISHED = textwrap.dedent("""
    import subprocess, sys
    from beam_ext.state import SpillStore, SpillStoreError
    path, remover = sys.argv[1], sys.argv[2]
    store = SpillStore(path)  # the index lists the block
    subprocess.run([sys.executable, "-c", remover, path], check=True)
    try:
        list(store.window(b"k", (0.0, 20.0)).iter())
    except SpillStoreError as e:
        print("SpillStoreError:", e)
    else:
        print("read")
""")

_REMOVE_EVERY_KEY = textwrap.dedent("""
    import sys, lmdb
    env = lmdb.open(sys.argv[1], max_dbs=0)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(), delete=False)  # empty the main database
    env.close()
""")


def test_read_that_fails_in_the_io_thread_raises_instead_of_waiting_forever(tmp_path):
    # A block the index listed at open is gone when read (another writer, or a
    # damaged branch page that leads the lookup astray): the I/O thread fails
    # and the waiting reader must see that failure.
    path = str(tmp_path / "store")
    _store_with_one_block(path)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _READ_AFTER_BLOCK_VANISHED, path, _REMOVE_EVERY_KEY],
            capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("reading a block that vanished waited forever")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.strip()
    assert out.startswith("SpillStoreError:") and path in out and "lost block 0" in out, out
    assert "(0.0, 20.0)" in out and "b'k'" in out, out


# -------------------------------------------------------- damaged tree pages


def _fill_two_levels(path: str) -> None:
    """A store whose small blocks sit in leaf pages under one branch page."""
    with SpillStore(path, block_bytes=100) as store:
        for i in range(300):
            w = store.window(b"key-%04d" % i, _WINDOW)
            w.add([b"%06d" % (i * 10 + j) for j in range(20)])
            w.destage()


def _redirect_branch_child(path: str, child: int | str) -> None:
    """Point the middle child of the main tree's root branch page at page ``child``.

    ``child`` may be ``"sibling"``: the root's first child, a leaf page then
    reached twice.
    """
    data = os.path.join(path, "data.mdb")
    meta = _lmdb_file.read_meta(data)
    assert meta.main.depth == 2, meta
    root = meta.main.root * meta.page_size
    with open(data, "r+b") as f:
        f.seek(root)
        page = f.read(meta.page_size)
        lower = int.from_bytes(page[12:14], sys.byteorder)
        ptrs = [int.from_bytes(page[p:p + 2], sys.byteorder) for p in range(16, lower, 2)]
        if child == "sibling":
            child = int.from_bytes(page[ptrs[0]:ptrs[0] + 4], sys.byteorder)
        f.seek(root + ptrs[len(ptrs) // 2])
        f.write(int(child).to_bytes(4, sys.byteorder))  # low 32 bits of the page number


@pytest.mark.parametrize("child", [0, "root", "sibling"])
def test_branch_page_pointing_at_the_wrong_page_is_an_error_not_an_abort(tmp_path, child):
    # A meta page or the branch itself as a child makes LMDB abort the process
    # on an assertion; a leaf reached twice lists its blocks twice.
    path = str(tmp_path / "store")
    _fill_two_levels(path)
    if child == "root":
        child = _lmdb_file.read_meta(os.path.join(path, "data.mdb")).main.root
    _redirect_branch_child(path, child)
    out = _open_and_read_in_subprocess(path)
    assert out.startswith("SpillStoreError:") and path in out and "damaged" in out, out


_WRITE_AND_REREAD = textwrap.dedent("""
    import sys
    from beam_ext.state import SpillStore, SpillStoreError
    try:
        with SpillStore(sys.argv[1], block_bytes=100) as store:
            for i in range(30):
                w = store.window(b"new-%d" % i, (0.0, 20.0))
                w.add([bytes(60)] * 20)
                w.destage()
            for k, w in store.windows()[:100]:
                store.window(k, w).purge()
        with SpillStore(sys.argv[1]) as store:
            n = sum(len(list(store.window(k, w).iter())) for k, w in store.windows())
    except SpillStoreError as e:
        print("SpillStoreError:", e)
    else:
        print("read", n)
""")


def _damage_free_list(path: str, damage: str) -> None:
    """Change the first record of the free list: its transaction id, or the pages it lists."""
    data = os.path.join(path, "data.mdb")
    meta = _lmdb_file.read_meta(data)
    assert meta.free.depth == 1 and meta.free.entries > 0, meta.free
    word = _lmdb_file._PGNO
    leaf = meta.free.root * meta.page_size
    with open(data, "r+b") as f:
        f.seek(leaf)
        page = f.read(meta.page_size)
        node = int.from_bytes(page[16:18], sys.byteorder)
        key_at = leaf + node + _lmdb_file._NODE.size  # the key: the freeing transaction's id
        if damage == "transaction after the last":
            f.seek(key_at)
            f.write(word.pack(meta.txnid + 1000))
        else:  # the list becomes that one page
            f.seek(key_at + word.size)
            f.write(word.pack(1))
            f.write(word.pack(meta.main.root if damage == "page in use" else meta.last_page + 50))


@pytest.mark.parametrize("damage", ["transaction after the last", "page in use", "page past the end"])
def test_damaged_free_list_is_refused_at_open_before_a_write_trusts_it(tmp_path, damage):
    # Writers take pages from the free list: a record listing a page in use
    # makes LMDB overwrite live data, one after the last transaction makes
    # it abort the process on an assertion.
    path = str(tmp_path / "store")
    _fill_two_levels(path)
    with SpillStore(path) as store:  # purges put pages on the free list
        for k, w in store.windows()[:150]:
            store.window(k, w).purge()
    _damage_free_list(path, damage)
    proc = subprocess.run([sys.executable, "-c", _WRITE_AND_REREAD, path],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"crashed (exit {proc.returncode}): {proc.stderr[-2000:]}"
    out = proc.stdout.strip()
    assert out.startswith("SpillStoreError: cannot open") and path in out and "free list" in out, out


def test_value_larger_than_its_overflow_pages_is_an_error_not_sigbus(tmp_path):
    # LMDB copies a large value's stated size from its overflow pages; a
    # size past the end of the file killed the process with SIGBUS.
    path = str(tmp_path / "store")
    _fill(path, windows=3)  # each block is larger than a page: on overflow pages
    data = os.path.join(path, "data.mdb")
    meta = _lmdb_file.read_meta(data)
    assert meta.main.depth == 1 and meta.main.overflow_pages > 0, meta.main
    leaf = meta.main.root * meta.page_size
    with open(data, "r+b") as f:
        f.seek(leaf + 16)
        node = int.from_bytes(f.read(2), sys.byteorder)
        f.seek(leaf + node)  # the node's value size
        f.write((1 << 20).to_bytes(4, sys.byteorder))
    out = _open_and_read_in_subprocess(path)
    assert out.startswith("SpillStoreError:") and path in out and "damaged" in out, out


# ------------------------------------------------- damage around the B-trees


@pytest.mark.parametrize("damage", ["lock.mdb removed", "lock.mdb garbage",
                                    "data.mdb extended with garbage", "marker removed"])
def test_damage_that_loses_nothing_opens_with_every_value(tmp_path, damage):
    path = str(tmp_path / "store")
    _fill(path, windows=3)
    if damage == "lock.mdb removed":
        os.remove(os.path.join(path, "lock.mdb"))
    elif damage == "lock.mdb garbage":
        with open(os.path.join(path, "lock.mdb"), "wb") as f:
            f.write(random.Random(1).randbytes(8192))
    elif damage == "data.mdb extended with garbage":
        with open(os.path.join(path, "data.mdb"), "ab") as f:
            f.write(random.Random(2).randbytes(3 * 4096 + 17))
    else:
        os.remove(os.path.join(path, "committed"))
    assert _open_and_read_in_subprocess(path) == "read 300"
    # The marker is back: losing data.mdb now is refused.
    assert os.path.exists(os.path.join(path, "committed"))


@pytest.mark.parametrize("pages", [[0], [1], [0, 1]])
def test_damaged_meta_page_is_an_error_naming_the_file(tmp_path, pages):
    path = str(tmp_path / "store")
    _fill(path, windows=3)
    data = os.path.join(path, "data.mdb")
    page_size = _lmdb_file.read_meta(data).page_size
    with open(data, "r+b") as f:
        for p in pages:
            f.seek(p * page_size)
            f.write(random.Random(p).randbytes(page_size))
    out = _open_and_read_in_subprocess(path)
    assert out.startswith("SpillStoreError:") and data in out, out


def test_key_with_trailing_bytes_is_refused_not_read_as_a_second_copy(tmp_path):
    # It parsed as the same block as the key it extends, so the window read
    # its values twice.
    path = str(tmp_path / "store")
    key = _store_with_one_block(path)
    env = lmdb.open(path, max_dbs=0)
    try:
        with env.begin(write=True) as txn:
            txn.put(key + b"junk", txn.get(key))
    finally:
        env.close()
    with pytest.raises(SpillStoreError, match="malformed key") as info:
        SpillStore(path)
    assert path in str(info.value)
