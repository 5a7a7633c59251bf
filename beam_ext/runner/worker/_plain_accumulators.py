"""Plain accumulators for the partial combine: Beam's arithmetic without a call per element.

Count's, Mean's and ``sum``/``min``/``max``'s CombineFns (and a
``TupleCombineFn`` of them, as ``GroupBy(...).aggregate_field(...)`` builds,
or a ``SingleInputTupleCombineFn``) add a value by plain arithmetic. The
partial combine keeps a table of plain accumulators per key, updated by the
same arithmetic in the same order, and emits for each the accumulator
Beam's own, compacted, equals: to the bit, a float's rounding and sign of
zero included (``tests/test_direct_stages.py`` compares them with Beam's
``add_input``).
"""
from __future__ import annotations

import dataclasses
import functools
import operator
from collections import Counter
from operator import itemgetter
from typing import Any, Callable

from apache_beam.transforms import combiners, core


@dataclasses.dataclass(frozen=True)
class _Kind:
    """One CombineFn's plain accumulator: made from a key's first value,
    updated in place by each next one, and finished into Beam's compacted
    accumulator; ``add`` updates a table from a batch's ``(key, value)``
    pairs, the update written out in its loop (a call per element costs
    a tenth of a plain combine); ``single`` is the finished accumulator of
    one value alone, ``finish(new(value))`` without the list between."""

    new: Callable[[Any], list]
    update: Callable[[list, Any], None]
    finish: Callable[[list], Any]
    add: Callable[[dict, Any], None]
    single: Callable[[Any], Any]


def _update_count(acc: list, value: Any) -> None:
    acc[0] += 1


def _update_total(acc: list, value: Any) -> None:
    acc[0] = acc[0] + value
    acc[1] += 1


def _add_totals(new: Callable[[Any], list], table: dict, kvs: Any) -> None:
    get = table.get
    for key, value in kvs:
        acc = get(key)
        if acc is None:
            table[key] = new(value)
        else:  # _update_total
            acc[0] = acc[0] + value
            acc[1] += 1


def _update_min(acc: list, value: Any) -> None:
    # The first of the least, as min of the buffered values keeps it.
    if value < acc[0]:
        acc[0] = value


def _update_max(acc: list, value: Any) -> None:
    if value > acc[0]:
        acc[0] = value


def _add_extremes(better: Callable[[Any, Any], bool], table: dict, kvs: Any) -> None:
    # _update_min or _update_max, as ``better`` is operator.lt or operator.gt.
    get = table.get
    for key, value in kvs:
        acc = get(key)
        if acc is None:
            table[key] = [value]
        elif better(value, acc[0]):
            acc[0] = value


def _count_new(value: Any) -> list:
    return [1]


def _mean_new(value: Any) -> list:
    return [0 + value, 1]


def _sum_new(value: Any) -> list:
    return [0 + value, 1, value]


def _add_each(new: Callable[[Any], list], update: Callable[[list, Any], None], table: dict, kvs: Any) -> None:
    get = table.get
    for key, value in kvs:
        acc = get(key)
        if acc is None:
            table[key] = new(value)
        else:
            update(acc, value)


def _alone(value: Any) -> list:
    # The buffer of one value, as CombineFn.from_callable's add_input leaves it.
    return [value]


_COUNT = _Kind(_count_new, _update_count, lambda acc: acc[0], functools.partial(_add_each, _count_new, _update_count),
               lambda value: 1)
# MeanCombineFn: create_accumulator (0, 0); add_input (sum_ + element, count + 1).
_MEAN = _Kind(_mean_new, _update_total, lambda acc: (acc[0], acc[1]), functools.partial(_add_totals, _mean_new),
              lambda value: (0 + value, 1))
# CombineFn.from_callable(sum) buffers values and sums them every few:
# 0 + a0 + a1 + ..., in order, as a running total does. A single value's
# accumulator is the value itself: it is kept too.
_SUM = _Kind(_sum_new, _update_total, lambda acc: [acc[2]] if acc[1] == 1 else [acc[0]],
             functools.partial(_add_totals, _sum_new), _alone)
_MIN = _Kind(_alone, _update_min, list, functools.partial(_add_extremes, operator.lt), _alone)
_MAX = _Kind(_alone, _update_max, list, functools.partial(_add_extremes, operator.gt), _alone)


def _kind(fn: Any) -> _Kind | None:
    if type(fn) is combiners.CountCombineFn:
        return _COUNT
    if type(fn) is combiners.MeanCombineFn:
        return _MEAN
    # Beam's own wrappers of a function; a pipeline's CombinePerKey(sum) gets the second.
    if type(fn) in (core.CallableWrapperCombineFn, core.NoSideInputsCallableWrapperCombineFn):
        for function, kind in ((sum, _SUM), (min, _MIN), (max, _MAX)):
            if fn._fn is function:
                return kind
    return None


@dataclasses.dataclass(frozen=True)
class PlainAccumulators:
    """How a batch's ``(key, value)`` pairs update a table of plain
    accumulators (``add(table, pairs)``), a new table, the accumulator
    Beam's compacted one equals (``finish(entry)``), and the pairs of each
    key with the finished accumulator of its value alone
    (``singles(pairs)``: what the table would emit if every pair had a key
    of its own)."""

    add: Callable[[dict, Any], None]
    finish: Callable[[Any], Any]
    singles: Callable[[Any], list]
    new_table: Callable[[], dict] = dict


def _singles(single: Callable[[Any], Any], kvs: Any) -> list:
    if single is _alone:
        return [(key, [value]) for key, value in kvs]
    return [(key, single(value)) for key, value in kvs]


def _add_tuples(kinds: tuple[_Kind, ...], table: dict, kvs: Any) -> None:
    get = table.get
    news = [kind.new for kind in kinds]
    updates = [kind.update for kind in kinds]
    for key, values in kvs:
        accs = get(key)
        if accs is None:
            table[key] = [new(value) for new, value in zip(news, values)]
        else:
            for update, acc, value in zip(updates, accs, values):
                update(acc, value)


def _add_single_input_tuples(kinds: tuple[_Kind, ...], table: dict, kvs: Any) -> None:
    # SingleInputTupleCombineFn: every component adds the same value. Its own
    # loop, not _add_tuples over each value repeated: that generator and
    # repeat cost 574 against 396 ns an element for (sum, max, min).
    get = table.get
    news = [kind.new for kind in kinds]
    updates = [kind.update for kind in kinds]
    for key, value in kvs:
        accs = get(key)
        if accs is None:
            table[key] = [new(value) for new in news]
        else:
            for update, acc in zip(updates, accs):
                update(acc, value)


def _finished_tuples(kinds: tuple[_Kind, ...]) -> Callable[[list], list]:
    finishes = [kind.finish for kind in kinds]
    return lambda accs: [finish(acc) for finish, acc in zip(finishes, accs)]


def _single_tuples(kinds: tuple[_Kind, ...], kvs: Any) -> list:
    singles = [kind.single for kind in kinds]
    return [(key, [single(value) for single, value in zip(singles, values)]) for key, values in kvs]


def _single_input_tuples(kinds: tuple[_Kind, ...], kvs: Any) -> list:
    singles = [kind.single for kind in kinds]
    return [(key, [single(value) for single in singles]) for key, value in kvs]


def _count_keys(counts: Counter, kvs: Any) -> None:
    # CountCombineFn.add_input: accumulator + 1, whatever the value; the keys counted in C.
    counts.update(map(itemgetter(0), kvs))


def plain_accumulators(fn: Any) -> PlainAccumulators | None:
    """Plain accumulators of ``fn``, a CombineFn whose add_input is plain arithmetic; else None."""
    if type(fn) is combiners.CountCombineFn:
        return PlainAccumulators(_count_keys, lambda count: count, functools.partial(_singles, _COUNT.single), Counter)
    if type(fn) is combiners.SingleInputTupleCombineFn:
        kinds = tuple(_kind(part) for part in fn._combiners)
        if not kinds or None in kinds:
            return None
        return PlainAccumulators(functools.partial(_add_single_input_tuples, kinds), _finished_tuples(kinds),
                                 functools.partial(_single_input_tuples, kinds))
    kind = _kind(fn)
    return None if kind is None else PlainAccumulators(kind.add, kind.finish, functools.partial(_singles, kind.single))


def plain_tuple_accumulators(fn: Any) -> PlainAccumulators | None:
    """Plain accumulators of a ``TupleCombineFn`` whose every component has
    them; else None. Its pairs hold a key's one value for a single
    component, the tuple of its values for more. Every value tuple must
    have one value per component: Beam's ``add_input`` would drop the
    components past a shorter one's end."""
    if type(fn) is not combiners.TupleCombineFn or not fn._combiners:
        return None
    kinds = tuple(_kind(part) for part in fn._combiners)
    if None in kinds:
        return None
    if len(kinds) == 1:
        (kind,) = kinds
        return PlainAccumulators(kind.add, lambda acc: [kind.finish(acc)],
                                 lambda kvs: [(key, [kind.single(value)]) for key, value in kvs])
    return PlainAccumulators(functools.partial(_add_tuples, kinds), _finished_tuples(kinds),
                             functools.partial(_single_tuples, kinds))
