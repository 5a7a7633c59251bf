"""Elements handed between steps on element objects in batches, not one by one.

Inside a Spark task, a native step (a read, SlidingAggregate, a write) and
a stage of ``Map``-like steps (:mod:`beam_ext.runner.worker._direct`) pass
each other Python objects, never bytes. Passed one ``WindowedValue`` at a
time, those objects cost more than the work between them: one is built per
element on the way out of each step and taken apart on the way into the
next. So they travel in batches of at most :data:`BATCH` elements, each
batch a list of ``WindowedValue``, or a :class:`Same`: values that share one
timestamp, window set and pane, as most batch pipelines' elements do (the
global window, a bounded read's timestamp).

A bounded batch may also be held as columns (:class:`Columns`): a native
step that computes on columns hands them on as they are, and a step that
can take columns (a ``Map`` that only picks fields,
:mod:`beam_ext.runner.worker._projection`; the Parquet write) uses them
with no Python object per element. Any other step gets the elements made
from them, the same ones the producer would have made.

An RDD of such batches is an :class:`ElementBatches`; the batch executor
keeps the buffers between object steps in that form.
"""
from __future__ import annotations

import dataclasses
from itertools import chain, repeat
from typing import Any, Iterable, Iterator

from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

#: Elements a step takes per turn: each step then runs a whole list under
#: its own metrics state, instead of switching state and generator frames
#: per element (half the chain's cost for a one-line Map).
BATCH = 512

#: The windowing of a bounded read's elements: the global window, the minimum timestamp.
BOUNDED = WindowedValue(None, MIN_TIMESTAMP, (GlobalWindow(),))


class Marker:
    """Not a batch, but a sign between batches that each step passes on as it is."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: A branch's input has nothing yet (see :mod:`beam_ext.runner.worker._branches`).
PAUSE = Marker("PAUSE")

#: The stage's input bundle ends here, and another follows: a DoFn with
#: ``start_bundle``/``finish_bundle`` finishes one bundle and starts the next.
BUNDLE_END = Marker("BUNDLE_END")


class Same:
    """A batch of values that share one timestamp, window set and pane: ``template``'s.

    A step then maps a list of values, and no ``WindowedValue`` is made per
    element until one leaves the steps on objects.
    """

    __slots__ = ("template", "values")

    def __init__(self, template: Any, values: list) -> None:
        self.template = template
        self.values = values

    def __reduce__(self) -> tuple:
        return Same, (self.template, self.values)

    def windowed(self) -> list:
        """The batch as ``WindowedValue`` elements."""
        return list(map(self.template.with_value, self.values))


#: How a :class:`Columns` batch's elements are made of its groups of columns.
ROW, PAIR, TUPLE, VALUE = "row", "pair", "tuple", "value"


class Columns:
    """A batch of bounded elements (global window, minimum timestamp) held as columns.

    ``groups``: one or more groups of named columns, each an Arrow array or
    table column, or a list of Python values, all of ``size`` rows. An
    element is made of its row of each group, as ``shape`` says: ``ROW``,
    the first group's row as a dict (keys in column order); ``PAIR``, the
    tuple of one such dict per group; ``TUPLE``, the tuple of each group's
    one value; ``VALUE``, the first group's one value. An Arrow column's values are its ``to_pylist()`` values, as
    a row dict made by Arrow's ``Table.to_pylist`` has them.
    """

    __slots__ = ("groups", "shape", "size")

    def __init__(self, groups: tuple[tuple[tuple[str, Any], ...], ...], shape: str, size: int) -> None:
        self.groups = groups
        self.shape = shape
        self.size = size

    def __reduce__(self) -> tuple:
        return Columns, (self.groups, self.shape, self.size)

    def names(self) -> tuple[tuple[str, ...], ...]:
        """The column names of each group, in order."""
        return tuple(tuple(name for name, _ in group) for group in self.groups)

    def values(self) -> list:
        """The elements' values."""
        if self.shape == TUPLE:
            return list(zip(*(column_values(column) for (_, column), in self.groups)))
        if self.shape == VALUE:
            return list(column_values(self.groups[0][0][1]))
        dicts = [_row_dicts(group, self.size) for group in self.groups]
        return list(zip(*dicts)) if self.shape == PAIR else dicts[0]

    def batches(self) -> Iterator[Same]:
        """The elements, as batches of :data:`BATCH`."""
        return bounded_batches(self.values())


def column_values(column: Any) -> list:
    """A column's values as Python objects."""
    return column if isinstance(column, list) else column.to_pylist()


def _row_dicts(group: tuple[tuple[str, Any], ...], size: int) -> list[dict]:
    names = [name for name, _ in group]
    if group and len(set(names)) == len(names) and not any(isinstance(column, list) for _, column in group):
        import pyarrow as pa

        return pa.Table.from_arrays([column for _, column in group], names=names).to_pylist()
    # Filled a column at a time, which is faster than a dict(zip()) per row.
    out: list[dict] = [{} for _ in range(size)]
    for name, column in group:
        for row, value in zip(out, column_values(column)):
            row[name] = value
    return out


def batched(values: Iterable[Any], size: int = BATCH) -> Iterator[list]:
    """``values`` in lists of at most ``size``."""
    batch: list = []
    append = batch.append
    for value in values:
        append(value)
        if len(batch) == size:
            yield batch
            batch = []
            append = batch.append
    if batch:
        yield batch


def as_batch(batch: Same | list) -> Same | list:
    """``batch`` as a :class:`Same` if it is one, or if its ``WindowedValue`` elements share their
    windowing; a :class:`Marker` as it is."""
    if type(batch) is not list or not batch:
        return batch
    first = batch[0]
    micros, windows, pane = first.timestamp_micros, first.windows, first.pane_info
    for wv in batch:
        # Identity first: elements built from one template share its objects.
        if (wv.timestamp_micros != micros or (wv.windows is not windows and wv.windows != windows)
                or (wv.pane_info is not pane and wv.pane_info != pane)):
            return batch
    return Same(first, [wv.value for wv in batch])


def windowed(batch: Same | list | Columns) -> list:
    """The ``WindowedValue`` elements of ``batch``."""
    if type(batch) is Columns:
        return list(map(BOUNDED.with_value, batch.values()))
    return batch.windowed() if type(batch) is Same else batch


def as_batches(batches: Iterable[Same | list | Columns]) -> Iterator[Same | list]:
    """``batches`` as :func:`as_batch` makes them, a :class:`Columns` as its elements' batches."""
    for batch in batches:
        if type(batch) is Columns:
            yield from batch.batches()
        else:
            yield as_batch(batch)


def bounded_batches(values: Iterable[Any]) -> Iterator[Same]:
    """``values`` as a bounded read's elements (global window, minimum timestamp), batched."""
    if isinstance(values, list):
        for start in range(0, len(values), BATCH):
            yield Same(BOUNDED, values[start:start + BATCH])
        return
    for batch in batched(values):
        yield Same(BOUNDED, batch)


def values_per_window(batches: Iterable[Same | list]) -> Iterator[Any]:
    """Each element's value, once per window it is in (what a sink writes
    after Beam's ``WriteImpl`` puts every element into the global window)."""
    for batch in batches:
        if type(batch) is Columns:
            yield from batch.values()
        elif type(batch) is Same:
            n = len(batch.template.windows)
            yield from batch.values if n == 1 else chain.from_iterable(zip(*repeat(batch.values, n)))
        else:
            for wv in batch:
                value = wv.value
                for _ in wv.windows:
                    yield value


def _batches_of(values: Iterator[WindowedValue]) -> Iterator[Same | list]:
    return map(as_batch, batched(values))


@dataclasses.dataclass(frozen=True)
class ElementBatches:
    """A PCollection as an RDD of batches (each a :class:`Same`, a list of ``WindowedValue`` or a :class:`Columns`)."""

    rdd: Any

    @classmethod
    def of(cls, elements: Any) -> ElementBatches:
        """The batches of an RDD of ``WindowedValue``."""
        return cls(elements.mapPartitions(_batches_of))

    def elements(self) -> Any:
        """The RDD of ``WindowedValue`` these batches hold."""
        return self.rdd.flatMap(windowed)
