"""Grouping encoded ``(key, value)`` pairs beyond memory: sorted runs on disk, merged by key.

:class:`ExternalGrouping` keeps each key's values as bytes in a dict. Once
the estimated memory they take passes the budget, the dict is written as a
run sorted by key bytes to a task-local temporary directory and emptied. At
the end the runs (and what is left in memory, sorted) are merged k-way, so
a key whose values went to several runs comes out once. Memory while
merging is one key's values plus a read buffer per run; without a spill
nothing is sorted and the groups come out of the dict as they are. Besides
single values it takes records of several values of one key
(:meth:`ExternalGrouping.add_counted`), which a task gathered before the
shuffle.

A run is a sequence of records ``>III`` (key length, value count, data
length), the key, then the data: the values' nested encodings, concatenated
(nested encodings delimit themselves, so the data of one key from several
runs is their concatenation).
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import operator
import os
import random
import shutil
import struct
import tempfile
from typing import Iterable, Iterator

# What CPython spends besides the bytes themselves: a bytes object (33) and a
# list slot (8) per value; a key's bytes object, its list and its dict entry.
VALUE_OVERHEAD = 48
KEY_OVERHEAD = 200
_HEADER = struct.Struct(">III")
_IO_BUFFER = 1 << 16
# Runs open at once while merging; past this, runs are merged into one first.
_MAX_FAN_IN = 64

Group = tuple[bytes, int, list[bytes]]  # encoded key, value count, pieces of the values' encodings


@dataclasses.dataclass
class SpillStats:
    """Runs written from memory to disk by one grouping, and their bytes."""

    runs: int = 0
    bytes: int = 0


def _local_root() -> str:
    # Spark gives its Python workers its local directories (spark.local.dir,
    # the cluster manager's) in SPARK_LOCAL_DIRS: disks meant for shuffle files.
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d and os.path.isdir(d)]
    return random.choice(dirs) if dirs else tempfile.gettempdir()


def _read_run(path: str) -> Iterator[tuple[bytes, int, bytes]]:
    with open(path, "rb", buffering=_IO_BUFFER) as f:
        read, unpack, size = f.read, _HEADER.unpack, _HEADER.size
        while header := read(size):
            if len(header) != size:
                raise OSError(f"group spill run {path} is truncated")
            key_length, count, data_length = unpack(header)
            key, data = read(key_length), read(data_length)
            if len(key) != key_length or len(data) != data_length:
                raise OSError(f"group spill run {path} is truncated")
            yield key, count, data


def _merge(sources: Iterable[Iterable[tuple[bytes, int, bytes]]]) -> Iterator[Group]:
    """Sources sorted by key, each key once per source -> one group per key.

    Equal keys keep the order of ``sources``: values stay in arrival order.
    """
    first = operator.itemgetter(0)
    for key, records in itertools.groupby(heapq.merge(*sources, key=first), key=first):
        count, pieces = 0, []
        for _, n, data in records:
            count += n
            pieces.append(data)
        yield key, count, pieces


class ExternalGrouping:
    """Groups ``(encoded key, encoded value)`` pairs within ``memory_bytes``, spilling sorted runs.

    Example::

        grouping = ExternalGrouping(memory_bytes=64 << 10)
        try:
            grouping.add_all(pairs)
            for key, count, pieces in grouping.groups():
                ...   # b"".join(pieces): the nested encodings of ``count`` values
        finally:
            grouping.close()

    Cost: a dict insert per pair; each spill sorts the keys held
    (O(k log k)) and writes them once; the final merge reads every run once
    (O(n log r) for r runs, at most 64 open at a time).
    """

    def __init__(self, memory_bytes: int, stats: SpillStats | None = None) -> None:
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 1:
            raise ValueError(f"memory_bytes must be a positive integer, got {memory_bytes!r}")
        self._budget = memory_bytes
        self._stats = stats if stats is not None else SpillStats()
        self._table: dict[bytes, list[bytes]] = {}
        # Values beyond one per piece, for keys given pieces of several values (add_counted).
        self._extra: dict[bytes, int] = {}
        self._held = 0
        self._dir: str | None = None
        self._runs: list[str] = []
        self._made = 0  # run files made so far, for unique names

    @property
    def stats(self) -> SpillStats:
        return self._stats

    def add_all(self, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        """Adds ``(key, value)`` pairs, spilling a run whenever the held bytes pass the budget."""
        self.add_counted((key, 1, value) for key, value in pairs)

    def add_counted(self, records: Iterable[tuple[bytes, int, bytes]]) -> None:
        """Adds ``(key, count, data)`` records, ``data`` the nested encodings of
        ``count`` values (one value read from a pair, or a key's values
        gathered before the shuffle), spilling a run whenever the held bytes
        pass the budget."""
        table, extra = self._table, self._extra
        get = table.get
        held, budget = self._held, self._budget
        for key, count, data in records:
            values = get(key)
            if values is None:
                table[key] = [data]
                held += len(key) + len(data) + KEY_OVERHEAD
            else:
                values.append(data)
                held += len(data) + VALUE_OVERHEAD
            if count != 1:
                extra[key] = extra.get(key, 0) + count - 1
            if held > budget:
                self._spill()
                held = 0
        self._held = held

    def _count(self, key: bytes, values: list[bytes]) -> int:
        return len(values) + self._extra.pop(key, 0) if self._extra else len(values)

    def groups(self) -> Iterator[Group]:
        """Every key once, with all its values; call once, after :meth:`add_all`."""
        table = self._table
        if not self._runs:
            for key, values in table.items():
                yield key, self._count(key, values), values
            return
        # What is left in memory joins the merge sorted, without a run of its own.
        in_memory = ((key, self._count(key, values), b"".join(values))
                     for key in sorted(table) for values in (table.pop(key),))
        self._held = 0
        yield from _merge([*map(_read_run, self._runs), in_memory])

    def close(self) -> None:
        """Deletes the runs; safe to call twice and while :meth:`groups` is unfinished."""
        self._table.clear()
        self._extra.clear()
        self._runs = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _new_path(self) -> str:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="beam_ext-group-", dir=_local_root())
        self._made += 1
        return os.path.join(self._dir, f"run{self._made}")

    def _write_run(self, records: Iterable[tuple[bytes, int, bytes]]) -> tuple[str, int]:
        path = self._new_path()
        pack = _HEADER.pack
        with open(path, "wb", buffering=_IO_BUFFER) as f:
            write = f.write
            for key, count, data in records:
                write(pack(len(key), count, len(data)))
                write(key)
                write(data)
            return path, f.tell()

    def _spill(self) -> None:
        table = self._table
        # Popping as the run is written frees the memory as it goes.
        path, size = self._write_run((key, self._count(key, values), b"".join(values))
                                     for key in sorted(table) for values in (table.pop(key),))
        self._runs.append(path)
        self._stats.runs += 1
        self._stats.bytes += size
        if len(self._runs) >= _MAX_FAN_IN:
            runs = self._runs
            merged = ((key, count, b"".join(pieces)) for key, count, pieces in _merge(map(_read_run, runs)))
            self._runs = [self._write_run(merged)[0]]
            for old in runs:
                os.remove(old)

    def _check(self) -> None:
        """Asserts the invariants: runs exist in the directory, the table's bytes are within budget."""
        assert all(os.path.exists(path) for path in self._runs)
        assert len(self._runs) < _MAX_FAN_IN
        assert self._dir is not None or not self._runs
        assert self._held <= self._budget
        assert self._held >= sum(len(k) + sum(map(len, v)) for k, v in self._table.items())
        assert self._extra.keys() <= self._table.keys()
