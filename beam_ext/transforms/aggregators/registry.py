"""The one table of aggregation kinds: everything else derives from it.

``agg.AggSpec`` validates kinds and builds aggregators from it, the plan
reads each field as numbers or as they are from it, the vectorised batch
path takes each kind's numpy form from it, and the tests check every kind
it lists against a brute-force oracle. Adding a kind is one module in this
package (the aggregator, and its vectorised form if it has one) and one
line in :data:`KINDS`; ``agg`` then needs a builder function of the same
name (the tests check that the two agree).

>>> KINDS["mean"].factory.__name__, KINDS["mean"].numeric
('Mean', True)
>>> lookup("median")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: unknown aggregation 'median'; known: ['count', 'count_distinct', ...] or agg.custom(...)
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

import numpy as np

from beam_ext.transforms.aggregators._columnar import Column
from beam_ext.transforms.aggregators.base import Aggregator
from beam_ext.transforms.aggregators.count import Count, count_windows
from beam_ext.transforms.aggregators.distinct import CountDistinct, count_distinct_windows
from beam_ext.transforms.aggregators.extremum import Max, Min, max_windows, min_windows
from beam_ext.transforms.aggregators.mean import Mean, mean_windows
from beam_ext.transforms.aggregators.sum import Sum, sum_windows
from beam_ext.transforms.aggregators.variance import StdDev, Variance, stddev_windows, variance_windows

#: ``fn(column, lo, hi)``: the answers of every window ``[lo[i], hi[i])`` of a
#: batch column, equal to the incremental aggregator's (see ``_columnar``).
Vectorised = Callable[[Column, np.ndarray, np.ndarray], list]

#: The kind of ``agg.custom(field, factory)``, which brings its own factory:
#: no table entry can take its name.
CUSTOM = "custom"


@dataclasses.dataclass(frozen=True)
class Kind:
    """One aggregation kind.

    ``name`` is what ``agg.<name>(field)`` builds; ``factory()`` returns a
    fresh incremental aggregator; ``numeric`` kinds read their field as
    float64 (nulls and NaN skipped), the others receive values as they are;
    ``vectorised`` is the kind's numpy form over whole batches, or None if
    it has none (then SparkRunner keeps the composite's Beam expansion);
    ``field_optional`` kinds also run without a field, over every event.
    """

    name: str
    factory: Callable[[], Aggregator]
    numeric: bool
    vectorised: Vectorised | None
    field_optional: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Kind: name must be an identifier (it names agg.<name>), got {self.name!r}")
        if self.name == CUSTOM:
            raise ValueError(f"Kind {self.name!r}: the name is taken by agg.custom(field, factory)")
        if not callable(self.factory):
            raise TypeError(f"Kind {self.name!r}: factory must be callable, got {self.factory!r}")
        for flag in ("numeric", "field_optional"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"Kind {self.name!r}: {flag} must be a bool, got {getattr(self, flag)!r}")
        if self.vectorised is not None and not callable(self.vectorised):
            raise TypeError(f"Kind {self.name!r}: vectorised must be callable or None, "
                            f"got {self.vectorised!r}")


def _table(kinds: Iterable[Kind]) -> Mapping[str, Kind]:
    table: dict[str, Kind] = {}
    for kind in kinds:
        if kind.name in table:
            raise ValueError(f"aggregation kind {kind.name!r} is listed twice")
        table[kind.name] = kind
    return MappingProxyType(table)


KINDS: Mapping[str, Kind] = _table([
    Kind("count", Count, numeric=False, vectorised=count_windows, field_optional=True),
    Kind("sum", Sum, numeric=True, vectorised=sum_windows),
    Kind("mean", Mean, numeric=True, vectorised=mean_windows),
    Kind("min", Min, numeric=True, vectorised=min_windows),
    Kind("max", Max, numeric=True, vectorised=max_windows),
    Kind("stddev", StdDev, numeric=True, vectorised=stddev_windows),
    Kind("variance", Variance, numeric=True, vectorised=variance_windows),
    Kind("count_distinct", CountDistinct, numeric=False, vectorised=count_distinct_windows),
])


def lookup(name: str) -> Kind:
    """The kind called ``name``; an unknown name is refused, naming it and the known ones."""
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown aggregation {name!r}; known: {sorted(KINDS)} or agg.custom(...)") from None


__all__ = ["CUSTOM", "KINDS", "Kind", "Vectorised", "lookup"]
