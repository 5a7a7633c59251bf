"""Event reservoir: time-ordered events in compressed chunks (Railgun 4.1.1).

Events (a timestamp and a tuple of column values) are appended in timestamp
order into an in-memory open region. When the open region holds a full
chunk, the chunk is sealed: encoded as a compressed Arrow IPC block and
written to an append-only file (or kept as bytes in memory when no directory
is given), with an in-memory index from global position and timestamp to
chunk. Readers walk the reservoir with cursors; a cursor keeps only its
current chunk decoded, a bounded LRU cache holds a few more, and entering a
chunk prefetches the next one on a background thread. So memory does not
grow with the span of time the reservoir covers.

Out-of-order events are accepted while they land in the open region (not
before the last sealed timestamp): :meth:`EventReservoir.seal` is called by
the owner only for events older than its allowed disorder.

Files are read as data, never as code: object columns of a reservoir on disk
take only plain values (None, bool, int, float, str, bytes and containers of
them), pickled, and read back by an unpickler that resolves no class or
function. A file altered to hold anything else raises :class:`ReservoirError`.
"""
from __future__ import annotations

import bisect
import io
import itertools
import os
import pickle
import struct
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from beam_ext.errors import BeamExtError
from beam_ext.state._arrow_blocks import CorruptBlockError, decode_batch, encode_batch

__all__ = ["Cursor", "EventReservoir", "ReservoirError"]

FLOAT = "float"
OBJECT = "object"
_KINDS = (FLOAT, OBJECT)
# offset, length, start index, count, min ts, max ts
_INDEX_ENTRY = struct.Struct("<QQQQdd")

Row = tuple
_Chunk = tuple[list[float], list[Row]]

# What an object column on disk may hold: pickles of these name no class or
# function, so unpickling them with every global refused still works.
_PLAIN_ATOMS = frozenset({type(None), bool, int, float, str, bytes})
_PLAIN_CONTAINERS = frozenset({tuple, list, set, frozenset})
_PLAIN = "None, bool, int, float, str, bytes, and tuples, lists, sets and dicts of them"


class ReservoirError(BeamExtError, RuntimeError):
    """A reservoir file cannot be read back: damaged, or not written by the reservoir."""


def _foreign_type(value: Any) -> type | None:
    """The first type inside ``value`` that is not plain data, or None if all is plain."""
    t = type(value)
    if t in _PLAIN_ATOMS:
        return None
    if t is dict:
        inner = itertools.chain.from_iterable(value.items())
    elif t in _PLAIN_CONTAINERS:
        inner = value
    else:
        return t
    for v in inner:
        found = _foreign_type(v)
        if found is not None:
            return found
    return None


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: every class or function a pickle names is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only plain data is read")


class EventReservoir:
    """Time-ordered rows ``(ts, values)`` in compressed chunks.

    ``kinds`` gives each value column's type: ``"float"`` (stored as
    float64, nulls as NaN) or ``"object"`` (any picklable value in memory;
    on disk only plain data: None, bool, int, float, str, bytes and tuples,
    lists, sets and dicts of them, so reading the files never runs code).
    With ``directory`` the chunks go to ``directory/chunks.bin`` and the
    index to ``directory/index.bin``; reopening the directory continues where
    :meth:`close` left off; a damaged or altered file raises
    :class:`ReservoirError` naming it. Without ``directory`` chunks stay in
    memory as compressed bytes (and the reservoir pickles, for Beam state).

    Positions are global: the first event ever appended is position 0, and
    :meth:`truncate` forgets whole chunks before a position without
    renumbering. Append is O(1) amortised, reading the next row of a cursor is
    O(1) amortised, locating a timestamp is O(log chunks + chunk_size).

    >>> r = EventReservoir(["float"], chunk_size=2)
    >>> for t in (1.0, 2.0, 3.0): _ = r.append(t, (t * 10,))
    >>> r.seal(10.0); r.row(1), len(r), r.sealed_end
    ((2.0, (20.0,)), 3, 2)
    """

    def __init__(self, kinds: Sequence[str], directory: str | None = None,
                 chunk_size: int = 4096, cache_chunks: int = 8, prefetch: bool = True) -> None:
        for k in kinds:
            if k not in _KINDS:
                raise ValueError(f"kinds: unknown column kind {k!r}, expected one of {_KINDS}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        if cache_chunks < 1:
            raise ValueError(f"cache_chunks must be >= 1, got {cache_chunks}")
        self.kinds = tuple(kinds)
        self.chunk_size = chunk_size
        self.cache_chunks = cache_chunks
        self.directory = directory
        self._prefetch = prefetch and directory is not None
        # Object columns whose values must stay plain: those that go to disk.
        self._plain_columns = [i for i, k in enumerate(self.kinds)
                               if k == OBJECT and directory is not None]
        self._schema = pa.schema([("ts", pa.float64())] + [
            (f"c{i}", pa.float64() if k == FLOAT else pa.binary()) for i, k in enumerate(self.kinds)])
        # Index of sealed chunks, parallel lists (chunk number = list position).
        self._starts: list[int] = []
        self._counts: list[int] = []
        self._min_ts: list[float] = []
        self._max_ts: list[float] = []
        self._where: list[tuple[int, int]] = []  # file offset/length, or (-1, -1)
        self._blobs: dict[int, bytes] = {}  # in-memory store
        self._first_chunk = 0  # chunks before this were truncated
        self._open_ts: list[float] = []
        self._open_rows: list[Row] = []
        self._cache: OrderedDict[int, _Chunk] = OrderedDict()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._data_fd = -1
        self._index_file = None
        self._file_end = 0
        self.loads = 0  # chunk decodes, for tests and benchmarks
        if directory is not None:
            self._open_files()

    # -- persistence -------------------------------------------------------------

    def _open_files(self) -> None:
        """Open or create the directory's files and read the index; ReservoirError names the culprit."""
        index = os.path.join(self.directory, "index.bin")
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:  # a file on the way, no permission, read-only file system
            raise ReservoirError(f"cannot create the reservoir directory {self.directory!r}: "
                                 f"{e.strerror or e}") from e
        try:
            self._data_fd = os.open(self._data_path, os.O_RDWR | os.O_CREAT, 0o644)
            self._file_end = os.fstat(self._data_fd).st_size
            try:
                with open(index, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                if self._file_end:  # chunks.bin is created first, and only grows after index.bin
                    raise ReservoirError(f"{self._data_path} holds {self._file_end} bytes of "
                                         f"chunks, but their index {index} is missing") from None
                raw = b""
            self._read_index(index, raw)
            self._index_file = open(index, "ab")
        except BaseException as e:
            self.close()
            if isinstance(e, OSError):
                raise ReservoirError(f"cannot open the reservoir in {self.directory!r}: {e}") from e
            raise
        if self._prefetch:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reservoir-prefetch")

    def _read_index(self, index: str, raw: bytes) -> None:
        """Load the index entries, each checked against chunks.bin and the entries before it."""
        whole = len(raw) - len(raw) % _INDEX_ENTRY.size  # a torn last entry: never acknowledged
        for c, (off, length, start, count, lo, hi) in enumerate(_INDEX_ENTRY.iter_unpack(raw[:whole])):
            if off + length > self._file_end:
                raise ReservoirError(
                    f"{self._data_path} is {self._file_end} bytes, shorter than {index} says: "
                    f"chunk {c} ends at byte {off + length}; the file was truncated")
            if start != self.sealed_end:
                raise ReservoirError(f"{index}: chunk {c} starts at position {start}, but the "
                                     f"chunks before it end at {self.sealed_end}")
            if count < 1:
                raise ReservoirError(f"{index}: chunk {c} is listed with {count} rows")
            if not self.last_sealed_ts <= lo <= hi:  # NaN fails too
                raise ReservoirError(f"{index}: chunk {c}'s timestamps {lo}..{hi} are out of order "
                                     f"(the chunks before it end at {self.last_sealed_ts})")
            self._add_index(start, count, lo, hi, (off, length))

    def close(self) -> None:
        """Seal the open region (as a possibly short chunk) and release files."""
        if self._open_ts:
            self._seal_chunk(len(self._open_ts))
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._index_file is not None:
            self._index_file.close()
            self._index_file = None
        if self._data_fd >= 0:
            os.close(self._data_fd)
            self._data_fd = -1

    def __getstate__(self) -> dict:
        if self.directory is not None:
            raise TypeError("a reservoir backed by a directory cannot be pickled; reopen the directory")
        state = dict(self.__dict__)
        state.update(_cache=OrderedDict(), _pending={}, _lock=None, _pool=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- size and index ------------------------------------------------------------

    def __len__(self) -> int:
        """One past the last position."""
        return self.sealed_end + len(self._open_ts)

    @property
    def start(self) -> int:
        """The first position still stored."""
        if self._first_chunk < len(self._starts):
            return self._starts[self._first_chunk]
        return self.sealed_end

    @property
    def sealed_end(self) -> int:
        """Positions below this are in sealed (immutable) chunks."""
        return self._starts[-1] + self._counts[-1] if self._starts else 0

    @property
    def last_sealed_ts(self) -> float:
        return self._max_ts[-1] if self._max_ts else float("-inf")

    def _add_index(self, start: int, count: int, lo: float, hi: float, where: tuple[int, int]) -> None:
        self._starts.append(start)
        self._counts.append(count)
        self._min_ts.append(lo)
        self._max_ts.append(hi)
        self._where.append(where)

    # -- writing ---------------------------------------------------------------------

    def append(self, ts: float, row: Row) -> int:
        """Add a row at the end; ``ts`` must not be older than the last row."""
        last = self._open_ts[-1] if self._open_ts else self.last_sealed_ts
        if ts < last:
            raise ValueError(f"append: ts {ts} is older than the last event ({last}); use insert()")
        self._check_row(row)
        self._open_ts.append(ts)
        self._open_rows.append(row)
        return len(self) - 1

    def insert(self, ts: float, row: Row) -> int:
        """Add a row in timestamp order (after its equals); returns its position.

        Only the open region accepts out-of-order rows: ``ts`` must not be
        older than the last sealed row.
        """
        if ts < self.last_sealed_ts:
            raise ValueError(
                f"insert: ts {ts} is older than the last sealed event ({self.last_sealed_ts})")
        self._check_row(row)
        i = bisect.bisect_right(self._open_ts, ts)
        self._open_ts.insert(i, ts)
        self._open_rows.insert(i, row)
        return self.sealed_end + i

    def _check_row(self, row: Row) -> None:
        if len(row) != len(self.kinds):
            raise ValueError(f"row has {len(row)} values, the reservoir has {len(self.kinds)} columns: {row!r:.200}")
        for i in self._plain_columns:
            foreign = _foreign_type(row[i])
            if foreign is not None:
                raise TypeError(
                    f"column {i} ({OBJECT}) of the reservoir in {self.directory!r} takes only "
                    f"{_PLAIN}, so that reading its files back runs no code; got "
                    f"{foreign.__name__} in {row[i]!r:.100}")

    def seal(self, before: float) -> None:
        """Seal full chunks of the open region whose rows are all older than ``before``."""
        cs = self.chunk_size
        while len(self._open_ts) >= cs and self._open_ts[cs - 1] < before:
            self._seal_chunk(cs)

    def _seal_chunk(self, n: int) -> None:
        ts, rows = self._open_ts[:n], self._open_rows[:n]
        columns = [pa.array(ts, pa.float64())]
        for i, kind in enumerate(self.kinds):
            values = [r[i] for r in rows]
            if kind == FLOAT:
                columns.append(pa.array(values, pa.float64(), from_pandas=False))
            else:
                columns.append(pa.array([pickle.dumps(v, protocol=5) for v in values], pa.binary()))
        blob = encode_batch(pa.record_batch(columns, schema=self._schema))
        start = self.sealed_end
        if self.directory is not None:
            off = self._file_end
            self._write_chunk(blob, off)
            self._file_end += len(blob)
            try:
                self._index_file.write(_INDEX_ENTRY.pack(off, len(blob), start, n, ts[0], ts[-1]))
                self._index_file.flush()
            except OSError as e:
                raise ReservoirError(f"cannot write {self._index_file.name}: "
                                     f"{e.strerror or e}") from e
            where = (off, len(blob))
        else:
            self._blobs[len(self._starts)] = blob
            where = (-1, -1)
        self._add_index(start, n, ts[0], ts[-1], where)
        del self._open_ts[:n], self._open_rows[:n]

    def _write_chunk(self, blob: bytes, off: int) -> None:
        """Write ``blob`` at ``off`` of chunks.bin whole: a full disk may take only part of it."""
        view = memoryview(blob)
        try:
            while view:
                written = os.pwrite(self._data_fd, view, off)
                view, off = view[written:], off + written
        except OSError as e:  # the rows stay in the open region; nothing was indexed
            raise ReservoirError(f"cannot write {self._data_path}: {e.strerror or e}") from e

    def truncate(self, before: int) -> None:
        """Forget whole sealed chunks that end at or before position ``before``."""
        while (self._first_chunk < len(self._starts)
               and self._starts[self._first_chunk] + self._counts[self._first_chunk] <= before):
            c = self._first_chunk
            self._blobs.pop(c, None)
            self._cache.pop(c, None)
            self._first_chunk += 1

    # -- reading ---------------------------------------------------------------------

    def _chunk_of(self, pos: int) -> int:
        return bisect.bisect_right(self._starts, pos) - 1

    def _decode(self, c: int) -> _Chunk:
        off, length = self._where[c]
        if off < 0:  # made by this process (or restored with its Beam state)
            batch, loads = decode_batch(self._blobs[c]), pickle.loads
        else:
            batch, loads = self._read_chunk(c, off, length), self._plain_loads(c)
        ts = batch.column(0).to_pylist()
        cols = []
        for i, kind in enumerate(self.kinds):
            values = batch.column(i + 1).to_pylist()
            cols.append([float("nan") if v is None else v for v in values] if kind == FLOAT
                        else [loads(v) for v in values])
        self.loads += 1
        return ts, list(zip(*cols)) if cols else [()] * len(ts)

    def _read_chunk(self, c: int, off: int, length: int) -> pa.RecordBatch:
        try:
            batch = decode_batch(os.pread(self._data_fd, length, off))
        except CorruptBlockError as e:
            raise ReservoirError(
                f"{self._data_path}: chunk {c} (bytes {off}-{off + length}): {e}") from e
        if not batch.schema.equals(self._schema):
            found = ", ".join(f"{f.name}: {f.type}" for f in batch.schema)
            raise ReservoirError(f"{self._data_path}: chunk {c} has columns ({found}), not those "
                                 f"of kinds {list(self.kinds)}")
        if batch.num_rows != self._counts[c]:
            raise ReservoirError(f"{self._data_path}: chunk {c} holds {batch.num_rows} rows, its "
                                 f"index entry says {self._counts[c]}")
        ts = batch.column(0)
        if ts.null_count or (len(ts) > 1 and not pc.all(pc.less_equal(ts[:-1], ts[1:])).as_py()):
            # Locating a time bisects them: out of order, it finds a wrong position.
            raise ReservoirError(
                f"{self._data_path}: chunk {c} holds timestamps missing or out of order")
        first, last = ts[0].as_py(), ts[-1].as_py()
        if (first, last) != (self._min_ts[c], self._max_ts[c]):
            # An entry pointing at another whole chunk decodes fine: only this tells.
            raise ReservoirError(
                f"{self._data_path}: chunk {c} holds timestamps {first}..{last}, its index entry "
                f"says {self._min_ts[c]}..{self._max_ts[c]}")
        return batch

    def _plain_loads(self, c: int) -> Callable[[bytes], Any]:
        """``pickle.loads`` for chunk ``c`` of the file: plain data only, else ReservoirError."""
        def loads(data: bytes) -> Any:
            try:
                return _PlainUnpickler(io.BytesIO(data)).load()
            except Exception as e:  # bytes from disk can fail in any way; none runs code here
                raise ReservoirError(
                    f"{self._data_path}: chunk {c} holds a value that is not plain data ({e}); "
                    "the file was altered or not written by the reservoir") from e
        return loads

    @property
    def _data_path(self) -> str:
        return os.path.join(self.directory, "chunks.bin")

    def chunk(self, c: int) -> _Chunk:
        """Decoded chunk ``c``, from the cache or storage; prefetches ``c + 1``."""
        if c < self._first_chunk:
            raise IndexError(f"chunk {c} was truncated")
        got = self._cache.get(c)
        if got is not None:
            self._cache.move_to_end(c)
        else:
            fut = self._pending.pop(c, None)
            got = fut.result() if fut is not None else self._decode(c)
            self._cache[c] = got
            while len(self._cache) > self.cache_chunks:
                self._cache.popitem(last=False)
        nxt = c + 1
        if (self._pool is not None and nxt < len(self._starts) and nxt not in self._cache
                and nxt not in self._pending):
            self._pending[nxt] = self._pool.submit(self._decode, nxt)
        return got

    def row(self, pos: int) -> tuple[float, Row]:
        """``(ts, values)`` at a position (random access)."""
        se = self.sealed_end
        if pos >= se:
            i = pos - se
            return self._open_ts[i], self._open_rows[i]
        if pos < self.start:
            raise IndexError(f"position {pos} was truncated (reservoir starts at {self.start})")
        c = self._chunk_of(pos)
        ts, rows = self.chunk(c)
        i = pos - self._starts[c]
        return ts[i], rows[i]

    def locate(self, t: float) -> int:
        """The first stored position whose ts is greater than ``t``."""
        c = bisect.bisect_right(self._max_ts, t, lo=self._first_chunk)
        if c < len(self._starts):
            ts, _ = self.chunk(c)
            return self._starts[c] + bisect.bisect_right(ts, t)
        return self.sealed_end + bisect.bisect_right(self._open_ts, t)

    def cursor(self, pos: int) -> Cursor:
        """A forward reader starting at ``pos``."""
        return Cursor(self, pos)

    def _check(self) -> None:
        """Assert every invariant (for tests)."""
        for c in range(1, len(self._starts)):
            assert self._starts[c] == self._starts[c - 1] + self._counts[c - 1]
            assert self._min_ts[c] >= self._max_ts[c - 1]
        for c in range(len(self._starts)):
            assert self._counts[c] >= 1 and self._min_ts[c] <= self._max_ts[c]
        assert self._open_ts == sorted(self._open_ts)
        assert len(self._open_ts) == len(self._open_rows)
        if self._open_ts:
            assert self._open_ts[0] >= self.last_sealed_ts
        assert len(self._cache) <= self.cache_chunks
        assert all(c >= self._first_chunk for c in self._cache)
        if self.directory is None:
            assert set(self._blobs) == set(range(self._first_chunk, len(self._starts)))


class Cursor:
    """A forward iterator over a reservoir holding one decoded chunk.

    ``pos`` is public: an owner that inserts a row before the cursor moves
    it by one (:meth:`shift`).
    """

    __slots__ = ("_r", "pos", "_chunk_no", "_ts", "_rows", "_lo", "_hi")

    def __init__(self, reservoir: EventReservoir, pos: int) -> None:
        self._r = reservoir
        self.pos = pos
        self._chunk_no = -1
        self._ts: list[float] = []
        self._rows: list[Row] = []
        self._lo = self._hi = 0

    def shift(self, by: int = 1) -> None:
        self.pos += by

    def _load(self) -> bool:
        r = self._r
        pos = self.pos
        if pos >= r.sealed_end:
            return False
        c = r._chunk_of(pos)
        self._ts, self._rows = r.chunk(c)
        self._chunk_no = c
        self._lo = r._starts[c]
        self._hi = self._lo + r._counts[c]
        return True

    def peek_ts(self) -> float | None:
        """Timestamp at the cursor, None at the end."""
        pos = self.pos
        if not (self._lo <= pos < self._hi) and not self._load():
            r = self._r
            i = pos - r.sealed_end
            return r._open_ts[i] if i < len(r._open_ts) else None
        return self._ts[pos - self._lo]

    def take(self) -> tuple[float, Row]:
        """The row at the cursor; the cursor moves past it."""
        pos = self.pos
        if not (self._lo <= pos < self._hi) and not self._load():
            r = self._r
            i = pos - r.sealed_end
            self.pos = pos + 1
            return r._open_ts[i], r._open_rows[i]
        self.pos = pos + 1
        i = pos - self._lo
        return self._ts[i], self._rows[i]

    def release(self) -> None:
        """Drop the decoded chunk (e.g. before pickling the owner)."""
        self._chunk_no = -1
        self._ts, self._rows = [], []
        self._lo = self._hi = 0

    def __getstate__(self):
        return (self._r, self.pos)

    def __setstate__(self, state) -> None:
        self._r, self.pos = state
        self.release()
