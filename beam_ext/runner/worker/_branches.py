"""Branches of a stage run on element objects: a step with tagged outputs, or
a ``PCollection`` that several steps read.

Each branch is a line of generators over batches (:mod:`._direct`), pulled
by what reads its end. Where a line forks, :func:`fork` hands each branch
its share of every batch the line yields, and pulls that branch until it has
used it. A branch with nothing to read gets :data:`PAUSE` from its input and
passes it on to its end instead of finishing: every step of the line yields
a ``PAUSE`` it is given as it is (as it does any :class:`Marker`; a
bundle's end goes to every branch). So no branch reads ahead of the others,
and no batch is held longer than it takes each branch to use it, whatever
the steps keep (a partial combine emits only at the end).

Elements keep Beam's order within a branch; between branches, each batch
of the line is used by every branch before the next one is made, as Beam's
bundle processor hands each element to every consumer before the next.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Iterator, Sequence

from beam_ext.runner._element_batches import PAUSE, Marker, Same, as_batch

#: Beam's tag of a step's main output in the pipeline proto.
MAIN_TAG = "None"

_END = object()


class Tagged:
    """An output of a step with tagged outputs to one of them (Beam's
    ``TaggedOutput``, its value windowed as Beam's output handler windows it)."""

    __slots__ = ("tag", "value")

    def __init__(self, tag: str, value: Any) -> None:
        self.tag = tag
        self.value = value


class ByTag:
    """A tagged step's output batch already split by tag: each output's
    :class:`Same` batch of plain values, by tag (``MAIN_TAG``: the untagged
    ones). A step makes one where no result needs windowing of its own, so
    no element is wrapped in a ``WindowedValue`` to be split."""

    __slots__ = ("parts",)

    def __init__(self, parts: dict[str, Same]) -> None:
        self.parts = parts


def _inbox(queue: collections.deque) -> Iterator[Any]:
    while True:
        if not queue:
            yield PAUSE
            continue
        batch = queue.popleft()
        if batch is _END:
            return
        yield batch


def _by_tag(batch: Same | list) -> dict[str, Same | list]:
    """A tagged step's output batch, split into the batches of each output."""
    if type(batch) is Same:  # no element went to a tagged output
        return {MAIN_TAG: batch}
    if type(batch) is ByTag:
        return batch.parts
    parts: dict[str, list] = {}
    for wv in batch:
        if type(wv) is Tagged:
            tag, wv = wv.tag, wv.value
        else:
            tag = MAIN_TAG
        part = parts.get(tag)
        if part is None:
            parts[tag] = [wv]
        else:
            part.append(wv)
    return {tag: as_batch(part) for tag, part in parts.items()}


def fork(batches: Iterator[Any], branches: Sequence[tuple[str, Callable[[Iterator[Any]], Iterator[Any]]]],
         tagged: bool) -> Iterator[Any]:
    """What the ``branches`` yield, run on ``batches``.

    A branch is ``(tag, run)``: ``run(its batches)`` is its line. With
    ``tagged``, ``batches`` hold :class:`Tagged` elements, and a branch gets
    the elements of its tag (``MAIN_TAG``: the untagged ones); else every
    branch gets every batch. Elements of a tag no branch reads are dropped,
    as Beam's bundle processor drops an output nothing consumes.
    """
    inboxes = [collections.deque() for _ in branches]
    runs = [run(_inbox(inbox)) for (_, run), inbox in zip(branches, inboxes)]
    readers: dict[str, list[collections.deque]] = {}
    for (tag, _), inbox in zip(branches, inboxes):
        readers.setdefault(tag, []).append(inbox)
    for batch in batches:
        if batch is PAUSE:  # this line is itself a branch, waiting for input
            yield batch
            continue
        if type(batch) is Marker:  # a bundle's end: every branch's
            for inbox in inboxes:
                inbox.append(batch)
        else:
            for tag, part in (_by_tag(batch) if tagged else {MAIN_TAG: batch}).items():
                for inbox in readers.get(tag, ()):
                    inbox.append(part)
        for inbox, run in zip(inboxes, runs):
            if inbox:
                for out in run:
                    if out is PAUSE:
                        break
                    yield out
    for inbox in inboxes:
        inbox.append(_END)
    for run in runs:
        yield from run
