"""Schema rows through a trivial grouping's shuffle as columns, not one ``RowCoder`` encoding each.

A ``GroupBy("key")`` of ``beam.Row`` elements shuffles every row. Beam's
``RowCoder`` encodes and decodes a row field by field in Python, close to a
microsecond a row each way for an int and a float (docs/benchmarks/runner.md,
"Schema rows through the shuffle as blocks of columns"); for rows of plain
fields the shuffle can do better. Where a grouping's values are rows whose
fields are all ``INT64``, ``DOUBLE``, ``STRING``, ``BOOLEAN``, ``BYTES`` or
Beam's Python ``Any`` (nullable or not), a task gathering a key's values
before the shuffle (:class:`~beam_ext.runner._shuffle.KeyedValues`) holds
each row's field values and writes a key's rows as one *block*
(:mod:`._value_blocks`) of the ``marshal`` encoding of the rows' columns. The reader turns a block back
into the named tuples ``RowCoder`` decodes to (the same class, the same
field values), or, for a stage reading encoded elements, into the rows'
``RowCoder`` encodings.

A block is written only where its values would round-trip through
``RowCoder`` unchanged: each value of exactly the field's type (for ``Any``,
an int, float, str, bytes or bool; ``None`` where the field is nullable),
ints within int64, strings that encode to UTF-8. Otherwise, and for keys of
fewer than :data:`_MIN_BLOCK_ROWS` rows, the rows are encoded by
``RowCoder``, which raises what it always raised for a value it refuses.
Blocks and encoded rows mix in one key's data (:mod:`._value_blocks`). The
writer and the reader run the same Python, so ``marshal``'s format is theirs.
"""
from __future__ import annotations

import functools
import marshal
from itertools import repeat
from operator import attrgetter
from typing import Any, Callable, Iterable

from apache_beam.coders.coders import (
    BooleanCoder,
    BytesCoder,
    Coder,
    FastPrimitivesCoder,
    FloatCoder,
    LengthPrefixCoder,
    StrUtf8Coder,
    VarIntCoder,
)
from apache_beam.coders.row_coder import RowCoder

from beam_ext.runner._value_blocks import block, only_block, parts

# The field coders a block stands in for: the Python types whose values each
# one decodes to the same type and value, and a value of one of them. Beam's
# RowCoder encodes a field of Beam's Python "Any" type with FastPrimitivesCoder.
_KINDS: dict[type, tuple[frozenset, Any]] = {
    VarIntCoder: (frozenset({int}), 0), FloatCoder: (frozenset({float}), 0.0),
    StrUtf8Coder: (frozenset({str}), ""), BooleanCoder: (frozenset({bool}), False),
    BytesCoder: (frozenset({bytes}), b""), FastPrimitivesCoder: (frozenset({int, float, str, bytes, bool}), 0)}
# What CPython holds per field value besides a str's or bytes' contents
# (an int or a float 24-32 bytes), and per row (its tuple and list slot).
_FIELD_BYTES = 32
_ROW_BYTES = 64
_INT64 = (-(1 << 63), (1 << 63) - 1)
# A key's rows held as fields: from 4 rows a block costs less, written and read,
# than RowCoder encodings made from the fields (benchmarks/row_blocks.py --held).
# Never below two: a reader decodes a record of one row as an encoding, unasked
# (GroupReader.read_batches).
_MIN_BLOCK_ROWS = 4


def _plain_named_tuple(cls: type) -> bool:
    """Whether ``cls(*fields)`` is ``tuple.__new__(cls, fields)``: a class
    made by ``collections.namedtuple`` (or ``typing.NamedTuple``), its
    ``__new__`` not overridden by a subclass."""
    for klass in cls.__mro__:
        if "__new__" in vars(klass):
            return "_make" in vars(klass) and "_fields" in vars(klass)
    return False


class RowColumns:
    """How one grouping's row values are written as blocks and read back.

    Example::

        rows = RowColumns.of(value_coder)   # None unless rows of plain fields
        data = rows.encode([rows.fields(r) for r in key_rows])
        assert rows.decode(data) == [coder.decode(coder.encode(r)) for r in key_rows]
    """

    def __init__(self, coder: LengthPrefixCoder) -> None:
        self._coder = coder
        row_coder = coder.value_coder()
        fields = row_coder.schema.fields
        names = [f.name for f in fields]
        kinds = [_KINDS[type(c)] for c in row_coder.components]
        self._checks = [(allowed, f.type.nullable) for (allowed, _), f in zip(kinds, fields)]
        self._sized = tuple(i for i, (allowed, _) in enumerate(kinds) if allowed & {str, bytes})
        self.row_bytes = _ROW_BYTES + _FIELD_BYTES * len(fields)
        get = attrgetter(*names)
        self.fields: Callable[[Any], tuple] = get if len(names) > 1 else lambda row: (get(row),)
        self._encode = coder.get_impl().encode_nested
        # A row's encoding, length-prefixed as the shuffle holds it, without decoding it.
        self._prefixed = LengthPrefixCoder(BytesCoder()).get_impl().encode_nested
        row_impl = row_coder.get_impl()
        self._decode_row = row_impl.decode
        # The class RowCoder decodes to, taken from a decode: it may be a
        # user's registered type rather than the one Beam generates.
        self._type = type(row_impl.decode(row_impl.encode(
            tuple.__new__(row_coder.to_type_hint(), [sample for _, sample in kinds]))))
        self._fast_new = _plain_named_tuple(self._type)
        type_ = self._type
        self._make: Callable[[tuple], Any] = (
            functools.partial(tuple.__new__, type_) if self._fast_new else lambda row: type_(*row))

    @staticmethod
    def of(value_coder: Coder) -> RowColumns | None:
        """The columns of a grouping whose value coder is ``value_coder``, or
        None unless it is a length-prefixed ``RowCoder`` of plain fields."""
        if type(value_coder) is not LengthPrefixCoder or type(value_coder.value_coder()) is not RowCoder:
            return None
        components = value_coder.value_coder().components
        if not components or any(type(c) not in _KINDS for c in components):
            return None
        return RowColumns(value_coder)

    def __reduce__(self):
        return RowColumns, (self._coder,)

    @property
    def sized(self) -> tuple[int, ...]:
        """The fields that may hold a str or bytes, whose length adds to a
        row's :attr:`row_bytes` in memory."""
        return self._sized

    def encode(self, rows: list[tuple]) -> bytes:
        """One key's rows (tuples of :attr:`fields`): a block, or their encodings."""
        if len(rows) >= _MIN_BLOCK_ROWS:
            columns = list(zip(*rows))
            if all(map(self._fits, columns, self._checks)):
                return block(marshal.dumps(columns))
        # RowCoder reads the fields by name from the rows a reader would get.
        return b"".join(map(self._encode, map(self._make, rows)))

    @staticmethod
    def _fits(column: tuple, check: tuple[frozenset, bool]) -> bool:
        """Whether every value of ``column`` round-trips through RowCoder as it is."""
        allowed, nullable = check
        kinds = set(map(type, column))
        alone = len(kinds) == 1  # the column's values are all of one type
        if nullable:
            kinds.discard(type(None))
        if not kinds <= allowed:
            return False
        if int in kinds:
            ints = column if alone else [v for v in column if type(v) is int]
            if not (_INT64[0] <= min(ints) and max(ints) <= _INT64[1]):
                return False
        if str in kinds:
            try:
                "".join(column if alone else [v for v in column if type(v) is str]).encode("utf-8")
            except UnicodeEncodeError:
                return False
        return True

    def decode(self, data: bytes) -> list:
        """The rows of ``data``: blocks and encodings of one key, in order."""
        payload = only_block(data)
        if payload is not None:
            return self._rows(marshal.loads(payload))
        out: list = []
        decode_row = self._decode_row
        for kind, part in parts(data):
            if kind:
                out.append(decode_row(part))
            else:
                out += self._rows(marshal.loads(part))
        return out

    def decode_all(self, pieces: Iterable[bytes]) -> list:
        out: list = []
        for piece in pieces:
            out += self.decode(piece)
        return out

    def encoded(self, data: bytes) -> bytes:
        """``data`` with its blocks replaced by their rows' encodings, as a
        reader of encoded elements takes them."""
        encode = self._encode
        return b"".join(self._prefixed(part) if kind else b"".join(map(encode, self._rows(marshal.loads(part))))
                        for kind, part in parts(data))

    def _rows(self, columns: list) -> list:
        if self._fast_new:
            return list(map(tuple.__new__, repeat(self._type), zip(*columns)))
        return list(map(self._type, *columns))
