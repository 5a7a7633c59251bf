"""Event reservoir: seeded random actions against a plain list model."""
from __future__ import annotations

import bisect
import math
import os
import pickle
import random
from fractions import Fraction

import pyarrow as pa
import pytest

from beam_ext.state._arrow_blocks import encode_batch
from beam_ext.state.reservoir import _INDEX_ENTRY, EventReservoir, ReservoirError


def _row(rng: random.Random, t: float) -> tuple:
    return (rng.choice([t * 2, math.nan, -1e9]), rng.choice(["a", None, ("t", 1), 3]))


def _same(a: tuple, b: tuple) -> bool:
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("on_disk", [False, True])
def test_random_actions_against_list_model(tmp_path, seed, on_disk):
    rng = random.Random(seed)
    directory = str(tmp_path / "r") if on_disk else None

    def fresh() -> EventReservoir:
        return EventReservoir(["float", "object"], directory=directory,
                              chunk_size=rng.choice([1, 3, 8]), cache_chunks=2)

    r = fresh()
    model: list[tuple[float, tuple]] = []  # every row ever stored, by position
    start = 0
    clock = 0.0
    for _ in range(300):
        action = rng.random()
        if action < 0.45:
            clock += rng.choice([0.0, 0.5, 1.0])
            row = _row(rng, clock)
            assert r.append(clock, row) == len(model)
            model.append((clock, row))
        elif action < 0.6 and model:
            t = clock - rng.choice([0.0, 0.5, 1.5, 3.0])
            row = _row(rng, t)
            if t < r.last_sealed_ts:
                with pytest.raises(ValueError, match="older than the last sealed"):
                    r.insert(t, row)
            else:
                pos = r.insert(t, row)
                expect = bisect.bisect_right([m[0] for m in model], t)
                assert pos == expect
                model.insert(pos, (t, row))
        elif action < 0.7:
            r.seal(clock - rng.choice([0.0, 1.0, 2.0]))
        elif action < 0.75 and len(model) > start:
            r.truncate(rng.randint(start, len(model)))
            start = r.start
        elif action < 0.9 and len(model) > start:
            p = rng.randint(start, len(model) - 1)
            cur = r.cursor(p)
            for q in range(p, min(len(model), p + rng.randint(1, 12))):
                assert cur.peek_ts() == model[q][0]
                t, row = cur.take()
                assert t == model[q][0] and _same(row, model[q][1])
            if cur.pos == len(model):
                assert cur.peek_ts() is None
            t = rng.choice(model[start:])[0] + rng.choice([-0.25, 0.0, 0.25])
            assert r.locate(t) == max(start, bisect.bisect_right([m[0] for m in model], t))
        elif on_disk and action < 0.95:
            r.close()  # seals the open region; every row must survive
            r = fresh()
            assert len(r) == len(model)
            start = r.start if start <= r.start else start
            if start > r.start:
                r.truncate(start)
        elif not on_disk and action < 0.95:
            r = pickle.loads(pickle.dumps(r))
        assert len(r) == len(model)
        r._check()
    for p in range(r.start, len(model)):
        t, row = r.row(p)
        assert t == model[p][0] and _same(row, model[p][1])
    r.close()


def test_cache_is_bounded_and_next_chunk_is_prefetched(tmp_path):
    r = EventReservoir(["float"], directory=str(tmp_path), chunk_size=10, cache_chunks=3)
    for i in range(200):
        r.append(float(i), (float(i),))
    r.seal(1e9)
    cur = r.cursor(0)
    for i in range(200):
        assert cur.take() == (float(i), (float(i),))
        r._check()
    assert r.loads == 20  # each chunk decoded once: prefetch feeds the cache
    assert len(r._cache) <= 3
    r.close()


def test_memory_does_not_hold_sealed_rows_outside_the_cache():
    r = EventReservoir(["float"], chunk_size=100, cache_chunks=2)
    for i in range(10_000):
        r.append(float(i), (float(i),))
    r.seal(1e9)
    assert len(r._open_ts) == 0 and len(r._cache) == 0
    assert r.row(5_555) == (5555.0, (5555.0,))
    assert len(r._cache) == 1


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="chunk_size"):
        EventReservoir(["float"], chunk_size=0)
    with pytest.raises(ValueError, match="unknown column kind"):
        EventReservoir(["decimal"])
    r = EventReservoir(["float"])
    r.append(2.0, (1.0,))
    with pytest.raises(ValueError, match="use insert"):
        r.append(1.0, (1.0,))
    with pytest.raises(TypeError, match="cannot be pickled"):
        d = EventReservoir.__new__(EventReservoir)
        d.directory = "x"
        pickle.dumps(d)


class _RunsCode:
    """Unpickling this runs a shell command: what a hostile chunk file would hold."""

    def __init__(self, sentinel: str) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return os.system, (f"touch {self.sentinel}",)


def _write_chunk_file(directory, rows: list[tuple[float, bytes]]) -> None:
    """chunks.bin and index.bin holding one chunk of ``rows`` (ts, raw object cell)."""
    schema = pa.schema([("ts", pa.float64()), ("c0", pa.binary())])
    blob = encode_batch(pa.record_batch(
        [pa.array([t for t, _ in rows], pa.float64()), pa.array([c for _, c in rows], pa.binary())],
        schema=schema))
    (directory / "chunks.bin").write_bytes(blob)
    (directory / "index.bin").write_bytes(
        _INDEX_ENTRY.pack(0, len(blob), 0, len(rows), rows[0][0], rows[-1][0]))


def test_chunk_file_crafted_to_run_code_is_refused_without_running_it(tmp_path):
    sentinel = tmp_path / "ran"
    directory = tmp_path / "r"
    directory.mkdir()
    _write_chunk_file(directory, [(1.0, pickle.dumps("fine")),
                                  (2.0, pickle.dumps(_RunsCode(str(sentinel))))])
    r = EventReservoir(["object"], directory=str(directory))
    with pytest.raises(ReservoirError) as info:
        r.row(0)
    r.close()
    assert not sentinel.exists()
    assert str(directory / "chunks.bin") in str(info.value)
    assert "system" in str(info.value)  # names what it refused


def test_damaged_chunk_file_is_a_reservoir_error_naming_the_file(tmp_path):
    r = EventReservoir(["float", "object"], directory=str(tmp_path), chunk_size=4)
    for i in range(8):
        r.append(float(i), (float(i), f"v{i}"))
    r.seal(100.0)  # two chunks of four
    r.close()
    data = tmp_path / "chunks.bin"
    raw = bytearray(data.read_bytes())
    raw[12:40] = b"\xff" * 28  # the first chunk's lz4 frame
    data.write_bytes(bytes(raw))
    r = EventReservoir(["float", "object"], directory=str(tmp_path), chunk_size=4, prefetch=False)
    assert r.row(5) == (5.0, (5.0, "v5"))  # the second chunk is intact
    with pytest.raises(ReservoirError, match="corrupt") as info:
        r.row(0)
    r.close()
    assert str(data) in str(info.value) and "chunk 0" in str(info.value)


def test_disk_reservoir_takes_only_values_it_can_read_back_without_code(tmp_path):
    r = EventReservoir(["float", "object"], directory=str(tmp_path), chunk_size=2)
    plain = ("t", 1, 2.5, None, True, b"b", frozenset({1}), [1, {"k": (2, 3)}], {4})
    r.append(1.0, (1.0, plain))
    with pytest.raises(TypeError, match=r"column 1 .*Fraction"):
        r.append(2.0, (2.0, Fraction(1, 3)))
    with pytest.raises(TypeError, match=r"column 1 .*Fraction"):
        r.insert(2.0, (2.0, ("nested", Fraction(1, 3))))
    r.append(3.0, (3.0, "x"))
    r.close()
    again = EventReservoir(["float", "object"], directory=str(tmp_path), chunk_size=2)
    assert again.row(0) == (1.0, (1.0, plain)) and again.row(1) == (3.0, (3.0, "x"))
    again.close()
    memory = EventReservoir(["object"], chunk_size=1)  # in memory: any picklable value
    memory.append(1.0, (Fraction(1, 3),))
    memory.seal(2.0)
    assert memory.row(0) == (1.0, (Fraction(1, 3),))


def _three_chunks(directory) -> list[tuple]:
    """A closed reservoir of three chunks of four rows in ``directory``; its index entries."""
    r = EventReservoir(["float", "object"], directory=str(directory), chunk_size=4)
    for i in range(12):
        r.append(float(i), (float(i), f"v{i}"))
    r.seal(100.0)
    r.close()
    return list(_INDEX_ENTRY.iter_unpack((directory / "index.bin").read_bytes()))


@pytest.mark.parametrize("damage", ["truncated", "emptied", "removed"])
def test_chunk_file_shorter_than_its_index_is_an_error_naming_it(tmp_path, damage):
    # Chunks the index lists but the file lost were dropped without a word.
    entries = _three_chunks(tmp_path)
    data = tmp_path / "chunks.bin"
    if damage == "truncated":
        os.truncate(data, entries[2][0] + entries[2][1] - 10)  # into the last chunk
    elif damage == "emptied":
        os.truncate(data, 0)
    else:
        data.unlink()
    with pytest.raises(ReservoirError, match="shorter than") as info:
        EventReservoir(["float", "object"], directory=str(tmp_path), chunk_size=4)
    assert str(data) in str(info.value) and str(tmp_path / "index.bin") in str(info.value)


@pytest.mark.parametrize("entry, field, value, why", [
    (1, "start", 10, "starts at position 10"),
    (1, "count", 0, "0 rows"),
    (1, "count", 6, "starts at position 8"),  # the next chunk no longer follows it
    (2, "count", 6, "holds 4 rows"),
    (1, "lo", 50.0, "timestamps"),
    (1, "lo", math.nan, "timestamps"),
    (1, "off", 1 << 63, "shorter than"),
])
def test_index_entry_that_disagrees_with_the_chunks_is_an_error_naming_it(
        tmp_path, entry, field, value, why):
    entries = _three_chunks(tmp_path)
    names = ["off", "length", "start", "count", "lo", "hi"]
    bad = list(entries[entry])
    bad[names.index(field)] = value
    entries[entry] = tuple(bad)
    index = tmp_path / "index.bin"
    index.write_bytes(b"".join(_INDEX_ENTRY.pack(*e) for e in entries))
    with pytest.raises(ReservoirError, match=why) as info:
        r = EventReservoir(["float", "object"], directory=str(tmp_path), chunk_size=4,
                           prefetch=False)
        try:
            [r.row(i) for i in range(len(r))]
        finally:
            r.close()
    assert str(index) in str(info.value) or str(tmp_path / "chunks.bin") in str(info.value)


def test_torn_last_index_entry_is_still_ignored(tmp_path):
    # A process killed while appending an entry leaves a partial one: its
    # chunk was never acknowledged, so dropping it is no loss.
    _three_chunks(tmp_path)
    index = tmp_path / "index.bin"
    os.truncate(index, index.stat().st_size - 5)
    r = EventReservoir(["float", "object"], directory=str(tmp_path), chunk_size=4)
    assert len(r) == 8 and r.row(7) == (7.0, (7.0, "v7"))
    r.close()


@pytest.mark.parametrize("where", ["file at the path", "file above the path",
                                   "directory at index.bin", "directory at chunks.bin"])
def test_directory_that_cannot_hold_the_files_is_an_error_naming_the_path(tmp_path, where):
    directory = tmp_path / "r"
    if where == "file at the path":
        directory.write_text("x")
        culprit = directory
    elif where == "file above the path":
        (tmp_path / "f").write_text("x")
        directory = culprit = tmp_path / "f" / "r"
    else:
        culprit = directory / where.split()[-1]
        culprit.mkdir(parents=True)
    with pytest.raises(ReservoirError) as info:
        EventReservoir(["float"], directory=str(directory))
    assert str(culprit) in str(info.value)


def test_chunks_without_their_index_are_an_error_naming_both(tmp_path):
    _three_chunks(tmp_path)
    (tmp_path / "index.bin").unlink()
    with pytest.raises(ReservoirError, match="missing") as info:
        EventReservoir(["float", "object"], directory=str(tmp_path))
    assert str(tmp_path / "chunks.bin") in str(info.value)
    assert str(tmp_path / "index.bin") in str(info.value)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_is_a_reservoir_error_naming_the_file_and_keeps_the_rows(tmp_path):
    # /dev/full fails every write with ENOSPC, as a full disk does.
    (tmp_path / "chunks.bin").symlink_to("/dev/full")
    r = EventReservoir(["float"], directory=str(tmp_path), chunk_size=2)
    for i in range(3):
        r.append(float(i), (float(i),))
    with pytest.raises(ReservoirError, match="space") as info:
        r.seal(10.0)
    assert str(tmp_path / "chunks.bin") in str(info.value)
    assert [r.row(i) for i in range(3)] == [(float(i), (float(i),)) for i in range(3)]
    assert r.sealed_end == 0


def test_index_entries_pointing_at_each_others_chunks_are_an_error(tmp_path):
    # Both chunks decode and hold as many rows as their entries say: only
    # their timestamps tell that positions 0-3 would read rows 4-7.
    entries = _three_chunks(tmp_path)
    (e0, e1) = entries[:2]
    entries[0] = (e1[0], e1[1], *e0[2:])
    entries[1] = (e0[0], e0[1], *e1[2:])
    (tmp_path / "index.bin").write_bytes(b"".join(_INDEX_ENTRY.pack(*e) for e in entries))
    r = EventReservoir(["float", "object"], directory=str(tmp_path), chunk_size=4, prefetch=False)
    try:
        with pytest.raises(ReservoirError, match="timestamps") as info:
            r.row(0)
    finally:
        r.close()
    assert str(tmp_path / "chunks.bin") in str(info.value) and "chunk 0" in str(info.value)


@pytest.mark.parametrize("ts", [[1.0, 3.0, 2.0, 4.0], [1.0, None, 3.0, 4.0]])
def test_chunk_with_timestamps_out_of_order_or_missing_is_an_error(tmp_path, ts):
    # Locating a time bisects a chunk's timestamps: out of order, it finds
    # the wrong position without a word.
    schema = pa.schema([("ts", pa.float64()), ("c0", pa.float64())])
    blob = encode_batch(pa.record_batch(
        [pa.array(ts, pa.float64()), pa.array([1.0, 2.0, 3.0, 4.0], pa.float64())], schema=schema))
    (tmp_path / "chunks.bin").write_bytes(blob)
    (tmp_path / "index.bin").write_bytes(_INDEX_ENTRY.pack(0, len(blob), 0, 4, 1.0, 4.0))
    r = EventReservoir(["float"], directory=str(tmp_path), prefetch=False)
    try:
        with pytest.raises(ReservoirError, match="timestamps") as info:
            r.locate(2.5)
    finally:
        r.close()
    assert str(tmp_path / "chunks.bin") in str(info.value)
