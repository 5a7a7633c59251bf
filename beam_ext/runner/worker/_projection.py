"""A ``Map`` that only picks fields, run on columns.

``Map(lambda ef: {"id": ef[0]["id"], **ef[1]})`` after SlidingAggregate
builds a dict per event from two dicts per event; ``Map(lambda r: (r["key"],
r["amount"]))`` after ``ReadFromParquet`` a tuple per row from a dict of
every column per row. On a batch held as columns
(:class:`~beam_ext.runner._element_batches.Columns`) its output is a choice
of those columns, known without running it per element: the function is
called once on stand-ins for an element, whose fields are named column
references, and what it returns says which column each output field is.

Only functions that cannot tell a stand-in from a real element, nor do
anything else, are called so: their code reads nothing but its one argument
and constants (no global, builtin, attribute or closure names), calls
nothing, and only subscripts, unpacks and builds dicts, lists and tuples
(:data:`_OPCODES`). For such a function every element of a batch gets the
same choice of columns, since every element of a batch has the same keys;
one whose call on stand-ins fails or returns anything but a dict or tuple
of column references and constants, or one column reference, runs per
element, as before.
"""
from __future__ import annotations

import dis
import inspect
import types
from typing import Any, Callable

from beam_ext.runner._element_batches import PAIR, ROW, TUPLE, VALUE, Columns

#: The only operations a traced function may perform (CPython 3.11's names).
_OPCODES = frozenset({
    "RESUME", "NOP", "CACHE", "EXTENDED_ARG", "LOAD_FAST", "LOAD_CONST", "STORE_FAST", "POP_TOP", "COPY", "SWAP",
    "BINARY_SUBSCR", "UNPACK_SEQUENCE", "BUILD_MAP", "BUILD_CONST_KEY_MAP", "DICT_UPDATE", "DICT_MERGE",
    "BUILD_TUPLE", "BUILD_LIST", "LIST_EXTEND", "LIST_TO_TUPLE", "RETURN_VALUE",
})
_CONSTANTS = (str, int, float, bool, type(None))


class _Column:
    """Stands for a column's value in a traced call; any use but being placed in a result fails."""

    __slots__ = ("group", "name")

    def __init__(self, group: int, name: str) -> None:
        self.group, self.name = group, name

    def _refuse(self, *args: Any) -> Any:
        raise TypeError("a column stand-in has no value")

    __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _refuse
    __len__ = __iter__ = __contains__ = __getitem__ = __index__ = __format__ = __str__ = _refuse


class _Row:
    """Stands for a row dict of one group: its keys are the columns' names."""

    __slots__ = ("_group", "_names")

    def __init__(self, group: int, names: tuple[str, ...]) -> None:
        self._group, self._names = group, names

    def keys(self) -> tuple[str, ...]:
        return self._names

    def __getitem__(self, name: Any) -> _Column:
        if type(name) is not str or name not in self._names:
            raise KeyError(name)
        return _Column(self._group, name)

    def __iter__(self) -> Any:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: Any) -> bool:
        return name in self._names


def traceable(fn: Callable) -> bool:
    """Whether ``fn`` may be called on stand-ins: see the module's docstring."""
    code = getattr(fn, "__code__", None)
    if (not isinstance(fn, types.FunctionType) or code.co_names or code.co_freevars or code.co_cellvars
            or code.co_argcount != 1 or code.co_kwonlyargcount or fn.__defaults__ or fn.__kwdefaults__
            or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR
                                | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE)
            or any(isinstance(const, types.CodeType) for const in code.co_consts)):
        return False
    return all(instruction.opname in _OPCODES for instruction in dis.get_instructions(code))


def _stand_in(names: tuple[tuple[str, ...], ...], shape: str) -> Any:
    """An element of a :class:`Columns` batch of ``shape`` whose groups have ``names``, as stand-ins."""
    if shape in (TUPLE, VALUE):
        columns = tuple(_Column(index, group[0]) for index, group in enumerate(names))
        return columns if shape == TUPLE else columns[0]
    rows = tuple(_Row(index, group) for index, group in enumerate(names))
    return rows if shape == PAIR else rows[0]


def _spec(value: Any) -> tuple | None:
    if type(value) is _Column:
        return ("column", value.group, value.name)
    if type(value) in _CONSTANTS:
        return ("constant", value)
    return None


def projection(fn: Callable, names: tuple[tuple[str, ...], ...], shape: str) -> tuple[str, Any] | None:
    """What ``fn`` makes of an element of a :class:`Columns` batch of
    ``shape`` whose groups have ``names``: ``(ROW, {field: spec})`` for a
    dict, ``(TUPLE, [spec, ...])`` for a tuple, ``(VALUE, [spec])`` for one
    field's value, each spec a column
    ``("column", group, name)`` or a ``("constant", value)``; None if
    ``fn`` must run per element."""
    if not traceable(fn) or any(len(set(group)) != len(group) for group in names):
        return None
    try:
        result = fn(_stand_in(names, shape))
    except Exception:  # noqa: BLE001 - an element would fail too: it runs per element, failing there
        return None
    if type(result) is dict:
        if not all(type(field) is str for field in result):
            return None
        fields = {field: _spec(value) for field, value in result.items()}
        return None if None in fields.values() else (ROW, fields)
    if type(result) is tuple and result:
        items = [_spec(value) for value in result]
        return None if None in items else (TUPLE, items)
    if type(result) is _Column:
        return VALUE, [_spec(result)]
    return None


def project(picked: tuple[str, Any], batch: Columns) -> Columns:
    """``batch``'s elements as :func:`projection`'s ``picked`` makes them, as columns."""
    shape, specs = picked
    groups = [dict(group) for group in batch.groups]

    def column(spec: tuple) -> Any:
        return groups[spec[1]][spec[2]] if spec[0] == "column" else [spec[1]] * batch.size
    if shape == ROW:
        return Columns((tuple((field, column(spec)) for field, spec in specs.items()),), ROW, batch.size)
    return Columns(tuple(((str(index), column(spec)),) for index, spec in enumerate(specs)), shape, batch.size)
