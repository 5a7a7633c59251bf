"""Aggregations for :class:`~beam_ext.transforms.SlidingAggregate`.

One builder per kind of ``aggregators/registry.py``, which says what each
kind computes and how; ``custom`` brings its own aggregator.

>>> from beam_ext.transforms import agg
>>> agg.sum("amount")
AggSpec(kind='sum', field='amount')
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from beam_ext.transforms._fields import FieldSpec
from beam_ext.transforms.aggregators import Aggregator
from beam_ext.transforms.aggregators.registry import CUSTOM, Vectorised, lookup


@dataclasses.dataclass(frozen=True)
class AggSpec:
    """One aggregation: what to compute (``kind``) over which ``field``.

    Build it with the functions of this module (``agg.sum("amount")``), not
    directly. ``field=None`` is only valid for ``count`` (count events).
    """

    kind: str
    field: FieldSpec | None = None
    factory: Callable[[], Aggregator] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind == CUSTOM:
            if not callable(self.factory):
                raise TypeError(f"agg.custom: factory must be callable, got {self.factory!r}")
            field_optional = False
        else:
            field_optional = lookup(self.kind).field_optional
        if self.field is None and not field_optional:
            raise ValueError(f"agg.{self.kind}: a field is required")
        if self.field is not None and not (isinstance(self.field, str) or callable(self.field)):
            raise TypeError(f"agg.{self.kind}: field must be a str or a callable, got {self.field!r}")

    @property
    def numeric(self) -> bool:
        """Whether values are read as float64 (nulls and NaN skipped)."""
        return self.kind != CUSTOM and lookup(self.kind).numeric

    @property
    def vectorised(self) -> Vectorised | None:
        """The numpy form over whole batches; None for ``agg.custom`` and kinds without one."""
        return None if self.kind == CUSTOM else lookup(self.kind).vectorised

    def make(self) -> Aggregator:
        """A fresh, empty aggregator."""
        return self.factory() if self.kind == CUSTOM else lookup(self.kind).factory()

    def describe(self) -> str:
        f = self.field if isinstance(self.field, str) else getattr(self.field, "__name__", "<fn>")
        return f"agg.{self.kind}({f!r})" if self.field is not None else f"agg.{self.kind}()"


def count(field: FieldSpec | None = None) -> AggSpec:
    """Number of events in the window; with ``field``, of events whose field is not null/NaN.

    >>> count()
    AggSpec(kind='count', field=None)
    """
    return AggSpec("count", field)


def sum(field: FieldSpec) -> AggSpec:  # noqa: A001 - the natural name in agg.sum
    """Sum of ``field`` (0.0 for an empty window)."""
    return AggSpec("sum", field)


def mean(field: FieldSpec) -> AggSpec:
    """Mean of ``field`` (None for an empty window)."""
    return AggSpec("mean", field)


def min(field: FieldSpec) -> AggSpec:  # noqa: A001
    """Minimum of ``field`` (None for an empty window)."""
    return AggSpec("min", field)


def max(field: FieldSpec) -> AggSpec:  # noqa: A001
    """Maximum of ``field`` (None for an empty window)."""
    return AggSpec("max", field)


def stddev(field: FieldSpec) -> AggSpec:
    """Population standard deviation of ``field`` (None for an empty window)."""
    return AggSpec("stddev", field)


def variance(field: FieldSpec) -> AggSpec:
    """Population variance (divisor n) of ``field`` (None for an empty window)."""
    return AggSpec("variance", field)


def count_distinct(field: FieldSpec) -> AggSpec:
    """Number of distinct non-null values of ``field`` (values must be hashable)."""
    return AggSpec("count_distinct", field)


def custom(field: FieldSpec, factory: Callable[[], Any]) -> AggSpec:
    """A user-defined invertible aggregate.

    ``factory()`` returns an object with ``add(x)``, ``remove(x)`` and
    ``get()`` (see :class:`~beam_ext.transforms.aggregators.Aggregator`); it
    receives the non-null values of ``field`` as they are. Set
    ``fifo_only = True`` on it if removals must come in insertion order.

    >>> class Product:
    ...     fifo_only = False
    ...     def __init__(self): self.p = 1.0
    ...     def add(self, x): self.p *= x
    ...     def remove(self, x): self.p /= x
    ...     def get(self): return self.p
    >>> custom("amount", Product).kind
    'custom'
    """
    return AggSpec(CUSTOM, field, factory)


__all__ = ["AggSpec", "count", "sum", "mean", "min", "max", "stddev", "variance",
           "count_distinct", "custom"]
