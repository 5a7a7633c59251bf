"""An ``AsMultiMap`` side input read by a stage on element objects.

Beam's bundle processor hands a multimap side input's view function a
``MultiMap``: an object whose only operation is ``view[key]``, giving the
key's values in the side input's order, and no values for a key the side
input lacks. It reads them over the Fn API's state calls, all at once
where the side input has at most 100 keys (each key's values then a
list), key by key past that (each a lazy iterable). A stage on element
objects has every element of the side input in its task already, so
:class:`MultiMap` groups them once and gives each key's values as a list:
the values and their order are the bundle processor's, and a list is what
it gives below 100 keys.

Keys are compared by equality, as Beam's all-at-once read compares them
(its key-by-key read compares encodings, which tells ``1`` from ``1.0``).
A key Python cannot hash (a list) cannot be looked up, in Beam either:
``view[[1]]`` raises ``TypeError``; the side input's other keys still are.
"""
from __future__ import annotations

from typing import Any


class MultiMap:
    """``view[key]``: the key's values, a list (empty for a key not in the side input).

    Example::

        view = MultiMap([(1, "a"), (2, "b"), (1, "c")])
        view[1], view[3]   # (['a', 'c'], [])
    """

    __slots__ = ("_by_key",)

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        by_key: dict[Any, list] = {}
        for key, value in pairs:
            try:
                values = by_key.get(key)
            except TypeError:  # unhashable: no lookup can reach it
                continue
            if values is None:
                by_key[key] = [value]
            else:
                values.append(value)
        self._by_key = by_key

    def __getitem__(self, key: Any) -> list:
        values = self._by_key.get(key)
        return [] if values is None else values

    def __reduce__(self):
        # As Beam's MultiMap: a view is read in its task, never shipped.
        raise TypeError("an AsMultiMap side input's view cannot be pickled")
