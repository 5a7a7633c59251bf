"""Check an LMDB data file against its own meta pages before LMDB maps it.

LMDB reads its data file through a memory map and trusts it: touching a page
past the end of a truncated file kills the process with SIGBUS. This module
reads the file with ordinary reads instead, so a damaged file becomes an
exception.

Layout (LMDB 0.9, ``mdb.c``; native byte order and sizes, as LMDB writes
them): pages 0 and 1 are meta pages, and LMDB uses the one with the higher
transaction id. Every page starts with a header (page number, flags, and
either the free-space bounds or, on overflow pages, a page count); a meta
page then holds the page size, two B-tree records (free list, main) and the
last page in use.

The last page in use does not bound the file from below: a page allocated
and freed again in one transaction is never written, so a valid file may end
before it. So the trees are walked, to find whether a page they use is
missing. The walk also refuses tree pages LMDB would trust blindly: a
branch pointing at a meta page, at itself or at a page already reached
makes LMDB abort the process on an assertion, or list a leaf's entries
twice. Free list records are checked too, since writers reuse the pages
they list: a page in use listed there would be overwritten. Named databases
and duplicate keys, which the spill store does not use, are not followed.

Example::

    check_data_file("/tmp/state/data.mdb")   # ValueError if truncated, damaged or not LMDB
"""
from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass

__all__ = ["DbRecord", "Meta", "PageCount", "check_data_file", "count_pages", "read_meta"]

_MAGIC = 0xBEEFC0DE
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META = 0x01, 0x02, 0x04, 0x08
_F_BIGDATA = 0x01  # a leaf's value lives on overflow pages
_P_INVALID = (1 << (8 * struct.calcsize("N"))) - 1  # root of an empty tree
_WIDE_PGNO = struct.calcsize("N") > 4  # page numbers above 32 bits borrow a node's flags field

# pgno, pad, flags, lower, upper; overflow pages hold a page count where lower/upper are.
_PAGE = struct.Struct("@NHHHH")
_OVERFLOW = struct.Struct("@NHHI")
# A tree's record: pad (the page size, in the free list's record), flags, depth,
# branch/leaf/overflow pages, entries, root.
_DB = "IHHNNNNN"
# Page header; magic, version, address, map size; free list and main records;
# last page in use, transaction id.
_META = struct.Struct("@NHHHH" + "IIPN" + _DB * 2 + "NN")
_NODE = struct.Struct("@IHH")  # size or child page (low 32 bits), flags (or high bits), key size
_PGNO = struct.Struct("@N")


@dataclass(frozen=True)
class DbRecord:
    """One B-tree of an LMDB file, as its meta page records it."""

    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int


@dataclass(frozen=True)
class Meta:
    """The meta page LMDB opens with: the one with the higher transaction id."""

    page_size: int
    last_page: int
    txnid: int
    free: DbRecord
    main: DbRecord


@dataclass
class PageCount:
    """Pages and entries of one tree found by walking it (the meta page counts the same)."""

    branch: int = 0
    leaf: int = 0
    overflow: int = 0
    entries: int = 0


def read_meta(path: str) -> Meta:
    """The current meta page of the LMDB data file ``path``. O(1).

    Raises ValueError if the file is not an LMDB data file or too short to
    hold both meta pages.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = _unpack_meta(path, f, 0, size)
        page_size = first[9]  # the free list record's pad holds the page size
        if page_size < _META.size or page_size & (page_size - 1):
            raise ValueError(f"{path}: meta page 0 gives page size {page_size}; the file is damaged")
        second = _unpack_meta(path, f, page_size, size)
    meta = max((first, second), key=lambda m: m[-1])  # LMDB: the higher txnid wins
    return Meta(page_size, meta[-2], meta[-1], DbRecord(*meta[11:17]), DbRecord(*meta[19:25]))


def _unpack_meta(path: str, f, offset: int, size: int) -> tuple:
    f.seek(offset)
    raw = f.read(_META.size)
    if len(raw) < _META.size:
        raise ValueError(f"{path} is {size} bytes, too short for its meta pages: the file was truncated")
    meta = _META.unpack(raw)
    if not meta[2] & _P_META or meta[5] != _MAGIC:
        raise ValueError(f"{path} is not an LMDB data file (no meta page at byte {offset})")
    return meta


def check_data_file(path: str) -> None:
    """Raise ValueError unless the trees of the last commit are whole and inside the file.

    A missing or empty file passes (LMDB starts a new environment).
    O(branch and leaf pages + overflow runs) reads, the order of listing
    every key once.
    """
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return
    if size == 0:
        return
    _walk(path, read_meta(path), size)


def count_pages(path: str) -> dict[str, PageCount]:
    """Walk both trees (``"free"``, ``"main"``) of the last commit, counting pages and entries."""
    meta = read_meta(path)
    return _walk(path, meta, os.path.getsize(path))


def _walk(path: str, meta: Meta, size: int) -> dict[str, PageCount]:
    """Read every page the free list and main trees use; raise ValueError if one is missing."""
    counts = {"free": PageCount(), "main": PageCount()}
    with open(path, "rb") as f:
        pages = _Pages(path, meta, size, f.fileno())
        seen: set[int] = set()
        for db, count in ((meta.free, counts["free"]), (meta.main, counts["main"])):
            if db.root == _P_INVALID:
                continue
            stack = [(db.root, db.depth)]  # (page, levels down to the leaves, inclusive)
            while stack:
                pgno, levels = stack.pop()
                if pgno in seen or levels < 1:  # a cycle, or deeper than the tree
                    raise pages.damaged(pgno, "referenced twice or below the leaves")
                seen.add(pgno)
                try:
                    _visit(pages, pgno, levels, stack, count, db is meta.free)
                except struct.error as e:  # offsets inside the page point outside it
                    raise pages.damaged(pgno, str(e)) from e
    _check_free_pages_unused(pages, seen)
    return counts


def _check_free_pages_unused(pages: _Pages, tree_pages: set[int]) -> None:
    """Refuse a free list that lists a page the trees use: a writer would overwrite it."""
    runs = sorted(pages.runs)
    starts = [first for first, _ in runs]
    for record_page, listed in pages.free_listed:
        i = bisect.bisect_right(starts, listed) - 1
        if listed in tree_pages or (i >= 0 and listed < runs[i][0] + runs[i][1]):
            raise pages.damaged(record_page, f"the free list lists page {listed}, which is in use")


def _visit(pages: _Pages, pgno: int, levels: int, stack: list, count: PageCount,
           free_list: bool) -> None:
    page = pages.read(pgno, pages.page_size)
    own, _, flags, lower, _ = _PAGE.unpack_from(page)
    if own != pgno or not flags & (_P_BRANCH | _P_LEAF):
        raise pages.damaged(pgno, f"not a tree page (header says page {own}, flags {flags:#x})")
    if bool(flags & _P_BRANCH) != (levels > 1):  # every leaf is at the tree's depth
        raise pages.damaged(pgno, f"a {'branch' if flags & _P_BRANCH else 'leaf'} page "
                                  f"{levels} levels above the leaves")
    n = (lower - _PAGE.size) // 2
    nodes = [(*_NODE.unpack_from(page, p), p)
             for p in struct.unpack_from(f"@{max(n, 0)}H", page, _PAGE.size)]
    if flags & _P_BRANCH:
        count.branch += 1
        # A branch node keeps its child's page number in the size and flags fields.
        stack.extend((low | (high << 32 if _WIDE_PGNO else 0), levels - 1)
                     for low, high, _, _ in nodes)
        return
    count.leaf += 1
    count.entries += len(nodes)
    for data_size, node_flags, key_size, p in nodes:
        at = p + _NODE.size + key_size
        if node_flags & _F_BIGDATA:
            (first,) = _PGNO.unpack_from(page, at)
            own, _, flags, run = _OVERFLOW.unpack_from(pages.read(first, _OVERFLOW.size))
            if own != first or not flags & _P_OVERFLOW or run < 1:
                raise pages.damaged(first, "not the start of an overflow run")
            pages.require(first, run)
            if data_size > run * pages.page_size - _PAGE.size:  # LMDB would read past the run
                raise pages.damaged(pgno, f"a {data_size}-byte value in a {run}-page run")
            count.overflow += run
            pages.runs.append((first, run))
            if free_list:
                data = os.pread(pages.fd, data_size, first * pages.page_size + _PAGE.size)
        elif at + data_size > len(page):
            raise pages.damaged(pgno, "a record runs past the end of its page")
        elif free_list:
            data = page[at:at + data_size]
        if free_list:
            _check_free_record(pages, pgno, page[p + _NODE.size:at], data)


def _check_free_record(pages: _Pages, pgno: int, key: bytes, data: bytes) -> None:
    """Refuse a free list record writers would trust: LMDB reuses the pages it lists.

    The key is the id of the transaction that freed the pages; the value a
    count and then that many page numbers, in descending order. A page in
    use listed there gets overwritten; a transaction id after the last
    makes LMDB abort the process on an assertion.
    """
    meta = pages.meta
    txnid = _PGNO.unpack(key)[0] if len(key) == _PGNO.size else -1
    if not 0 < txnid <= meta.txnid:
        raise pages.damaged(pgno, f"a free list record keyed {key.hex() if txnid < 0 else txnid}, "
                                  f"not a transaction up to {meta.txnid}")
    (n,) = _PGNO.unpack_from(data) if len(data) >= _PGNO.size else (-1,)
    if not 0 <= n < len(data) // _PGNO.size:
        raise pages.damaged(pgno, f"a free list record of {len(data)} bytes claims {n} pages")
    listed = struct.unpack_from(f"@{n}N", data, _PGNO.size)
    if any(not 2 <= x <= meta.last_page for x in listed) or any(
            a <= b for a, b in zip(listed, listed[1:])):
        raise pages.damaged(pgno, "a free list record lists pages out of order or outside "
                                  f"pages 2-{meta.last_page}")
    pages.free_listed.extend((pgno, x) for x in listed)


class _Pages:
    """Reads of one data file that refuse pages past its end."""

    def __init__(self, path: str, meta: Meta, size: int, fd: int) -> None:
        self.path, self.meta, self.size, self.fd = path, meta, size, fd
        self.page_size = meta.page_size
        self.runs: list[tuple[int, int]] = []  # (first page, pages) of every overflow run
        self.free_listed: list[tuple[int, int]] = []  # (record's page, page listed free)

    def require(self, pgno: int, n: int) -> None:
        end = (pgno + n) * self.page_size
        if end > self.size:
            raise ValueError(
                f"{self.path} is {self.size} bytes, but transaction {self.meta.txnid} uses "
                f"{'page' if n == 1 else f'{n} pages from page'} {pgno}, up to byte {end}: "
                "the file was truncated")

    def read(self, pgno: int, nbytes: int) -> bytes:
        self.require(pgno, 1)
        return os.pread(self.fd, nbytes, pgno * self.page_size)

    def damaged(self, pgno: int, why: str) -> ValueError:
        return ValueError(f"{self.path}: page {pgno} of transaction {self.meta.txnid} is damaged "
                          f"({why})")
