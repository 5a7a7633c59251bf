"""Deterministic event streams under the delay settings of Farhat's thesis
(section 4.2.1), for tests, benchmarks and demos.

Every event has a generation time (``gen_ts``), an arrival time
(``arr_ts = gen_ts + network delay``) and a value. Streams are generated in
one-second chunks of generation time, each from its own seeded generator, so
a chunk can be produced anywhere (a Spark task, a Beam worker) and the
stream is the same bit for bit.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

import numpy as np

# Thesis delays are in milliseconds at 1,000 events/s (mean gap 1 ms);
# other rates scale the inter-event gaps, never the network delay.
_BASE_RATE = 1000.0
_CHUNK = 1.0
WORKLOADS = ("ysb", "nyt")
_YSB_TYPES = ("view", "click", "purchase")


def _network(setting: str, rng: np.random.Generator, n: int) -> np.ndarray:
    kind = setting[0]
    if kind == "C":
        return np.full(n, 0.150)
    if kind == "G":
        return rng.gamma(60.0, 4.0, n) / 1000.0
    if kind == "E":
        return rng.exponential(0.240, n)
    return rng.uniform(0.0, 0.300, n)  # U: mean 150 ms like C


def _gaps(setting: str, rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    scale = _BASE_RATE / rate / 1000.0
    kind = setting[1]
    if kind == "C":
        return np.full(n, scale)
    if kind == "G":
        return rng.gamma(2.0, 0.5, n) * scale
    return rng.uniform(0.0, 2.0, n) * scale  # U: mean 1 ms like C


DELAY_SETTINGS = {
    "CC": "network 150 ms constant; inter-event 1 ms constant",
    "GG": "network Gamma(k=60, theta=4) ms; inter-event Gamma(k=2, theta=0.5) ms",
    "EC": "network Exponential(mean 240 ms); inter-event 1 ms constant",
    "EG": "network Exponential(mean 240 ms); inter-event Gamma(k=2, theta=0.5) ms",
    "UU": "network Uniform(0, 300) ms; inter-event Uniform(0, 2) ms",
}
"""Delay settings; inter-event delays are for 1,000 events/s and scale with the rate."""


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """What stream to generate.

    ``workload`` is ``"ysb"`` (ad events: ``campaign``, ``event_type``;
    ``value`` is 1.0 for a view, else 0.0, so a per-campaign sum counts
    views) or ``"nyt"`` (taxi trips: ``value`` is a log-normal, heavy-tailed
    trip distance in miles). ``rate`` is events/s of generation time.

    >>> StreamSpec("nyt", "EG", rate=5000.0, duration=2.0).chunks
    2
    """

    workload: str
    delays: str
    rate: float = 5000.0
    duration: float = 60.0
    seed: int = 0
    campaigns: int = 10

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {self.workload!r}")
        if self.delays not in DELAY_SETTINGS:
            raise ValueError(f"delays must be one of {sorted(DELAY_SETTINGS)}, got {self.delays!r}")
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 events/s, got {self.rate!r}")
        if not self.duration > 0:
            raise ValueError(f"duration must be > 0 seconds, got {self.duration!r}")
        if self.campaigns < 1:
            raise ValueError(f"campaigns must be >= 1, got {self.campaigns!r}")

    @property
    def chunks(self) -> int:
        return math.ceil(self.duration / _CHUNK)


@dataclasses.dataclass(frozen=True)
class EventBatch:
    """Columns of a generated stream, in arrival order.

    ``campaign`` and ``event_type`` are integer codes (YSB only; zeros for
    NYT). ``events()`` yields the same events as dicts.
    """

    gen_ts: np.ndarray
    arr_ts: np.ndarray
    value: np.ndarray
    campaign: np.ndarray
    event_type: np.ndarray
    workload: str

    def __len__(self) -> int:
        return len(self.gen_ts)

    def events(self) -> Iterator[dict[str, Any]]:
        """The events as dicts, in arrival order."""
        for i in range(len(self)):
            yield _event(self, i)


def _event(batch: EventBatch, i: int) -> dict[str, Any]:
    event = {"gen_ts": float(batch.gen_ts[i]), "arr_ts": float(batch.arr_ts[i]),
             "value": float(batch.value[i])}
    if batch.workload == "ysb":
        event["campaign"] = f"campaign-{int(batch.campaign[i])}"
        event["event_type"] = _YSB_TYPES[int(batch.event_type[i])]
    else:
        event["trip_distance"] = event["value"]
    return event


def generate_chunk(spec: StreamSpec, chunk: int) -> EventBatch:
    """Events generated in ``[chunk, chunk + 1)`` s (capped at the duration), in arrival order."""
    rng = np.random.default_rng([spec.seed & 0xFFFFFFFF, chunk, 0x5A3])
    start = chunk * _CHUNK
    stop = min(start + _CHUNK, spec.duration)
    expected = max(16, int((stop - start) * spec.rate * 1.3) + 64)
    gaps = _gaps(spec.delays, rng, expected, spec.rate)
    gen = start + np.cumsum(gaps) - gaps[0]
    while gen[-1] < stop:  # a rare slow chunk: draw more gaps
        more = _gaps(spec.delays, rng, expected, spec.rate)
        gen = np.concatenate([gen, gen[-1] + np.cumsum(more)])
    gen = gen[gen < stop]
    n = len(gen)
    arr = gen + _network(spec.delays, rng, n)
    if spec.workload == "ysb":
        campaign = rng.integers(0, spec.campaigns, n)
        event_type = rng.integers(0, len(_YSB_TYPES), n)
        value = (event_type == 0).astype(np.float64)
    else:
        campaign = np.zeros(n, dtype=np.int64)
        event_type = np.zeros(n, dtype=np.int64)
        value = rng.lognormal(mean=0.7, sigma=0.9, size=n)
    order = np.lexsort((gen, arr))
    return EventBatch(gen[order], arr[order], value[order], campaign[order],
                      event_type[order], spec.workload)


def generate(spec: StreamSpec) -> EventBatch:
    """The whole stream in arrival order. Cost O(E log E).

    >>> b = generate(StreamSpec("ysb", "CC", rate=1000.0, duration=1.0))
    >>> len(b), bool(np.allclose(b.arr_ts - b.gen_ts, 0.15))
    (1000, True)
    """
    parts = [generate_chunk(spec, c) for c in range(spec.chunks)]
    cols = {name: np.concatenate([getattr(p, name) for p in parts])
            for name in ("gen_ts", "arr_ts", "value", "campaign", "event_type")}
    order = np.lexsort((cols["gen_ts"], cols["arr_ts"]))
    return EventBatch(**{k: v[order] for k, v in cols.items()}, workload=spec.workload)


def iter_events(spec: StreamSpec) -> Iterator[dict[str, Any]]:
    """The stream as dicts in arrival order (``gen_ts``, ``arr_ts``,
    ``value`` and the workload's fields)."""
    return generate(spec).events()
