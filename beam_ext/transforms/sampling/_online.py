"""Online drivers of the sampler: events are added as they arrive and each
pane comes out once the clock passes its emission time, identical to the
pane of a batch replay of the same arrivals.

Why this is exact: a pane depends only on the arrivals up to its
``emitted_at`` (see :func:`replay`), so once the clock has passed that time
a replay of the arrivals so far gives the pane the whole stream would.

Why it is cheap: the driver replays only when a pane can be due, and only
the arrivals a future pane can still use. After a replay it knows a lower
bound of the next emission time: a window's end while its deadline has not
passed, else the pane's predicted emission, which only a straggler that
completes a short sample can bring forward (the replay tells how many
stragglers each short sub-stream misses, and the driver counts them down).
Arrivals of windows whose K-slack watermark has passed and that are older
than the last ``history`` settled sub-streams are dropped; their delays are
kept only where they still raise K.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import numpy as np

from beam_ext.clock import Clock
from beam_ext.transforms.sampling._sampler import (
    ApproximateResult,
    ReplayOutcome,
    SamplerConfig,
    _micros,
    replay,
)

_INF = math.inf

# Counter names (namespace beam_ext.sampling), shared with the Beam transform.
OBSERVED = "observed_events"
SAMPLED = "sampled_events"
STRAGGLERS = "stragglers_after_emission"
LATE = "late_events"
EVICTED = "evicted_events"
BEHIND = "arrivals_behind_clock"
REPLAYS = "replays"
AT_END = "panes_at_end_of_input"


@dataclasses.dataclass
class KeyProgress:
    """What the online sampler keeps for one key besides its arrivals.

    Small and bounded: the sets and maps hold only windows still in the
    history. ``clock`` is the largest arrival time seen or processing time
    reached; every pane emitted before ``released_until`` was released; no
    pane is due before ``next_due``; windows before ``finished_before``
    have all their panes out (later arrivals of theirs are late); arrivals
    of sub-streams before ``horizon`` are not kept; ``timer_at`` is the owner's processing-time
    timer (microseconds) if one is set.
    """

    clock: float = -_INF
    released_until: float = -_INF
    next_due: float = _INF
    timer_at: int | None = None
    horizon: int | None = None
    history_sub: int | None = None
    finished_before: int | None = None
    max_delay: float = -_INF
    past: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    released: set[tuple[int, bool]] = dataclasses.field(default_factory=set)
    pending: dict[tuple[int, bool], float] = dataclasses.field(default_factory=dict)
    short: dict[int, dict[int, list]] = dataclasses.field(default_factory=dict)


class KeySampler:
    """The per-key logic of the streaming sampler, with its state held
    outside (a :class:`KeyProgress` and the kept arrivals), so a Beam
    stateful DoFn and :class:`OnlineSampler` drive the same code.

    Protocol: :meth:`ingest` each arrival (keep it if told to); when
    :meth:`ingest` or :meth:`advance` says a pane is due, :meth:`poll` with
    the kept arrivals; at the end of the input, :meth:`flush`. Panes
    released before the end are those with ``emitted_at < clock``; each is
    released by the first call that moves the clock past its
    ``emitted_at``, provided arrivals come in arrival-time order.

    Costs: :meth:`ingest` O(1) (O(windows) when a straggler completes a
    sample); :meth:`poll` O(R log R) for R kept arrivals, run about once
    per emission time.

    >>> s = KeySampler(SamplerConfig(window=1.0, substream=0.5, history=2))
    >>> p, kept = KeyProgress(), []
    >>> for i in range(300):
    ...     keep, _ = s.ingest(p, i / 100, i / 100 + 0.05, 1.0)
    ...     kept += [(i / 100, i / 100 + 0.05, 1.0)] * keep
    >>> s.advance(p, 3.1)
    True
    >>> panes, keep, _ = s.poll(p, *np.array(kept).T)
    >>> [r.window_start for r in panes]
    [0.0, 1.0, 2.0]
    """

    def __init__(self, config: SamplerConfig, key: Any = None) -> None:
        self._config = config
        self._key = key
        self._k = config.k
        self._f_us = _micros(config.substream)
        self._off_us = _micros(config.offset)

    # ------------------------------------------------------------ time grid --

    def sub_of(self, t: float) -> int:
        """Absolute index of the sub-stream holding generation time ``t``."""
        return (round(t * 1_000_000) - self._off_us) // self._f_us

    def sub_start(self, j: int) -> float:
        return (self._off_us + j * self._f_us) / 1_000_000

    def _window_end(self, w: int) -> float:
        return self.sub_start((w + 1) * self._k)

    def _window_of(self, start: float) -> int:
        return self.sub_of(start) // self._k

    # -------------------------------------------------------------- protocol --

    def ingest(self, p: KeyProgress, gen: float, arrival: float, value: float
               ) -> tuple[bool, collections.Counter]:
        """Takes one arrival; returns whether to keep it and counter increments.

        Afterwards :meth:`due` tells whether a pane is due.
        """
        counts = collections.Counter({OBSERVED: 1})
        if arrival < p.released_until:
            # Panes released already may have missed it (it came after the
            # clock passed its arrival time).
            counts[BEHIND] += 1
        p.clock = max(p.clock, arrival)
        delay = arrival - gen
        if delay > p.max_delay:
            if p.short:
                # K grew: fallback times move, so the straggler counts are stale.
                p.next_due = min(p.next_due, arrival)
            p.max_delay = delay
            raised_k = True
        else:
            raised_k = False
        j = self.sub_of(gen)
        if p.finished_before is not None and j // self._k < p.finished_before:
            # Its window is done (the K-slack watermark passed it): late for
            # every pane, it counts only for K.
            if raised_k:
                p.past.append((arrival, delay))
            counts.update({EVICTED: 1, STRAGGLERS: 1, LATE: 1})
            return False, counts
        p.next_due = min(p.next_due, self._due_after(p, j, arrival))
        return True, counts

    def _due_after(self, p: KeyProgress, j: int, arrival: float) -> float:
        """A lower bound of the emission time a new arrival can bring."""
        w = j // self._k
        end = self._window_end(w)
        if arrival <= end:
            return end  # its window's pane is due at the deadline at the earliest
        if (w, False) in p.released:
            correction_known = (w, True) in p.released or (w, True) in p.pending
            return arrival if self._config.corrections and not correction_known else _INF
        if (w, False) in p.pending:
            subs = p.short.get(w)
            entry = subs.get(j) if subs else None
            if entry is None or entry[0] == 0 or arrival > entry[1]:
                return _INF
            entry[0] -= 1
            if entry[0]:
                return _INF
            # Its sub-stream is complete now: the pane waits only for the
            # fallbacks of the sub-streams still short.
            return max([arrival] + [fallback for missing, fallback in subs.values() if missing])
        if (w, True) in p.pending or (w, True) in p.released:
            return _INF
        return arrival  # a window the last replay did not report

    def advance(self, p: KeyProgress, now: float) -> bool:
        """Moves the clock to ``now`` (processing time); True if a pane is due."""
        p.clock = max(p.clock, now)
        return self.due(p)

    @staticmethod
    def due(p: KeyProgress) -> bool:
        return p.clock > p.next_due

    def timer(self, p: KeyProgress) -> int | None:
        """Microseconds of the processing time at which to call
        :meth:`on_timer` (just after the next due time), or None."""
        if math.isinf(p.next_due):
            return None
        return math.floor(p.next_due * 1_000_000) + 1

    def on_timer(self, p: KeyProgress) -> bool:
        """The timer set at ``p.timer_at`` fired; True if a pane is due."""
        if p.timer_at is None:
            return False
        now = p.timer_at / 1_000_000
        if p.timer_at == self.timer(p):
            # It was set for next_due: processing time is past it, even where
            # seconds since the epoch cannot hold the microsecond in a float.
            now = max(now, float(np.nextafter(p.next_due, _INF)))
        return self.advance(p, now)

    def poll(self, p: KeyProgress, gen: np.ndarray, arrival: np.ndarray, values: np.ndarray
             ) -> tuple[list[ApproximateResult], np.ndarray, collections.Counter]:
        """Replays the kept arrivals and releases the panes emitted before the
        clock; returns them, which arrivals to keep, and counter increments."""
        gen = np.asarray(gen, dtype=np.float64)
        if len(gen) == 0:
            p.pending, p.short, p.next_due = {}, {}, _INF
            return [], np.ones(0, dtype=bool), collections.Counter()
        counts = collections.Counter({REPLAYS: 1})
        out = self._replay(p, gen, arrival, values)
        now = p.clock
        fresh = []
        p.pending = {}
        for r in out.results:
            ident = (self._window_of(r.window_start), r.is_correction)
            if ident in p.released or self._done(p, ident[0]):
                # A done window's panes are out; part of its history may not be.
                continue
            if r.emitted_at < now:
                p.released.add(ident)
                fresh.append(r)
            else:
                p.pending[ident] = r.emitted_at
        p.released_until = max(p.released_until, now)
        next_due = _INF
        p.short = {}
        for (w, correction), emitted in p.pending.items():
            end = self._window_end(w)
            if correction or end < now:
                next_due = min(next_due, emitted)
                short = out.windows[w].short if not correction else None
                if short:
                    p.short[w] = {j: [missing, fallback] for j, (missing, fallback) in short.items()}
            else:
                # Arrivals before the deadline can still complete its sample.
                next_due = min(next_due, end)
        p.next_due = next_due
        first_open = self._settle(p, out, counts)
        keep = self._evict(p, out, gen, np.asarray(arrival, dtype=np.float64), first_open, counts)
        return fresh, keep, counts

    def flush(self, p: KeyProgress, gen: np.ndarray, arrival: np.ndarray, values: np.ndarray
              ) -> tuple[list[ApproximateResult], collections.Counter]:
        """End of the input: every pane not yet released, whatever its
        emission time (no arrival can change it any more), and the counts
        of the windows still kept. ``p`` is spent afterwards."""
        counts = collections.Counter()
        if len(gen) == 0:
            return [], counts
        out = self._replay(p, np.asarray(gen, dtype=np.float64), arrival, values)
        counts[REPLAYS] += 1
        fresh = [r for r in out.results
                 if (self._window_of(r.window_start), r.is_correction) not in p.released
                 and not self._done(p, self._window_of(r.window_start))]
        counts[AT_END] += len(fresh)
        for w, progress in out.windows.items():
            if not self._done(p, w):
                counts[SAMPLED] += progress.sampled
                counts[STRAGGLERS] += progress.stragglers_after_emission
                counts[LATE] += progress.late
        return fresh, counts

    # ------------------------------------------------------------- internals --

    @staticmethod
    def _done(p: KeyProgress, w: int) -> bool:
        return p.finished_before is not None and w < p.finished_before

    def _replay(self, p: KeyProgress, gen: np.ndarray, arrival: np.ndarray,
                values: np.ndarray) -> ReplayOutcome:
        start = None if p.history_sub is None else self.sub_start(p.history_sub)
        past = None
        if p.past:
            cols = np.array(p.past, dtype=np.float64)
            past = (cols[:, 0], cols[:, 1])
        return replay(gen, arrival, values, self._config, key=self._key,
                      history_start=start, past_delays=past)

    def _settle(self, p: KeyProgress, out: ReplayOutcome, counts: collections.Counter) -> int:
        """Counts the windows whose K-slack watermark passed the clock since
        the last replay (no pane of theirs is to come, and their history is
        still kept) and returns the first window still open."""
        k = self._k
        window_settled = out.settled[k - 1::k]
        open_at = np.flatnonzero(window_settled >= p.clock)
        first_open = out.first_sub // k + (int(open_at[0]) if len(open_at) else len(window_settled))
        done_from = -_INF if p.finished_before is None else p.finished_before
        for w, progress in out.windows.items():
            if done_from <= w < first_open:
                counts[SAMPLED] += progress.sampled
                counts[STRAGGLERS] += progress.stragglers_after_emission
                counts[LATE] += progress.late
        p.finished_before = max(first_open, p.finished_before or first_open)
        p.released = {ident for ident in p.released if ident[0] >= p.finished_before}
        return first_open

    def _evict(self, p: KeyProgress, out: ReplayOutcome, gen: np.ndarray,
               arrival: np.ndarray, first_open: int, counts: collections.Counter) -> np.ndarray:
        """Moves the horizon past the windows no future pane can use: done
        and older than the last ``history`` sub-streams settled when the
        first open window starts (its panes look no further back)."""
        k = self._k
        t_min = min(self.sub_start(first_open * k), p.clock)
        newest_settled = out.first_sub + int(np.searchsorted(out.settled, t_min, side="right")) - 1
        cut = (newest_settled - self._config.history + 1) // k * k
        keep = np.ones(len(gen), dtype=bool)
        if p.horizon is not None and cut <= p.horizon:
            return keep
        p.horizon = cut
        p.history_sub = max(out.history_sub, cut)
        keep = (np.round(gen * 1_000_000).astype(np.int64) - self._off_us) // self._f_us >= cut
        dropped = ~keep
        counts[EVICTED] += int(dropped.sum())
        records = p.past + list(zip(arrival[dropped].tolist(), (arrival - gen)[dropped].tolist()))
        p.past = _fold_delays(records, self.sub_start(cut))
        return keep


def _fold_delays(records: list[tuple[float, float]], since: float) -> list[tuple[float, float]]:
    """The (arrival, delay) records that still shape K from ``since`` on:
    one floor for everything that arrived by then, then the records that
    raise the running maximum."""
    floor = max((d for a, d in records if a <= since), default=-_INF)
    folded = [(-_INF, floor)] if floor > -_INF else []
    best = floor
    for a, d in sorted(r for r in records if r[0] > since):
        if d > best:
            folded.append((a, d))
            best = d
    return folded


class OnlineSampler:
    """Straggler-free sampling for one key, driven by a :class:`Clock`.

    :meth:`poll` releases the panes with ``emitted_at <= clock.now()`` not
    released before: exactly the panes of a batch replay of the whole
    stream, each at the moment it becomes safe (see :class:`KeySampler`;
    events must be added in arrival order). It replays only when a pane can
    be due, and keeps only the arrivals a future pane can use.

    >>> from beam_ext.clock import ManualClock
    >>> clock = ManualClock(0.0)
    >>> s = OnlineSampler(SamplerConfig(window=1.0, substream=0.5, history=2), clock)
    >>> for i in range(300):
    ...     clock.set(i / 100 + 0.05); s.add(i / 100, 1.0)
    >>> [r.window_start for r in s.poll()]
    [0.0, 1.0, 2.0]
    """

    def __init__(self, config: SamplerConfig, clock: Clock, key: Any = None) -> None:
        self._clock = clock
        self._logic = KeySampler(config, key)
        self._progress = KeyProgress()
        self._events: list[tuple[float, float, float]] = []

    def add(self, event_time: float, value: float, arrival_time: float | None = None) -> None:
        """Ingest one event; its arrival time defaults to ``clock.now()``."""
        now = self._clock.now()
        arrival = now if arrival_time is None else float(arrival_time)
        if arrival > now:
            raise ValueError(f"arrival_time {arrival} is in the future (clock at {now})")
        if arrival < event_time:
            raise ValueError(f"arrival_time {arrival} is before event_time {event_time}")
        gen, value = float(event_time), float(value)
        keep, _ = self._logic.ingest(self._progress, gen, arrival, value)
        if keep:
            self._events.append((gen, arrival, value))

    def poll(self) -> list[ApproximateResult]:
        """Panes that became safe to emit since the last poll."""
        # Panes at exactly now are safe: the clock is just past it.
        if not self._logic.advance(self._progress, np.nextafter(self._clock.now(), _INF)):
            return []
        cols = np.array(self._events, dtype=np.float64).reshape(-1, 3)
        fresh, keep, _ = self._logic.poll(self._progress, cols[:, 0], cols[:, 1], cols[:, 2])
        if not keep.all():
            self._events = [e for e, kept in zip(self._events, keep) if kept]
        return fresh

    @property
    def kept(self) -> int:
        """Arrivals currently kept (bounded by the history, not the stream)."""
        return len(self._events)
