"""Which session windows Beam's ``Sessions.merge`` merges, computed on microseconds.

``Sessions.merge`` sorts a key's windows by start and merges each run of
overlapping ones (a window starting before the run's greatest end) into one
window from the run's first start to its greatest end. Both the batch
grouping (:mod:`._batch_panes`) and the partial combine
(:mod:`.worker._partial_sessions`) need those runs; :func:`session_runs`
gives them from the windows' bounds in integers, without Beam's
``Timestamp`` objects.
"""
from __future__ import annotations

from typing import Iterator, Sequence


def session_runs(entries: Sequence[Sequence]) -> Iterator[tuple[int, int, int, int]]:
    """For ``entries`` sorted by start, each beginning ``(start micros, end micros, ...)``:
    each run ``Sessions.merge`` merges into one window, as ``(first, stop, start, end)``,
    ``entries[first:stop]`` being the run, ``start`` and ``end`` its window's bounds.

    >>> list(session_runs([(0, 10), (5, 12), (12, 20), (30, 40)]))
    [(0, 2, 0, 12), (2, 3, 12, 20), (3, 4, 30, 40)]
    """
    if not entries:
        return
    first, (start, end) = 0, entries[0][:2]
    for i in range(1, len(entries)):
        entry = entries[i]
        if end > entry[0]:  # overlaps the run so far
            if entry[1] > end:
                end = entry[1]
        else:
            yield first, i, start, end
            first, start, end = i, entry[0], entry[1]
    yield first, len(entries), start, end
