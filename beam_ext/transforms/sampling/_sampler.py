"""The straggler-free sampler as a discrete-event replay of one key's stream.

Input: one key's events as three arrays (generation time, arrival time,
value). Time is the arrival clock: an event is visible from its arrival
time on, and nothing else moves time, so a replay is exact and
deterministic (no wall clock). Sub-streams are processed one after another;
inside one, the Bernoulli draws and the deadline arithmetic are vectorised.

Modes (the thesis's algorithm and the baselines of section 4.2.1):

``aion``        sample at the eq. 4.8 rate, process each sub-stream when its
                deadline passed and its sample is complete (SafeToProcess).
``aion_minus``  same sample size, rate over the whole sub-stream (eq. 4.2),
                processed at the K-slack watermark.
``aq_kslack``   a distribution-free (Chebyshev) sample size, uniform rate,
                processed at the K-slack watermark.
``exact``       every event, processed at the K-slack watermark (Default).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Hashable

import numpy as np

from beam_ext._key_hash import key_hash, untyped_key_coder
from beam_ext.transforms.sampling import _estimators as est
from beam_ext.transforms.sampling._monitor import StatisticsMonitor, SubstreamStats

MODES = ("aion", "aion_minus", "aq_kslack", "exact")
AGGREGATES = ("mean", "sum", "count")
_MICROS = 1_000_000


@dataclasses.dataclass(frozen=True)
class ApproximateResult:
    """One pane of :class:`ApproximateWindowAggregate`.

    ``estimate`` lies in ``[ci_low, ci_high]``, the interval the estimate
    really has at the requested confidence; ``population_estimate`` is the
    window's size (arrived events plus expected stragglers); ``emitted_at``
    is the arrival-clock time of emission, ``max(deadline, time the sample
    completed)``; ``is_correction`` marks the exact pane sent once the
    stragglers are in (only with ``corrections=True``).
    """

    key: Any
    window_start: float
    window_end: float
    estimate: float
    ci_low: float
    ci_high: float
    sample_size: int
    population_estimate: float
    emitted_at: float
    waited_for_stragglers: bool
    is_correction: bool = False


_REAL = (int, float, np.integer, np.floating)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_number(name: str, value: Any, what: str = "a number") -> None:
    # bool is an int to Python, but True as a confidence is a caller's mistake.
    if isinstance(value, bool) or not isinstance(value, _REAL):
        raise TypeError(f"{name} must be {what}, got {value!r}")


def _check_seconds(name: str, value: Any, positive: bool) -> None:
    """A duration or offset in seconds: a finite number the microsecond grid
    can hold (infinity would overflow it, a sub-microsecond size rounds to 0)."""
    _check_number(name, value, "a number of seconds")
    if not math.isfinite(value) or (positive and not value > 0):
        sign = " > 0" if positive else ""
        raise ValueError(f"{name} must be a finite number of seconds{sign}, got {value!r}")
    if positive and _micros(value) < 1:
        raise ValueError(f"{name} must be at least 1 microsecond, got {value!r} s")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Configuration of one replay; validated on construction."""

    window: float
    substream: float
    aggregate: str = "mean"
    error: float = 0.05
    confidence: float = 0.95
    history: int = 20
    offset: float = 0.0
    mode: str = "aion"
    corrections: bool = False
    seed: int = 0
    min_history: int | None = None
    safety: float = 0.5

    def __post_init__(self) -> None:
        _check_number("error", self.error)
        if not 0.0 < self.error < 1.0:
            raise ValueError(f"error must be in (0, 1), got {self.error!r}")
        _check_number("confidence", self.confidence)
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence!r}")
        _check_seconds("window", self.window, positive=True)
        _check_seconds("substream", self.substream, positive=True)
        _check_seconds("offset", self.offset, positive=False)
        w_us, f_us = _micros(self.window), _micros(self.substream)
        if w_us % f_us:
            raise ValueError(f"substream ({self.substream} s) must divide the window "
                             f"({self.window} s) into whole sub-streams")
        if not _is_int(self.history) or self.history < 1:
            raise ValueError(f"history must be an int >= 1, got {self.history!r}")
        if self.min_history is not None and (
                not _is_int(self.min_history) or self.min_history < 1):
            raise ValueError(
                f"min_history must be None or an int >= 1, got {self.min_history!r}")
        if not _is_int(self.seed):
            raise TypeError(f"seed must be an int, got {self.seed!r}")
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")
        _check_number("safety", self.safety)
        if not 0.0 < self.safety <= 1.0:
            raise ValueError(f"safety must be in (0, 1], got {self.safety!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")

    @property
    def k(self) -> int:
        """Sub-streams per window."""
        return _micros(self.window) // _micros(self.substream)


@dataclasses.dataclass(frozen=True)
class WindowProgress:
    """Where one window of a replay stands, for an online driver.

    ``emitted``: its first pane's emission time (also when the pane is not
    reported because none of its events had arrived by then); ``short``:
    sub-stream index -> ``(stragglers still missing, fallback time)`` for
    sub-streams whose sample the given arrivals do not complete, so the
    pane waits for the fallback unless that many more stragglers arrive
    first; the counts are the window's share of the outcome's.
    """

    emitted: float
    short: dict[int, tuple[int, float]]
    observed: int
    sampled: int
    stragglers_after_emission: int
    late: int


@dataclasses.dataclass
class ReplayOutcome:
    """Results of a replay plus the accounting the metrics need.

    ``windows`` maps the absolute index of each window with events
    (``window_start = offset + index * window``) to its progress;
    ``settled[i]`` is when sub-stream ``first_sub + i`` settles (the
    K-slack watermark passes its end), non-decreasing in ``i``; the
    statistics history starts at sub-stream ``history_sub``.
    """

    results: list[ApproximateResult]
    observed: int = 0
    sampled: int = 0
    stragglers_after_emission: int = 0
    late: int = 0
    windows: dict[int, WindowProgress] = dataclasses.field(default_factory=dict)
    first_sub: int = 0
    history_sub: int = 0
    settled: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0))


def _micros(seconds: float) -> int:
    return int(round(seconds * _MICROS))


def key_seed(key: Hashable) -> int:
    """A seed for ``key``, the same in every process: the hash of the key as
    GroupByKey encodes it (``hash()`` and ``repr`` may differ between processes)."""
    return key_hash(untyped_key_coder("ApproximateWindowAggregate key").encode(key))


class _Stream:
    """One key's events in arrival order with the K-slack clock.

    ``past`` are (arrival times, delays) of the key's events not given, so
    K still counts them (an arrival of -inf stands for "long ago").
    """

    def __init__(self, gen: np.ndarray, arrival: np.ndarray, values: np.ndarray,
                 past: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        order = np.lexsort((values, gen, arrival))
        self.gen = gen[order]
        self.arrival = arrival[order]
        self.values = values[order]
        k_arrival, k_delay = self.arrival, self.arrival - self.gen
        if past is not None and len(past[0]):
            k_arrival = np.concatenate([k_arrival, np.asarray(past[0], dtype=np.float64)])
            k_delay = np.concatenate([k_delay, np.asarray(past[1], dtype=np.float64)])
            by_arrival = np.argsort(k_arrival, kind="stable")
            k_arrival, k_delay = k_arrival[by_arrival], k_delay[by_arrival]
        self._k_arrival = k_arrival
        self._kmax = np.maximum.accumulate(k_delay)

    def k_at(self, t: float) -> float:
        """Largest network delay observed by arrival time ``t`` (K of K-slack)."""
        i = int(np.searchsorted(self._k_arrival, t, side="right"))
        return float(self._kmax[i - 1]) if i else 0.0

    def settle(self, end: float) -> float:
        """First time the K-slack watermark ``t - K(t)`` reaches ``end``."""
        t = end + self.k_at(end)
        while True:
            nxt = end + self.k_at(t)
            if nxt <= t:
                return t
            t = nxt


def replay(gen: np.ndarray, arrival: np.ndarray, values: np.ndarray,
           config: SamplerConfig, key: Any = None, *, history_start: float | None = None,
           past_delays: tuple[np.ndarray, np.ndarray] | None = None) -> ReplayOutcome:
    """Replay one key's events in arrival order and return its panes.

    The statistics history starts with the window of the first event to
    arrive, so an event generated earlier but arriving later does not
    rewrite the history of panes already due. A window's first pane is
    reported when at least one of its events arrived by its emission time,
    a correction when a straggler arrived by the K-slack watermark: each
    pane depends only on the arrivals up to its ``emitted_at``.

    An online driver that dropped a key's old events passes where the
    history now starts (``history_start``, a window boundary) and the
    (arrival, delay) of dropped events that still matter for K
    (``past_delays``).

    Cost: O(E log E) for E events plus O(S * m) for S sub-streams.

    >>> g = np.arange(0, 4, 0.01); out = replay(g, g + 0.05, np.ones_like(g),
    ...     SamplerConfig(window=1.0, substream=0.5, history=2))
    >>> [round(r.estimate, 6) for r in out.results]
    [1.0, 1.0, 1.0, 1.0]
    """
    gen = np.asarray(gen, dtype=np.float64)
    arrival = np.asarray(arrival, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if not len(gen) == len(arrival) == len(values):
        raise ValueError("gen, arrival and values must have the same length")
    outcome = ReplayOutcome(results=[])
    if len(gen) == 0:
        return outcome
    stream = _Stream(gen, arrival, values, past_delays)
    return _Replay(stream, config, key, outcome, history_start).run()


class _Replay:
    def __init__(self, stream: _Stream, config: SamplerConfig, key: Any,
                 outcome: ReplayOutcome, history_start: float | None = None) -> None:
        self.s = stream
        self.c = config
        self.key = key
        self.out = outcome
        self.f = config.substream
        self.z = est.z_value(config.confidence)
        # The sample is planned for a smaller miss probability than the one
        # asked for: eq. 4.4 is exact only if the history's mean and sigma
        # are the window's and the mean is normal; heavy tails and drift
        # would otherwise put coverage right at (or under) the target.
        self.z_plan = est.z_value(1.0 - (1.0 - config.confidence) * config.safety)
        self.min_history = config.min_history or min(config.history, config.k)
        self.seed = key_seed(key)
        self.f_us = f_us = _micros(config.substream)
        self.off_us = off_us = _micros(config.offset)
        gen_us = np.round(stream.gen * _MICROS).astype(np.int64)
        sub = (gen_us - off_us) // f_us
        k = config.k
        # The stream is in arrival order: sub[0] is the first event to arrive.
        history_sub = (int(sub[0]) if history_start is None
                       else (_micros(history_start) - off_us) // f_us)
        history_sub -= history_sub % k
        # Stable sort keeps arrival order inside each sub-stream.
        self.by_sub = np.argsort(sub, kind="stable")
        sorted_sub = sub[self.by_sub]
        self.first = min(int(sorted_sub[0]), history_sub)
        last = max(int(sorted_sub[-1]), history_sub)
        # Whole windows: pad to window boundaries.
        self.first -= self.first % k
        last += k - 1 - last % k
        bounds = np.arange(self.first, last + 2)
        self.cuts = np.searchsorted(sorted_sub, bounds)
        self.n_sub = last - self.first + 1
        self.settled = np.array([stream.settle(self.sub_end(j)) for j in range(self.n_sub)])
        outcome.first_sub = self.first
        outcome.history_sub = history_sub
        outcome.settled = self.settled
        self.monitor = StatisticsMonitor(config.history, self.f)
        for j in range(history_sub - self.first, self.n_sub):
            idx = self.events(j)
            seen = idx[stream.arrival[idx] <= self.settled[j]]
            self.monitor.add(float(self.settled[j]), SubstreamStats.of(
                j, stream.gen[seen], stream.arrival[seen], stream.values[seen]))

    # Boundaries from integer microseconds, so 8 * 0.3 is 2.4, not 2.4000000000000004.
    def sub_start(self, j: int) -> float:
        return (self.off_us + (self.first + j) * self.f_us) / _MICROS

    def sub_end(self, j: int) -> float:
        return (self.off_us + (self.first + j + 1) * self.f_us) / _MICROS

    def events(self, j: int) -> np.ndarray:
        """Indices (into the arrival-ordered stream) of sub-stream ``j``, in arrival order."""
        return self.by_sub[self.cuts[j]:self.cuts[j + 1]]

    def draws(self, j: int, size: int) -> np.ndarray:
        # One generator per (seed, key, sub-stream): the draws do not depend
        # on how events are bundled or on other keys.
        entropy = [self.c.seed & 0xFFFFFFFF, self.seed, (self.first + j) % (1 << 63)]
        return np.random.default_rng(entropy).random(size)

    def run(self) -> ReplayOutcome:
        k = self.c.k
        for w0 in range(0, self.n_sub, k):
            subs = range(w0, w0 + k)
            if self.cuts[w0 + k] == self.cuts[w0]:
                continue  # no events: nothing to report
            self.window(subs)
        self.out.results.sort(key=lambda r: (r.emitted_at, r.window_start, r.is_correction))
        return self.out

    def window(self, subs: range) -> None:
        c, s = self.c, self.s
        start, end = self.sub_start(subs[0]), self.sub_end(subs[-1])
        settle = float(self.settled[subs[-1]])
        hist = self.monitor.view_at(start)
        mode = c.mode
        if hist is None or hist.substreams < self.min_history:
            mode = "exact"  # warm-up: no estimators yet, so wait like Default
        masks: list[np.ndarray] = []
        short: dict[int, tuple[int, float]] = {}
        emitted = end
        if mode == "exact":
            emitted = settle
            for j in subs:
                masks.append(s.arrival[self.events(j)] <= settle)
        else:
            expected = est.substream_size(self.f, hist.mean_gap)
            pop = est.window_size(expected, hist.size_sd, c.k)
            if c.aggregate == "count":
                target = 0.0
            elif mode == "aq_kslack":
                target = est.sample_size_chebyshev(c.error, c.confidence, hist.value_sd,
                                                   abs(hist.value_mean), pop)
            else:
                target = est.sample_size_mean(c.error, self.z_plan, hist.value_sd,
                                              abs(hist.value_mean), pop)
            per_sub = math.ceil(target / c.k)
            if mode != "aion":
                emitted = settle
            for j in subs:
                idx = self.events(j)
                arr = s.arrival[idx]
                u = self.draws(j, len(idx))
                if mode == "aq_kslack":
                    theta = min(1.0, target / pop) if pop > 0 else 1.0
                    masks.append((arr <= settle) & (u < theta))
                    continue
                hist_j = self.monitor.view_at(self.sub_start(j)) or hist
                if mode == "aion_minus":
                    theta = est.substream_rate(per_sub, est.substream_size(self.f, hist_j.mean_gap))
                    masks.append((arr <= settle) & (u < theta))
                    continue
                theta = est.substream_rate(per_sub, est.arrived_by_deadline(
                    self.f, hist_j.mean_delay, hist_j.mean_gap))
                mask, done, missing = self.safe_to_process(j, arr, u, theta, per_sub)
                masks.append(mask)
                emitted = max(emitted, done)
                if missing:
                    short[self.first + j] = (missing, done)
        self.emit(subs, start, end, emitted, masks, settle, mode, short)

    def safe_to_process(self, j: int, arr: np.ndarray, u: np.ndarray, theta: float,
                        target: int) -> tuple[np.ndarray, float, int]:
        """Algorithm 4 SafeToProcess for sub-stream ``j``: the sample mask,
        the time it is processed, ``max(deadline, time the sample completed)``,
        and how many stragglers the sample still misses (0 when complete).

        Before the deadline events are drawn at ``theta``; if the sample is
        short at the deadline, every straggler is taken until it is complete
        (the least wait), falling back to the K-slack watermark.
        """
        deadline = self.sub_end(j)
        before = arr <= deadline
        mask = before & (u < theta)
        have = int(mask.sum())
        if have >= target:
            return mask, deadline, 0
        after = np.flatnonzero(~before)
        fallback = float(self.settled[j])
        after = after[arr[after] <= fallback]
        need = target - have
        if len(after) >= need:
            mask[after[:need]] = True
            return mask, float(arr[after[need - 1]]), 0
        mask[after] = True
        return mask, fallback, need - len(after)

    def emit(self, subs: range, start: float, end: float, emitted: float,
             masks: list[np.ndarray], settle: float, mode: str,
             short: dict[int, tuple[int, float]]) -> None:
        c, s = self.c, self.s
        idx = np.concatenate([self.events(j) for j in subs])
        mask = np.concatenate(masks)
        arr = s.arrival[idx]
        sample = s.values[idx[mask]]
        observed = int((arr <= emitted).sum())
        hist = self.monitor.view_at(emitted)
        missing = 0.0
        if hist is not None and hist.mean_gap > 0:
            rate = 1.0 / hist.mean_gap
            missing = sum(est.expected_missing(rate, hist.delays, emitted,
                                               self.sub_start(j), self.sub_end(j)) for j in subs)
        population = observed + missing
        n = len(sample)
        mean = float(sample.mean()) if n else math.nan
        sd = float(sample.std(ddof=1)) if n >= 2 else 0.0
        if hist is not None and mode != "exact":
            # With skewed values a sample's sd is small exactly when its mean
            # is: the history's sigma (thousands of events) keeps the
            # interval from being too narrow in those windows.
            sd = max(sd, hist.value_sd)
        if c.aggregate == "mean":
            estimate = mean
            low, high = est.mean_interval(mean, sd, n, population, self.z)
        elif c.aggregate == "sum":
            estimate, low, high = est.sum_interval(mean, sd, n, population, missing, self.z)
        else:
            estimate = population
            low, high = est.count_interval(population, missing, self.z)
        if observed:
            # Known at emission only if one of its events had arrived by then.
            self.out.results.append(ApproximateResult(
                self.key, start, end, estimate, low, high, n, population, emitted,
                emitted > end))
        stragglers = arr > emitted
        n_after = int(stragglers.sum())
        final = emitted
        if c.corrections and settle > emitted and (stragglers & (arr <= settle)).any():
            final = settle
            vals = s.values[idx[arr <= settle]]
            exact = {"mean": float(vals.mean()), "sum": float(vals.sum()),
                     "count": float(len(vals))}[c.aggregate]
            self.out.results.append(ApproximateResult(
                self.key, start, end, exact, exact, exact, len(vals), float(len(vals)),
                settle, True, is_correction=True))
        late = int((arr > final).sum())
        self.out.windows[(self.first + subs[0]) // c.k] = WindowProgress(
            emitted, short, len(idx), n, n_after, late)
        self.out.observed += len(idx)
        self.out.sampled += n
        self.out.stragglers_after_emission += n_after
        self.out.late += late
