"""A batched ``DoFn`` (one that defines only ``process_batch``) on element objects.

Beam's bundle processor hands such a ``DoFn`` batches it makes of the
elements before it: its consumer set collects the elements it receives and,
at every :data:`MAX_BATCH` of them and at the end of a bundle, groups them by
windowing (timestamp, windows and pane), in the order each windowing first
came, and turns each group into a batch with the ``DoFn``'s input batch
converter (a numpy array, a pandas frame, a list). Each batch the ``DoFn``
yields is exploded into elements again, with its input batch's windowing,
for the element-wise steps after it. A ``process_batch`` marked
``yields_elements`` (Beam's ``to_dataframe`` yields each frame it is given
as one element) yields elements, each in its input batch's windowing.

:func:`run_batched` does the same over a chain's batches of objects, its
batches cut at the same counts and bundle ends, so a ``DoFn`` whose batches
are not element-wise sees the same batches as on Beam's path.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from apache_beam.runners.worker.operations import GeneralPurposeConsumerSet
from apache_beam.transforms import core

from beam_ext.runner._element_batches import BATCH, BUNDLE_END, Marker, Same
from beam_ext.runner.worker._frame_rows import exploder

#: Elements Beam's consumer set collects before it makes batches of them.
MAX_BATCH = GeneralPurposeConsumerSet.MAX_BATCH_SIZE


def run_batched(dofn: Any, enter: Callable[[], None], failed: Callable[[], Exception],
                batches: Iterator[Any], output: Callable[[Any, Any], Any] | None = None) -> Iterator[Any]:
    """The outputs of ``dofn.process_batch`` over ``batches`` (``Same`` or lists of
    ``WindowedValue``), exploded into ``Same`` batches of at most ``BATCH``.

    ``enter()`` is called before the ``DoFn``'s code runs (its metrics
    state); an error is raised from ``failed()``. A ``process_batch`` that
    yields elements (``@beam.DoFn.yields_elements``, as Beam's
    ``to_dataframe`` yields each frame) gives each in its batch's windowing,
    as Beam's output handler does; ``output(windowing, result)`` makes a
    ``WindowedValue`` or ``TimestampedValue`` result what Beam makes of it.

    >>> import numpy as np, apache_beam as beam
    >>> from apache_beam.typehints.batch import BatchConverter
    >>> from apache_beam.utils.windowed_value import WindowedValue
    >>> class Doubled(beam.DoFn):
    ...     def process_batch(self, batch):
    ...         yield batch * 2
    >>> fn = Doubled()
    >>> fn.input_batch_converter = fn.output_batch_converter = BatchConverter.from_typehints(
    ...     element_type=np.int64, batch_type=np.ndarray)
    >>> [list(map(int, b.values)) for b in run_batched(fn, lambda: None, RuntimeError,
    ...                                               iter([Same(WindowedValue(None, 0, ()), [1, 2, 3])]))]
    [[2, 4, 6]]
    """
    produce = dofn.input_batch_converter.produce_batch
    explode = exploder(dofn.output_batch_converter) if output is None else None
    process_batch = dofn.process_batch
    pending: list[tuple[Any, list]] = []  # (windowing, values) as they came
    count = 0
    special = _special_results()

    def flush() -> Iterator[Same]:
        nonlocal pending, count
        # Beam groups a flush's elements by windowing, each in the order of its first element.
        groups: dict[Any, list] = {}
        for windowing, values in pending:
            group = groups.get(windowing)
            if group is None:
                groups[windowing] = list(values)
            else:
                group += values
        pending, count = [], 0
        for windowing, values in groups.items():
            enter()
            try:
                results = process_batch(produce(values)) or ()
                if output is not None:
                    yield from elements(windowing, results)
                    continue
                for result in results:
                    out = list(explode(result))
                    for start in range(0, len(out), BATCH):
                        yield Same(windowing, out[start:start + BATCH])
                    enter()
            except Exception as exc:  # noqa: BLE001 - re-raised naming the step
                raise failed() from exc

    def elements(windowing: Any, results: Iterable[Any]) -> Iterator[Same | list]:
        out: list = []
        for result in results:
            if isinstance(result, special):
                if out:
                    yield Same(windowing, out)
                    out = []
                yield [output(windowing, result)]
                enter()
                continue
            out.append(result)
            if len(out) == BATCH:
                yield Same(windowing, out)
                out = []
                enter()
        if out:
            yield Same(windowing, out)

    def add(windowing: Any, values: list) -> Iterator[Same]:
        nonlocal count
        while values:
            take = MAX_BATCH - count
            pending.append((windowing, values if len(values) <= take else values[:take]))
            count += min(take, len(values))
            values = values[take:]
            if count >= MAX_BATCH:
                yield from flush()

    for batch in batches:
        if type(batch) is Marker:
            if batch is BUNDLE_END:
                yield from flush()
            yield batch
            continue
        if type(batch) is Same:
            yield from add(batch.template.with_value(None), batch.values)
            continue
        for wv in batch:
            yield from add(wv.with_value(None), [wv.value])
    yield from flush()


def _special_results() -> tuple[type, ...]:
    """Results Beam's output handler does not just give the input's windowing."""
    from apache_beam.pvalue import TaggedOutput
    from apache_beam.transforms.window import TimestampedValue
    from apache_beam.utils.windowed_value import WindowedValue

    return WindowedValue, TimestampedValue, TaggedOutput


class ExplodedBatches(core.DoFn):
    """A ``DoFn`` whose ``process`` takes an element and yields batches
    (``@beam.DoFn.yields_batches``, as Beam's DataFrame API turns frames into
    rows), as a ``DoFn`` of elements: each batch exploded by the ``DoFn``'s
    output batch converter, each element in the input's windowing, as Beam's
    consumer set explodes a batch for the element-wise step after it.

    >>> import numpy as np, apache_beam as beam
    >>> from apache_beam.typehints.batch import BatchConverter
    >>> class Ranges(beam.DoFn):
    ...     @beam.DoFn.yields_batches
    ...     def process(self, n):
    ...         yield np.arange(n)
    >>> fn = Ranges()
    >>> fn.output_batch_converter = BatchConverter.from_typehints(element_type=np.int64, batch_type=np.ndarray)
    >>> [int(x) for x in ExplodedBatches(fn).process(3)]
    [0, 1, 2]
    """

    def __init__(self, dofn: core.DoFn) -> None:
        self.dofn = dofn
        self._explode: Callable[[Any], Iterable[Any]] | None = None  # made on the worker, at the first element

    def setup(self) -> None:
        self.dofn.setup()

    def process(self, element: Any) -> Iterator[Any]:
        explode = self._explode
        if explode is None:
            explode = self._explode = exploder(self.dofn.output_batch_converter)
        for batch in self.dofn.process(element) or ():
            yield from explode(batch)

    def teardown(self) -> None:
        self.dofn.teardown()
