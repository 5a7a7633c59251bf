"""A splittable ``DoFn``'s few sized restrictions split by their own
trackers, so that a batch read of one big restriction runs on every task.

A batch stage that processes sized restrictions gets them spread over its
tasks one by one (the executor's round robin), and each task processes
its restrictions whole. A source of fewer restrictions than tasks then
reads on fewer cores than it could: Beam's ``ReadFromCsv`` and
``ReadFromJson`` make one restriction per file and leave it to the runner
to split while it reads, as Dataflow's dynamic splitting does.

The SDF contract lets a runner split a restriction at any point through
its tracker: ``try_split`` returns a primary and a residual that the
``DoFn`` processes as any two restrictions, together giving the outputs of
the whole. Before a tracker's first claim that split is as valid as one
taken later, and it needs no running task. :func:`fill_tasks` takes it: a
group of fewer restrictions than tasks is split, the largest
restrictions first, into as many pieces as there are tasks, each sized by
the provider's ``restriction_size`` as Beam's split-and-size step sizes
its pieces. A tracker that refuses (``UnsplittableRestrictionTracker``,
Beam's default for a restriction that must be read whole) keeps its
restriction whole. The pieces of one input are always the same, so a
retried task spreads the same pieces.
"""
from __future__ import annotations

import copy
import itertools
from typing import Any, Iterator


def spread_filled(dofn_info: bytes, sized: Iterator[Any], tasks: int) -> Iterator[Any]:
    """``sized`` as :func:`fill_tasks` splits them, for a task holding its
    input's restrictions: only a group of fewer than ``tasks`` is read whole
    first (and the ``DoFn``, pickled as Beam's ``DoFnInfo`` in
    ``dofn_info``, unpickled); from ``tasks`` on they pass unchanged."""
    head = list(itertools.islice(sized, tasks))
    if head and len(head) < tasks:
        from apache_beam.internal import pickler

        head = fill_tasks(pickler.loads(dofn_info)[0], head, tasks)
    yield from head
    yield from sized


def fill_tasks(dofn: Any, sized: list[Any], tasks: int) -> list[Any]:
    """``sized`` (windowed ``((element, (restriction, estimator state)),
    size)``, as Beam's split-and-size step makes them) split by the
    restrictions' trackers into ``tasks`` pieces where there are fewer;
    unchanged where there are as many or the trackers refuse.

    >>> import apache_beam as beam
    >>> from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
    >>> from apache_beam.utils.windowed_value import WindowedValue
    >>> class Offsets(beam.DoFn, beam.RestrictionProvider):  # only what splitting asks of a provider
    ...     def create_tracker(self, offsets): return OffsetRestrictionTracker(offsets)
    ...     def restriction_size(self, n, offsets): return offsets.size()
    ...     def process(self, n, tracker=beam.DoFn.RestrictionParam()): yield n
    >>> whole = WindowedValue(((90, (OffsetRange(0, 90), None)), 90), 0, ())
    >>> [(r.start, r.stop, size) for ((_, (r, _)), size) in (wv.value for wv in fill_tasks(Offsets(), [whole], 3))]
    [(0, 29, 29), (29, 59, 30), (59, 90, 31)]
    """
    if not sized or len(sized) >= tasks:
        return sized
    from apache_beam.runners.common import DoFnSignature

    provider = DoFnSignature(dofn).get_restriction_provider()
    pieces = _pieces_per_restriction([wv.value[1] for wv in sized], tasks)
    out: list[Any] = []
    for wv, count in zip(sized, pieces):
        (element, (restriction, estimator_state)), _ = wv.value
        parts = _split(provider, restriction, count) if count > 1 else None
        if parts is None:
            out.append(wv)
            continue
        # Beam's split-and-size step gives each piece its own copy of the estimator state.
        out.extend(wv.with_value(((element, (part, copy.copy(estimator_state))),
                                  provider.restriction_size(element, part)))
                   for part in parts)
    return out


def _pieces_per_restriction(sizes: list[float], tasks: int) -> list[int]:
    """How many pieces each restriction is cut into: ``tasks`` in all, each
    next piece to the restriction whose pieces would be the largest (ties to
    the first); one where a size is not positive."""
    counts = [1] * len(sizes)
    splittable = [i for i, size in enumerate(sizes) if size > 0]
    for _ in range(tasks - len(sizes)):
        if not splittable:
            break
        best = max(splittable, key=lambda i: (sizes[i] / counts[i], -i))
        counts[best] += 1
    return counts


def _split(provider: Any, restriction: Any, count: int) -> list[Any] | None:
    """``restriction`` cut into ``count`` pieces of about equal size by fresh
    trackers' ``try_split`` before any claim; None if the first refuses.

    Beam's wrapper of a ``BoundedSource`` (``ReadFromAvro``, a user's
    ``beam.io.Read(source)``) refuses: its range tracker splits only once a
    record is claimed. Its restriction is then cut as Beam's own initial
    split cuts a source, by the source's ``split`` over the restriction's
    range (:func:`_split_source`).
    """
    from apache_beam.io import iobase

    if isinstance(restriction, iobase._SDFBoundedSourceRestriction):
        return _split_source(restriction, count)
    parts = []
    rest = restriction
    for remaining in range(count, 1, -1):
        split = provider.create_tracker(rest).try_split(1.0 / remaining)
        if not split:  # None, or False from Beam's UnsplittableRestrictionTracker
            break
        primary, rest = split
        parts.append(primary)
    if not parts:
        return None
    parts.append(rest)
    return parts


def _split_source(restriction: Any, count: int) -> list[Any] | None:
    """A bounded source's restriction cut by ``BoundedSource.split`` into
    pieces of about a ``count``-th of its weight (the source's estimate of
    its bytes); None when the source gives one piece (a compressed file, a
    source that cannot split, a weight unknown)."""
    from apache_beam.io import iobase

    weight = restriction.weight()
    if not weight or weight <= 0:
        return None
    bundle = restriction._source_bundle
    # Positional: Beam's sources name the range's ends differently (start_offset, start_position).
    pieces = list(restriction.source().split(-(-int(weight) // count), bundle.start_position, bundle.stop_position))
    if len(pieces) < 2:
        return None
    return [iobase._SDFBoundedSourceRestriction(piece) for piece in pieces]
