"""Beam's ``GroupBy(...).aggregate_field(...)`` read by field name, for a partial combine of plain accumulators.

Beam expands ``GroupBy("k").aggregate_field("x", sum, "total")`` into a
``Map`` making each element's ``(Key(k=...), [x, ...])`` pair, through
several lambdas and a named tuple per element, then a ``CombinePerKey`` of
a ``TupleCombineFn``. When every key and value is a field named by a string
and the combine keeps plain accumulators
(:mod:`beam_ext.runner.worker._plain_accumulators`), the pairs are read
with ``operator.attrgetter`` instead, in C, and a key becomes Beam's
``Key`` row only once per partial accumulator, when the combine emits it.
``benchmarks/runner_ab.py rows`` times a pipeline that has one.

The ``Map`` is recognised by the code of Beam's lambdas (which pickling
copies but keeps equal) and read through their closures;
``tests/test_aggregate_fields.py`` fails if a Beam release changes them.
"""
from __future__ import annotations

import dataclasses
import functools
import types
from operator import attrgetter
from typing import Any, Callable


def closure(fn: Callable) -> dict:
    """The variables a nested function reads from its enclosing scope, by name."""
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__ or ())))


@dataclasses.dataclass(frozen=True)
class AggregatedFields:
    """The fields a ``GroupBy(...).aggregate_field(...)`` groups by and
    aggregates, and Beam's maker of its ``Key`` rows."""

    key_fields: tuple[str, ...]
    value_fields: tuple[str, ...]
    key_type: Callable[..., tuple]

    def pairs(self, rows: list) -> list:
        """``(key, value)`` pairs of ``rows``: the key is the key field's
        value, or the tuple of the key fields' values; the value likewise."""
        keys = map(attrgetter(*self.key_fields), rows)
        return list(zip(keys, map(attrgetter(*self.value_fields), rows)))

    def key(self, raw: Any) -> tuple:
        """Beam's ``Key`` row of a key of :meth:`pairs`."""
        return self.key_type(raw) if len(self.key_fields) == 1 else self.key_type(*raw)


def _lambdas(code: types.CodeType) -> dict:
    return {frozenset(const.co_freevars): const for const in code.co_consts
            if isinstance(const, types.CodeType) and const.co_name == "<lambda>"}


@functools.cache
def _beams_codes() -> tuple | None:
    """The codes of Beam's lambdas: the pair, the key, the values and a
    field read by name; None if this Beam release has other ones."""
    from apache_beam.transforms import core

    try:
        expand = _lambdas(core._GroupAndAggregate.expand.__code__)
        return (expand[frozenset(("key_func", "value_func"))],
                _lambdas(core.GroupBy._key_func.__code__)[frozenset(("key_exprs", "key_type"))],
                expand[frozenset(("value_exprs",))],
                _lambdas(core._expr_to_callable.__code__)[frozenset(("expr",))])
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


def aggregated_fields(fn: Callable) -> AggregatedFields | None:
    """The fields of ``fn`` if it is the ``Map`` function of a
    ``GroupBy(...).aggregate_field(...)`` whose keys and values are all
    fields named by strings; else None."""
    codes = _beams_codes()
    if codes is None or getattr(fn, "__code__", None) != codes[0]:
        return None
    pair_code, key_code, values_code, field_code = codes
    outer = closure(fn)
    key_func, value_func = outer["key_func"], outer["value_func"]
    if getattr(key_func, "__code__", None) != key_code or getattr(value_func, "__code__", None) != values_code:
        return None
    keyed = closure(key_func)
    key_fields = _field_names(keyed["key_exprs"], field_code)
    value_fields = _field_names(closure(value_func)["value_exprs"], field_code)
    if key_fields is None or value_fields is None:
        return None
    return AggregatedFields(key_fields, value_fields, keyed["key_type"])
