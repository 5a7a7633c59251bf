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
    """``batch`` as a :class:`Same` if it is one, or if its ``WindowedValue`` elements share their windowing."""
    if type(batch) is Same or not batch:
        return batch
    first = batch[0]
    micros, windows, pane = first.timestamp_micros, first.windows, first.pane_info
    for wv in batch:
        # Identity first: elements built from one template share its objects.
        if (wv.timestamp_micros != micros or (wv.windows is not windows and wv.windows != windows)
                or (wv.pane_info is not pane and wv.pane_info != pane)):
            return batch
    return Same(first, [wv.value for wv in batch])


def windowed(batch: Same | list) -> list:
    """The ``WindowedValue`` elements of ``batch``."""
    return batch.windowed() if type(batch) is Same else batch


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
        if type(batch) is Same:
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
    """A PCollection as an RDD of batches (each a :class:`Same` or a list of ``WindowedValue``)."""

    rdd: Any

    @classmethod
    def of(cls, elements: Any) -> ElementBatches:
        """The batches of an RDD of ``WindowedValue``."""
        return cls(elements.mapPartitions(_batches_of))

    def elements(self) -> Any:
        """The RDD of ``WindowedValue`` these batches hold."""
        return self.rdd.flatMap(windowed)
