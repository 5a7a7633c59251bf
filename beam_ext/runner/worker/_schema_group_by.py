"""Beam's schema-aware ``GroupBy`` read by field name, without its per-element lambdas.

Beam expands ``GroupBy("k").aggregate_field("x", sum, "total")`` into a
``Map`` making each element's ``(Key(k=...), [x, ...])`` pair, through
several lambdas and a named tuple per element, then a ``CombinePerKey`` of
a ``TupleCombineFn``. When the combine keeps plain accumulators
(:mod:`beam_ext.runner.worker._plain_accumulators`), the pairs are read
without them: fields named by strings with ``operator.attrgetter``, in C
(all of them at once where every key, or every value, is one), and a
callable key or value (``GroupBy(lambda x: ...)``) by calling it, once per
element, as Beam does. A key becomes Beam's ``Key`` row only once per
partial accumulator, when the combine emits it (:func:`aggregated_fields`).
``benchmarks/runner_ab.py rows`` times a pipeline that has one, and
``groupby_lambda`` of ``benchmarks/runner_common.py`` one grouping plain
numbers by a lambda.

A ``GroupBy`` without aggregation expands into a ``Map`` making
``(key, element)`` pairs that builds its key function anew for every
element; :func:`grouped_pairs` builds it once, reading string fields with
``operator.attrgetter``. Right before a shuffle that gathers each key's
values, the pairs need not be made one by one at all: the shuffle's writer
takes the elements and :func:`grouped_key`.

The ``Map``s are recognised by the code of Beam's lambdas (which pickling
copies but keeps equal) and read through their closures;
``tests/test_schema_group_by.py`` fails if a Beam release changes them.
"""
from __future__ import annotations

import dataclasses
import functools
import types
from operator import attrgetter
from typing import Any, Callable, NamedTuple


def closure(fn: Callable) -> dict:
    """The variables a nested function reads from its enclosing scope, by name."""
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__ or ())))


@dataclasses.dataclass(frozen=True)
class AggregatedFields:
    """What a ``GroupBy(...).aggregate_field(...)`` groups by and aggregates
    (each a field named by a string, or a callable), and Beam's maker of its ``Key`` rows."""

    key_fields: tuple[str | Callable, ...]
    value_fields: tuple[str | Callable, ...]
    key_type: Callable[..., tuple]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_read_key", _reader(self.key_fields))
        object.__setattr__(self, "_read_value", _reader(self.value_fields))

    def pairs(self, rows: list) -> list:
        """``(key, value)`` pairs of ``rows``: the key is the key expression's
        value, or the tuple of the key expressions' values; the value likewise."""
        return list(zip(map(self._read_key, rows), map(self._read_value, rows)))

    def key(self, raw: Any) -> tuple:
        """Beam's ``Key`` row of a key of :meth:`pairs`."""
        return self.key_type(raw) if len(self.key_fields) == 1 else self.key_type(*raw)


def _reader(exprs: tuple[str | Callable, ...]) -> Callable:
    """A function of an element giving its value of the one expression of
    ``exprs``, or the tuple of its values of several, each computed once."""
    if all(type(expr) is str for expr in exprs):
        return attrgetter(*exprs)
    calls = tuple(attrgetter(expr) if type(expr) is str else expr for expr in exprs)
    if len(calls) == 1:
        return calls[0]
    return lambda element: tuple([call(element) for call in calls])


def _lambdas(code: types.CodeType) -> dict:
    return {frozenset(const.co_freevars): const for const in code.co_consts
            if isinstance(const, types.CodeType) and const.co_name == "<lambda>"}


class _BeamsCodes(NamedTuple):
    pair: types.CodeType  # aggregate_field's Map: (key_func(x), value_func(x))
    key: types.CodeType  # a key of several fields, or of one forced to a tuple
    values: types.CodeType  # aggregate_field's values
    field: types.CodeType  # a field named by a string
    grouped: types.CodeType  # GroupBy's Map: (self._key_func()(x), x)


@functools.cache
def _beams_codes() -> _BeamsCodes | None:
    """The codes of Beam's lambdas; None if this Beam release has other ones."""
    from apache_beam.transforms import core

    try:
        expand = _lambdas(core._GroupAndAggregate.expand.__code__)
        return _BeamsCodes(expand[frozenset(("key_func", "value_func"))],
                           _lambdas(core.GroupBy._key_func.__code__)[frozenset(("key_exprs", "key_type"))],
                           expand[frozenset(("value_exprs",))],
                           _lambdas(core._expr_to_callable.__code__)[frozenset(("expr",))],
                           _lambdas(core.GroupBy.expand.__code__)[frozenset(("self",))])
    except (AttributeError, KeyError):
        return None


def _field_names(exprs: Any, field_code: types.CodeType) -> tuple[str, ...] | None:
    names = []
    for expr in exprs:
        if getattr(expr, "__code__", None) != field_code:
            return None
        name = closure(expr)["expr"]
        if type(name) is not str:
            return None
        names.append(name)
    return tuple(names) if names else None


def _expressions(exprs: Any, field_code: types.CodeType) -> tuple[str | Callable, ...] | None:
    """Each of ``exprs`` (Beam's callables of ``_expr_to_callable``) as the
    field name it reads, or as itself where it is the user's callable."""
    out: list[str | Callable] = []
    for expr in exprs:
        named = _field_names((expr,), field_code)
        if named is not None:
            out.append(named[0])
        elif callable(expr) and getattr(expr, "__code__", None) != field_code:
            out.append(expr)
        else:
            return None
    return tuple(out) if out else None


def aggregated_fields(fn: Callable) -> AggregatedFields | None:
    """The keys and values of ``fn`` if it is the ``Map`` function of a
    ``GroupBy(...).aggregate_field(...)``; else None."""
    codes = _beams_codes()
    if codes is None or getattr(fn, "__code__", None) != codes.pair:
        return None
    outer = closure(fn)
    key_func, value_func = outer["key_func"], outer["value_func"]
    if getattr(key_func, "__code__", None) != codes.key or getattr(value_func, "__code__", None) != codes.values:
        return None
    keyed = closure(key_func)
    key_fields = _expressions(keyed["key_exprs"], codes.field)
    value_fields = _expressions(closure(value_func)["value_exprs"], codes.field)
    if key_fields is None or value_fields is None:
        return None
    return AggregatedFields(key_fields, value_fields, keyed["key_type"])


def _key_reader(key_func: Callable, codes: _BeamsCodes) -> Callable:
    """Beam's key function of a ``GroupBy``, or an equal one reading its string fields with ``attrgetter``."""
    field = _field_names((key_func,), codes.field)
    if field is not None:
        return attrgetter(*field)
    if getattr(key_func, "__code__", None) == codes.key:
        keyed = closure(key_func)
        names = _field_names(keyed["key_exprs"], codes.field)
        if names is not None:
            key_type, read = keyed["key_type"], attrgetter(*names)
            if len(names) == 1:
                return lambda element: key_type(read(element))
            return lambda element: key_type(*read(element))
    return key_func


def grouped_key(fn: Callable) -> Callable | None:
    """If ``fn`` is the ``Map`` function of a ``GroupBy`` without
    aggregation: the function of an element giving its key, built once
    (``fn`` makes each element's ``(key, element)`` pair with it); else None."""
    codes = _beams_codes()
    if codes is None or getattr(fn, "__code__", None) != codes.grouped:
        return None
    return _key_reader(closure(fn)["self"]._key_func(), codes)


def grouped_pairs(fn: Callable) -> Callable | None:
    """If ``fn`` is the ``Map`` function of a ``GroupBy`` without
    aggregation: an equal one whose key function is built once, not per
    element; else None."""
    key = grouped_key(fn)
    if key is None:
        return None
    return lambda element: (key(element), element)
