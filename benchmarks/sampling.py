"""Straggler-free sampling vs. the thesis baselines, as a discrete-event simulation.

For each workload (YSB-like views per campaign, NYT-like mean trip
distance), delay setting (CC, GG, EC, EG, UU) and rate (5,000 and 25,000
events/s of simulated time), the same generated stream is replayed by four
algorithms in one run:

  Default     exact, processed at the K-slack watermark (K = max delay seen)
  AQ-K-Slack  Chebyshev sample size, uniform rate, K-slack watermark
  Aion-minus  eq. 4.4 sample size, rate over the whole sub-stream, K-slack
  Aion (ours) eq. 4.4 + eq. 4.7/4.8 rates, SafeToProcess emission

Output latency of a window = (emission time - window end) on the arrival
clock + a processing cost per processed event (the simulated operator's
cost; --cost-ysb-us / --cost-nyt-us). Time is simulated, so the numbers do
not depend on the machine's load.

    python benchmarks/sampling.py            # full run, writes docs/benchmarks/sampling.md
    python benchmarks/sampling.py --quick    # smoke run
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from beam_ext.io import StreamSpec, generate  # noqa: E402
from beam_ext.transforms.sampling._sampler import SamplerConfig, replay  # noqa: E402

ALGORITHMS = {"Default": "exact", "AQ-K-Slack": "aq_kslack", "Aion-minus": "aion_minus",
              "Aion (ours)": "aion"}
SETTINGS = ("UU", "CC", "GG", "EC", "EG")
RATES = (5000.0, 25000.0)
WORKLOADS = ("ysb", "nyt")
WINDOW, SUBSTREAM, ERROR, CONFIDENCE = 3.0, 0.6, 0.05, 0.95
DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "benchmarks")


@dataclasses.dataclass
class AlgoRun:
    """Per-window measurements of one algorithm on one configuration."""

    latency: np.ndarray   # seconds, wait + processing cost
    wait: np.ndarray      # seconds, emission - window end
    error: np.ndarray     # relative error vs the exact window aggregate
    sampled: int
    observed: int

    @property
    def within(self) -> float:
        return float((self.error <= ERROR).mean())

    @property
    def rate(self) -> float:
        return self.sampled / self.observed if self.observed else 0.0


def run_config(workload: str, setting: str, rate: float, duration: float, seed: int,
               cost_us: float, warmup: float = 9.0) -> dict[str, AlgoRun]:
    """Replay one generated stream with every algorithm; windows starting
    before ``warmup`` seconds (history still filling) are left out for all."""
    batch = generate(StreamSpec(workload, setting, rate=rate, duration=duration, seed=seed))
    aggregate = "sum" if workload == "ysb" else "mean"
    keys = np.unique(batch.campaign)
    runs = {}
    for name, mode in ALGORITHMS.items():
        cfg = SamplerConfig(window=WINDOW, substream=SUBSTREAM, aggregate=aggregate,
                            error=ERROR, confidence=CONFIDENCE, mode=mode, seed=seed)
        lat, wait, err, sampled, observed = [], [], [], 0, 0
        for key in keys:
            m = batch.campaign == key
            gen, arr, val = batch.gen_ts[m], batch.arr_ts[m], batch.value[m]
            widx = np.floor(gen / WINDOW).astype(np.int64)
            sums, counts = np.bincount(widx, val), np.bincount(widx)
            out = replay(gen, arr, val, cfg, key=int(key))
            for r in out.results:
                w = int(round(r.window_start / WINDOW))
                if r.window_start < warmup or r.window_end > duration:
                    continue
                truth = sums[w] / counts[w] if aggregate == "mean" else sums[w]
                waited = r.emitted_at - r.window_end
                wait.append(waited)
                lat.append(waited + cost_us * 1e-6 * r.sample_size)
                err.append(abs(r.estimate - truth) / abs(truth))
                sampled += r.sample_size
                observed += int(counts[w])
        runs[name] = AlgoRun(np.array(lat), np.array(wait), np.array(err), sampled, observed)
    return runs


def coverage_study(setting: str, aggregate: str, seeds: int, duration: float,
                   rate: float = 5000.0, warmup: float = 9.0) -> tuple[float, float, int]:
    """Ours only, NYT-like values, many streams: (fraction of windows within
    the bound, fraction whose reported interval holds the truth, windows)."""
    within, covered, total = 0, 0, 0
    for seed in range(seeds):
        batch = generate(StreamSpec("nyt", setting, rate=rate, duration=duration, seed=1000 + seed))
        widx = np.floor(batch.gen_ts / WINDOW).astype(np.int64)
        sums, counts = np.bincount(widx, batch.value), np.bincount(widx)
        cfg = SamplerConfig(window=WINDOW, substream=SUBSTREAM, aggregate=aggregate,
                            error=ERROR, confidence=CONFIDENCE, seed=seed)
        for r in replay(batch.gen_ts, batch.arr_ts, batch.value, cfg).results:
            if r.window_start < warmup or r.window_end > duration:
                continue
            w = int(round(r.window_start / WINDOW))
            truth = sums[w] / counts[w] if aggregate == "mean" else sums[w]
            within += abs(r.estimate - truth) / truth <= ERROR
            covered += r.ci_low <= truth <= r.ci_high
            total += 1
    return within / total, covered / total, total


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if len(a) else float("nan")


def _reduction(ours: float, base: float) -> float:
    return 100.0 * (1.0 - ours / base) if base > 0 else float("nan")


def _plots(results, out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for workload in WORKLOADS:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, rate in zip(axes, RATES):
            runs = results.get((workload, "EG", rate))
            if runs is None:
                continue
            for name, run in runs.items():
                lat = np.sort(run.latency) * 1000
                ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=name)
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_xlabel("output latency (ms)")
            ax.set_ylabel("CDF")
            ax.set_title(f"{workload.upper()}-like, EG, {int(rate):,} events/s")
            ax.grid(alpha=0.3)
        axes[0].legend()
        fig.tight_layout()
        name = f"sampling_cdf_{workload}.png"
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        files.append(name)

        fig, ax = plt.subplots(figsize=(8, 4))
        width = 0.2
        for i, algo in enumerate(ALGORITHMS):
            means = [results[(workload, s, RATES[-1])][algo].latency.mean() * 1000
                     if (workload, s, RATES[-1]) in results else np.nan for s in SETTINGS]
            ax.bar(np.arange(len(SETTINGS)) + (i - 1.5) * width, means, width, label=algo)
        ax.set_xticks(np.arange(len(SETTINGS)), SETTINGS)
        ax.set_ylabel("mean output latency (ms)")
        ax.set_yscale("log")
        ax.set_title(f"{workload.upper()}-like, {int(RATES[-1]):,} events/s")
        ax.legend()
        fig.tight_layout()
        name = f"sampling_latency_{workload}.png"
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        files.append(name)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, workload in zip(axes, WORKLOADS):
        runs = results.get((workload, "EG", RATES[-1]))
        if runs is None:
            continue
        names = [n for n in ALGORITHMS if n != "Default"]
        ax.boxplot([runs[n].error * 100 for n in names], tick_labels=names)
        ax.axhline(ERROR * 100, color="red", linestyle="--", label="r_thr = 5%")
        ax.set_ylabel("relative error (%)")
        ax.set_title(f"{workload.upper()}-like, EG, {int(RATES[-1]):,} events/s")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "sampling_error.png"), dpi=110)
    plt.close(fig)
    files.append("sampling_error.png")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run, no docs")
    parser.add_argument("--duration", type=float, default=60.0, help="simulated seconds per stream")
    parser.add_argument("--seeds", type=int, default=1, help="streams per configuration")
    parser.add_argument("--coverage-seeds", type=int, default=12,
                        help="streams per (delays, aggregate) in the coverage study")
    parser.add_argument("--cost-ysb-us", type=float, default=2.0,
                        help="processing cost per processed YSB event (simulated microseconds)")
    parser.add_argument("--cost-nyt-us", type=float, default=10.0,
                        help="processing cost per processed NYT event (simulated microseconds)")
    args = parser.parse_args(argv)
    duration, seeds = (15.0, 1) if args.quick else (args.duration, args.seeds)
    settings = ("EG",) if args.quick else SETTINGS
    rates = (5000.0,) if args.quick else RATES
    started = time.time()
    results: dict = {}
    rows = []
    for workload in WORKLOADS:
        cost = args.cost_ysb_us if workload == "ysb" else args.cost_nyt_us
        for setting in settings:
            for rate in rates:
                merged: dict[str, list[AlgoRun]] = {n: [] for n in ALGORITHMS}
                for seed in range(seeds):
                    for n, r in run_config(workload, setting, rate, duration, seed, cost).items():
                        merged[n].append(r)
                runs = {n: AlgoRun(np.concatenate([r.latency for r in rs]),
                                   np.concatenate([r.wait for r in rs]),
                                   np.concatenate([r.error for r in rs]),
                                   sum(r.sampled for r in rs), sum(r.observed for r in rs))
                        for n, rs in merged.items()}
                results[(workload, setting, rate)] = runs
                ours = runs["Aion (ours)"].latency.mean()
                for name, run in runs.items():
                    rows.append((workload, setting, int(rate), name, run.latency.mean() * 1e3,
                                 _pct(run.latency, 95) * 1e3, _pct(run.latency, 99) * 1e3,
                                 run.wait.mean() * 1e3, run.within, run.error.mean(), run.rate,
                                 len(run.error),
                                 _reduction(ours, run.latency.mean()) if name != "Aion (ours)" else float("nan")))
                print(f"{workload} {setting} {int(rate):>6}/s: ours {ours * 1e3:8.1f} ms; "
                      f"-{_reduction(ours, runs['Default'].latency.mean()):.0f}% vs Default, "
                      f"-{_reduction(ours, runs['AQ-K-Slack'].latency.mean()):.0f}% vs AQ-K-Slack; "
                      f"within bound {runs['Aion (ours)'].within:.3f}", flush=True)
    coverage = []
    for setting in ("GG", "EG"):
        for aggregate in ("mean", "sum"):
            within, covered, total = coverage_study(
                setting, aggregate, 2 if args.quick else args.coverage_seeds,
                15.0 if args.quick else 45.0)
            coverage.append(f"| {setting} | {aggregate} | {total} | {within:.3f} | {covered:.3f} |")
            print(f"coverage {setting} {aggregate}: within bound {within:.3f}, "
                  f"interval holds truth {covered:.3f}, {total} windows", flush=True)
    elapsed = time.time() - started
    header = ("| workload | delays | events/s | algorithm | mean ms | p95 ms | p99 ms | wait ms "
              "| within 5% | mean rel. err | sampling rate | windows | ours: latency reduction |")
    table = [header, "|" + "---|" * 13]
    for r in rows:
        red = "" if np.isnan(r[12]) else f"{r[12]:.0f}%"
        table.append(f"| {r[0].upper()} | {r[1]} | {r[2]:,} | {r[3]} | {r[4]:.1f} | {r[5]:.1f} | "
                     f"{r[6]:.1f} | {r[7]:.1f} | {r[8]:.3f} | {r[9]:.4f} | {r[10]:.3f} | {r[11]} | {red} |")
    print("\n".join(table))
    print(f"simulated in {elapsed:.0f} s")
    if args.quick:
        return 0
    files = _plots(results, DOCS)
    _write_doc(table, files, args, elapsed, results, coverage, DOCS)
    return 0


def _write_doc(table, files, args, elapsed, results, coverage, out_dir: str) -> None:
    cmd = (f"python benchmarks/sampling.py --duration {args.duration:g} --seeds {args.seeds} "
           f"--coverage-seeds {args.coverage_seeds} "
           f"--cost-ysb-us {args.cost_ysb_us:g} --cost-nyt-us {args.cost_nyt_us:g}")
    eg = {w: results[(w, "EG", RATES[-1])] for w in WORKLOADS}

    def red(w, base):
        return _reduction(eg[w]["Aion (ours)"].latency.mean(), eg[w][base].latency.mean())

    with open(os.path.join(out_dir, "sampling.md"), "w") as fh:
        fh.write(f"""# Benchmark: straggler-free sampling (thesis chapter 4)

Reproduce every number and figure on this page with:

    {cmd}

(`make bench` runs it with these defaults.) Simulated time: the generated
streams are replayed as a discrete-event simulation on the arrival clock, so
latencies are exact and do not depend on the machine; the run itself took
{elapsed:.0f} s of wall-clock on a shared, busy 2-core machine.

Setup, as in thesis section 4.2.1: tumbling windows of {WINDOW:g} s, sub-streams of
f = {SUBSTREAM:g} s, history m = 20, r_thr = {ERROR:.0%}, confidence {CONFIDENCE:.2f};
{args.seeds} generated stream(s) of {args.duration:g} s per configuration; the first 9 s
(three windows, while the estimators' history fills) are left out for every
algorithm. YSB-like: views per campaign (10 campaigns, sum of a 0/1 view
indicator). NYT-like: mean trip distance (log-normal, heavy tail).
Output latency = emission time - window end + a processing cost of
{args.cost_ysb_us:g} us (YSB) / {args.cost_nyt_us:g} us (NYT) per processed event (our
stand-in for the operator's cost, which dominated the thesis's Flink
numbers); "wait ms" is the first term alone.

## Acceptance targets (EG, 25,000 events/s)

| | thesis (YSB) | ours YSB-like | ours NYT-like | target |
|---|---|---|---|---|
| latency reduction vs Default | 85% | {red('ysb', 'Default'):.1f}% | {red('nyt', 'Default'):.1f}% | >= 80% |
| latency reduction vs AQ-K-Slack | 78% | {red('ysb', 'AQ-K-Slack'):.1f}% | {red('nyt', 'AQ-K-Slack'):.1f}% | >= 70% |
| windows within 5% | all (YSB), 97% (NYT) | {eg['ysb']['Aion (ours)'].within:.1%} | {eg['nyt']['Aion (ours)'].within:.1%} | >= 95% |

Thesis figures beside ours (the thesis's own plots are not reproduced here;
its reported numbers are): fig. 4.2 (YSB mean latency per delay setting) ->
`sampling_latency_ysb.png`; fig. 4.5 (NYT) -> `sampling_latency_nyt.png`;
figs. 4.3 / 4.6 (latency CDF, EG, 5,000 and 25,000 events/s: Aion 76-87%
below Default, 70-85% below AQ-K-Slack at p90-p99) -> `sampling_cdf_*.png`;
figs. 4.4 / 4.7 (error distribution, EG, 25,000/s: mean error ~3% YSB, 3 of
100 NYT windows above 5%) -> `sampling_error.png`.

""")
        for f in files:
            fh.write(f"![{f}]({f})\n\n")
        fh.write(f"""## Coverage study (ours, NYT-like values, 5,000 events/s)

{args.coverage_seeds} streams of 45 s per row (different seeds from the table
below); "within 5%" must be >= 0.95, "interval holds" is the reported
confidence interval's own coverage (nominal 0.95).

| delays | aggregate | windows | within 5% | interval holds truth |
|---|---|---|---|---|
""" + "\n".join(coverage) + "\n\n")
        fh.write("## All configurations\n\n" + "\n".join(table) + "\n\n")
        fh.write("""## Reading the numbers

- Default, AQ-K-Slack and Aion-minus all wait for the K-slack watermark, so
  their latency is the largest network delay seen so far (it keeps growing
  with exponential delays: several seconds under EC/EG) plus their
  processing cost. Aion emits at the deadline once the sample is complete;
  its latency is its (small) sample's cost plus, rarely, a few ms of
  waiting for the last stragglers of an incomplete sub-stream.
- Where we lose: under CC/UU the K-slack wait is short (150-300 ms), so
  the reduction is smaller. When a sub-stream's sample needs more events
  than eq. 4.7 expects by its deadline (YSB-like at 5,000 events/s: 500
  events/s per campaign, a 0/1 value needing ~75% of the window, and
  E[D] = 240 ms of f = 600 ms), the rate caps at 1 and Aion waits for
  stragglers: ~100 ms mean, ~300 ms p99 under GG/EC/EG, still far below
  the K-slack wait but no longer "straggler-free". At 25,000 events/s the
  same query samples 40% and never waits. The sample is planned for half the allowed miss probability
  (`safety=0.5`), so Aion samples ~30% more than eq. 4.4 as printed.
- Processing cost is a model (a constant per processed event), not a
  measurement of a Flink or Spark operator; the thesis's absolute
  latencies include Kafka, Flink and a real operator, which is why our
  reductions (99%+ under EG) are larger than the thesis's 85% / 78%: in a
  simulation nothing but the wait and the sample's cost is left.
- NYT-like rows have one stream of 17 windows each; the coverage study
  above is the better measure of accuracy.
""")


if __name__ == "__main__":
    raise SystemExit(main())
