"""Beam's ``Reshuffle`` on Spark: the elements dealt over the tasks through one Spark shuffle.

Beam expands ``Reshuffle()`` into a random key per element, a ``Map``
packing its timestamp, window and pane into its value, a ``GroupByKey``
firing a pane per element (``Always()``, discarding), and a ``FlatMap``
unpacking them: four steps and a trigger driver per element to give back
the elements as they came. The native step gives the same elements straight
through a Spark shuffle, as Beam's Java Spark runner does with a
``repartition``.

The elements are dealt one by one: a task's ``i``-th element goes to task
``(its index + i) % partitions``. So a few elements that fan out into
costly work (``Reshuffle``'s most common use) end up spread over every
task, where moving whole batches (PySpark's ``repartition``) would keep a
batch together. The dealing depends only on the task's input order, so a
task run again sends each element where it went the first time.

What Beam's expansion changes, this step changes too: in the default
windowing (the global window, the default trigger) an element at the
minimum timestamp leaves with Beam's unknown pane
(``restore_metadata_default_window``), whatever pane it came with; in any
other windowing an element in several windows leaves as one element per
window (``reify_metadata_custom_window`` packs its window into its value),
so a ``DoFn`` after it is called once per window.
"""
from __future__ import annotations

import functools
from typing import Any, Iterable, Iterator

from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN, WindowedValue

from beam_ext.runner._element_batches import BATCH, Columns, ElementBatches, Marker, Same, as_batch, windowed
from beam_ext.runner._object_shuffle import shuffled

RESHUFFLE_URN = "beam_ext:reshuffle:v1"

#: The payload of a Reshuffle whose input has the default windowing (see the module's docstring).
DEFAULT_WINDOWING = b"default"

_MIN_MICROS = MIN_TIMESTAMP.micros


def _pieces(batch: Same | list, offset: int, partitions: int) -> Iterator[tuple[int, Same | list]]:
    """``(target, piece)`` of ``batch``, its ``j``-th element dealt to ``(offset + j) % partitions``."""
    items = batch.values if type(batch) is Same else batch
    for j in range(min(partitions, len(items))):
        part = items[j::partitions]
        yield (offset + j) % partitions, Same(batch.template, part) if type(batch) is Same else part


def _joined(pieces: list[Same | list]) -> Same | list:
    """One batch of ``pieces``: a :class:`Same` where all share their windowing (``as_batch``)."""
    first = pieces[0]
    if len(pieces) == 1:
        return first
    # Pieces of one input batch share its template object: joined without a WindowedValue each.
    if type(first) is Same and all(type(p) is Same and p.template is first.template for p in pieces):
        return Same(first.template, [v for p in pieces for v in p.values])
    return as_batch([wv for p in pieces for wv in windowed(p)])


def _unknown_pane_at_min(batch: Same | list) -> Same | list:
    """``batch`` with the unknown pane on its elements at the minimum timestamp."""
    if type(batch) is Same:
        template = batch.template
        if template.timestamp_micros == _MIN_MICROS and template.pane_info != PANE_INFO_UNKNOWN:
            return Same(WindowedValue(None, MIN_TIMESTAMP, template.windows), batch.values)
        return batch
    return [WindowedValue(wv.value, MIN_TIMESTAMP, wv.windows)
            if wv.timestamp_micros == _MIN_MICROS and wv.pane_info != PANE_INFO_UNKNOWN else wv for wv in batch]


def _per_window(batch: Same | list) -> Same | list:
    """``batch`` with an element in several windows made one per window, as
    Beam's expansion, which packs each element's window into its value, gives them."""
    if type(batch) is Same:
        template = batch.template
        if len(template.windows) == 1:
            return batch
        return [WindowedValue(v, template.timestamp, (w,), template.pane_info)
                for v in batch.values for w in template.windows]
    if all(len(wv.windows) == 1 for wv in batch):
        return batch
    return [WindowedValue(wv.value, wv.timestamp, (w,), wv.pane_info) for wv in batch for w in wv.windows]


def deal(partitions: int, default_windowing: bool, index: int,
         batches: Iterable[Same | list | Columns | Marker]) -> Iterator[tuple[int, Same | list]]:
    """``(target task, batch)`` of task ``index``'s elements, dealt one by one from
    target ``index`` on, in batches of about :data:`BATCH` per target."""
    pending: list[list] = [[] for _ in range(partitions)]
    counts = [0] * partitions
    offset = index
    for batch in batches:
        if type(batch) is Marker:  # bundles end at the shuffle
            continue
        for piece in (batch.batches() if type(batch) is Columns else (batch,)):
            piece = _unknown_pane_at_min(piece) if default_windowing else _per_window(piece)
            for target, part in _pieces(piece, offset, partitions):
                pending[target].append(part)
                counts[target] += len(part.values) if type(part) is Same else len(part)
                if counts[target] >= BATCH:
                    yield target, _joined(pending[target])
                    pending[target], counts[target] = [], 0
            offset += len(piece.values) if type(piece) is Same else len(piece)
    for target, pieces in enumerate(pending):
        if pieces:
            yield target, _joined(pieces)


def reshuffle_on_spark(payload: bytes, values: Any, ctx: Any) -> ElementBatches:
    """SparkRunner's ``beam.Reshuffle()``: its input's elements, dealt over ``ctx.parallelism`` tasks."""
    batches = values if isinstance(values, ElementBatches) else ElementBatches.of(values)
    dealt = batches.rdd.mapPartitionsWithIndex(functools.partial(
        deal, ctx.parallelism, payload == DEFAULT_WINDOWING))
    return ElementBatches(shuffled(dealt, ctx.parallelism))
