"""Objects Beam pickles one by one, through a trivial grouping's shuffle pickled many at a time.

A ``GroupByKey`` of values without a coder of their own (numpy arrays,
dataclasses, a user's classes) shuffles them with Beam's
``FastPrimitivesCoder``, which hands every value of a type it has no
encoding for to ``pickle.dumps``, one call per value: 8.3 µs to pickle and
6.1 µs to unpickle a numpy array of four ints, in 159 bytes, where a block of
1,000 of them takes 2.0 and 1.4 µs a value, in 57 bytes (the class and
``dtype`` written once); a small dataclass 1.6 and 1.7 µs, against 0.6 and
1.0 µs (``benchmarks/pickled_blocks.py``).

Where a grouping's value coder is that coder (length-prefixed, falling back
to Beam's ``PickleCoder``), a task gathering a key's values before the
shuffle (:class:`~beam_ext.runner._shuffle.KeyedValues`) holds such values
as objects, and pickles each key's held ones as a list, in one *block*
(:mod:`._value_blocks`). Values of a type ``FastPrimitivesCoder`` encodes
itself (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``,
``tuple``, ``dict``, ``set``, the iterables Beam registers) stay Beam's
encodings: a type is asked of Beam's coder once, by encoding its first
value. The reader unpickles a block into the values, or, for a stage reading
encoded elements, into their ``FastPrimitivesCoder`` encodings.

A value comes out equal to what ``pickle.loads(pickle.dumps(value))``, Beam's
own round trip, gives, with one difference: values of one block that held
the same object (or objects referring to one object) come out holding one
object, not copies. Beam's model forbids changing an input element in
place, so only a DoFn breaking that rule can tell. Where the list fails to
pickle, its values are encoded one by one, and Beam's coder raises what it
always raised for the value it refuses.
"""
from __future__ import annotations

import pickle
from typing import Any, Iterable

from apache_beam.coders.coders import BytesCoder, Coder, FastPrimitivesCoder, LengthPrefixCoder, PickleCoder

from beam_ext.runner._value_blocks import block, only_block, parts

# Types FastPrimitivesCoderImpl encodes itself, not through its fallback, known
# without asking it (an int beyond 64 bits goes to the fallback, but staying one
# encoding per value costs nothing).
OWN_TYPES = frozenset({type(None), bool, int, float, bytes, str, list, tuple, dict, set})
# The first byte of FastPrimitivesCoder's encoding of a value it hands to its fallback.
_UNKNOWN_TYPE = FastPrimitivesCoder().encode(object())[0]
# A key's held objects as one block from two on: a block of one costs a pickle call as before.
# Never below two: a reader decodes a record of one value as an encoding, unasked
# (GroupReader.read_batches).
_MIN_BLOCK_VALUES = 2


class PickledValues:
    """How one grouping's pickled values are written as blocks and read back.

    Example::

        objects = PickledValues.of(value_coder)   # None unless Beam's pickling FastPrimitivesCoder
        data = objects.encode([v for v in key_values if type(v) not in OWN_TYPES and objects.pickles(v)])
        assert objects.decode_all([data]) == [coder.decode(coder.encode(v)) for v in ...]
    """

    def __init__(self, coder: LengthPrefixCoder) -> None:
        self._coder = coder
        impl = coder.get_impl()
        self._encode = impl.encode_nested
        inner = coder.value_coder().get_impl()
        self._decode = inner.decode
        self._encode_one = inner.encode
        self._prefixed = LengthPrefixCoder(BytesCoder()).get_impl().encode_nested
        self._pickles: dict[type, bool] = {}  # per type outside OWN_TYPES: whether Beam pickles it

    @staticmethod
    def of(value_coder: Coder) -> PickledValues | None:
        """The pickled values of a grouping whose value coder is ``value_coder``, or None
        unless it is a length-prefixed ``FastPrimitivesCoder`` falling back to ``PickleCoder``."""
        if type(value_coder) is not LengthPrefixCoder:
            return None
        inner = value_coder.value_coder()
        if type(inner) is not FastPrimitivesCoder or type(inner._fallback_coder) is not PickleCoder:
            return None
        return PickledValues(value_coder)

    def __reduce__(self):
        return PickledValues, (self._coder,)

    def pickles(self, value: Any) -> bool:
        """Whether Beam's coder pickles ``value``, whose type is not one of :data:`OWN_TYPES`."""
        kind = type(value)
        pickles = self._pickles.get(kind)
        if pickles is None:
            try:
                pickles = self._encode_one(value)[0] == _UNKNOWN_TYPE
            except Exception:  # noqa: BLE001 - encoded one by one, where Beam's coder raises its own error
                return False
            self._pickles[kind] = pickles
        return pickles

    def encode(self, values: list) -> bytes:
        """Values of types Beam would pickle: one block, or their encodings where
        there are too few or the list does not pickle."""
        if len(values) >= _MIN_BLOCK_VALUES:
            try:
                return block(pickle.dumps(values, pickle.HIGHEST_PROTOCOL))
            except Exception:  # noqa: BLE001 - encoded one by one below, where Beam's coder raises its own error
                pass
        return b"".join(map(self._encode, values))

    def decode_all(self, pieces: Iterable[bytes]) -> list:
        """The values of a key's pieces: blocks and encodings, in order."""
        out: list = []
        decode = self._decode
        for piece in pieces:
            payload = only_block(piece)
            if payload is not None:
                out += pickle.loads(payload)
                continue
            for one, part in parts(piece):
                if one:
                    out.append(decode(part))
                else:
                    out += pickle.loads(part)
        return out

    def encoded(self, data: bytes) -> bytes:
        """``data`` with its blocks replaced by their values' encodings, as a
        reader of encoded elements takes them."""
        encode = self._encode
        return b"".join(self._prefixed(part) if one else b"".join(map(encode, pickle.loads(part)))
                        for one, part in parts(data))
