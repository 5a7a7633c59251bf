"""trAcker vs punctuations on the RR-N workload (004 section 5), on this machine.

Runs the threaded simulator of beam_ext.watermark with three mechanisms side
by side in one run: punctuations, trAcker with one message per report, and
trAcker with local agents (10 ms flushes). Counts service messages exactly
(see beam_ext/watermark/simulator.py for what one message is), measures
notification latency (last source promise -> end seen by a process) and
throughput, prints ratios and writes docs/benchmarks/tracker.md + PNGs.

    .venv/bin/python benchmarks/tracker.py            # full run, ~5-8 min
    .venv/bin/python benchmarks/tracker.py --quick    # smoke run
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from beam_ext.watermark.simulator import MECHANISMS, Workload, simulate  # noqa: E402

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks")


@dataclass
class Row:
    sweep: str
    stages: int
    parallelism: int
    granularity: int
    mechanism: str
    elements: int
    messages: int
    per_100: float
    breakdown: dict
    latency_ms: float
    latency_p90_ms: float
    completed: bool
    violations: int
    throughput: float
    stage_spread_ms: float = float("nan")  # max - min of per-stage median latencies


def run_config(stages: int, parallelism: int, granularity: int, mechanisms, elements: int,
               rate: float | None, seed: int, sweep: str) -> list[Row]:
    """One workload with each mechanism; message counts are exact, latency measured."""
    rows = []
    for mech in mechanisms:
        n = elements
        if mech == "tracker" and stages * parallelism > 100:
            # One synchronous RPC per report saturates this machine on big graphs:
            # fewer elements (counts are per 100 elements; latency is then not comparable).
            n = min(elements, 60)
        w = Workload(stages=stages, parallelism=parallelism, elements=n,
                     granularity=granularity, rate=rate)
        r = simulate(w, mech, seed=seed, delay=(0.0, 0.001))
        lat = sorted(r.latencies) or [float("nan")]
        by_stage = list(r.extra.get("latency_by_stage", {}).values()) or [float("nan")]
        rows.append(Row(sweep, stages, parallelism, granularity, mech, n, r.service_messages,
                        100.0 * r.service_messages / n, r.message_breakdown,
                        1000 * statistics.median(lat), 1000 * lat[int(0.9 * (len(lat) - 1))],
                        r.completed, r.violations, r.throughput,
                        1000 * (max(by_stage) - min(by_stage))))
        print(f"  {sweep:12s} N={stages:<3d} P={parallelism:<3d} g={granularity:<3d} {mech:14s} "
              f"msgs={r.service_messages:<8d} per100={rows[-1].per_100:9.1f} "
              f"lat={rows[-1].latency_ms:7.1f}ms ok={r.completed} viol={r.violations}", flush=True)
    return rows


def sweeps(quick: bool) -> list[tuple[str, int, int, int, int]]:
    """(sweep, N, |P|, granularity, elements)."""
    if quick:
        return [("N", 2, 2, 4, 24), ("N", 3, 2, 4, 24), ("P", 3, 3, 4, 24)]
    out = []
    for n in (5, 10, 30):
        out.append(("N", n, 16, 10, 200))
    for p in (4, 8):
        out.append(("P", 30, p, 10, 200))
    out.append(("P", 30, 16, 10, 200))
    for g, e in ((1, 60), (50, 400)):
        out.append(("granularity", 30, 16, g, e))
    out.append(("granularity", 30, 16, 10, 200))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, smoke run")
    ap.add_argument("--rate", type=float, default=100.0, help="input elements per second (paper: 100)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    t0 = time.time()
    rows: list[Row] = []
    cache = {}
    for sweep, n, p, g, e in sweeps(args.quick):
        key = (n, p, g, e)
        if key in cache:
            rows += [Row(**{**r.__dict__, "sweep": sweep}) for r in cache[key]]
            continue
        got = run_config(n, p, g, MECHANISMS, e, args.rate, args.seed, sweep)
        cache[key] = got
        rows += got
    # Throughput: sources as fast as they can.
    thr = run_config(5, 4, 10, MECHANISMS, 100 if args.quick else 400, None, args.seed, "throughput")
    # Latency targets are read from repeated runs: one run on a shared machine is noisy.
    reps: list[Row] = []
    if not args.quick:
        for seed in (args.seed + 1, args.seed + 2):
            for n in (5, 30):
                reps += run_config(n, 16, 10, ("punctuation", "tracker_local"), 200, args.rate, seed, "repeat")
    write_report(rows, thr, args, time.time() - t0, reps)
    return 0


def _ratio(rows, sweep, n, p, g, a, b, field="messages"):
    pick = {r.mechanism: getattr(r, field) for r in rows if (r.sweep, r.stages, r.parallelism, r.granularity) == (sweep, n, p, g)}
    return pick[a] / pick[b] if pick.get(b) else float("nan")


def write_report(rows: list[Row], thr: list[Row], args, seconds: float, reps: list[Row] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(DOCS, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (sweep, xname) in zip(axes, (("N", "stages"), ("P", "parallelism"), ("granularity", "granularity"))):
        for mech in MECHANISMS:
            pts = sorted((getattr(r, xname), r.per_100) for r in rows if r.sweep == sweep and r.mechanism == mech)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=mech)
        ax.set_yscale("log")
        ax.set_xlabel({"N": "N (stages)", "P": "|P| (processes per stage)", "granularity": "elements per substream"}[sweep])
        ax.set_ylabel("service messages per 100 input elements")
        if ax.lines:
            ax.legend()
    fig.suptitle("Service messages (cf. 004 Fig. 10)")
    fig.tight_layout()
    msg_png = f"tracker_messages{suffix}.png"
    fig.savefig(os.path.join(DOCS, msg_png), dpi=90)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (sweep, xname) in zip(axes, (("N", "stages"), ("P", "parallelism"))):
        for mech in MECHANISMS:
            pts = sorted((getattr(r, xname), r.latency_ms) for r in rows if r.sweep == sweep and r.mechanism == mech)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=mech)
        ax.set_xlabel("N (stages)" if sweep == "N" else "|P| (processes per stage)")
        ax.set_yscale("log")
        ax.set_ylabel("median notification latency (ms)")
        if ax.lines:
            ax.legend()
    fig.suptitle("Notification latency (cf. 004 Fig. 11)")
    fig.tight_layout()
    lat_png = f"tracker_latency{suffix}.png"
    fig.savefig(os.path.join(DOCS, lat_png), dpi=90)

    cmd = "python benchmarks/tracker.py" + (" --quick" if args.quick else "")
    lines = [
        "# trAcker vs punctuations (004 section 5) on this machine",
        "",
        f"Reproduce: `{cmd}` (seed {args.seed}, input rate {args.rate:g} elements/s, channel delays "
        f"uniform 0-1 ms, local-agent flush 10 ms). Took {seconds:.0f} s. Numbers were taken on a shared "
        "2-core machine with other jobs running: latency and throughput are noisy; message counts are exact counts.",
        "",
        "What one service message is: punctuations: one punctuation on one data channel; trAcker: one "
        "protobuf message between a process and the service (a report batch, a heartbeat, or a Notification "
        "pushed to a process). The one-time Hello of each agent is not counted. `tracker` sends each "
        "SND/RCV/PROMISE as its own message from a per-process agent; `tracker_agent` has a per-process "
        "agent that aggregates by XOR for 10 ms; `tracker_local` has one local agent per executor "
        "(partition j of every stage lives in executor j, as the paper's VMs) aggregating for 10 ms, and "
        "one Notification to an executor carries the NEOSS of all its processes. On graphs of more than 100 "
        "processes `tracker` runs 60 elements only (see the elements column): it saturates this machine.",
        "",
        f"![messages]({msg_png})",
        "",
        f"![latency]({lat_png})",
        "",
        "| sweep | N | P | g | mechanism | elements | messages | per 100 elements | median latency ms | p90 ms | stage spread ms | completed | violations |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.sweep} | {r.stages} | {r.parallelism} | {r.granularity} | {r.mechanism} | {r.elements} | {r.messages} | "
                     f"{r.per_100:.1f} | {r.latency_ms:.1f} | {r.latency_p90_ms:.1f} | {r.stage_spread_ms:.1f} | "
                     f"{r.completed} | {r.violations} |")
    lines += ["", "## Throughput (sources unthrottled, N=5, |P|=4, g=10)", "",
              "| mechanism | elements/s | service messages |", "|---|---|---|"]
    for r in thr:
        lines.append(f"| {r.mechanism} | {r.throughput:.0f} | {r.messages} |")
    if not args.quick:
        big = ("granularity", 30, 16, 10)
        ratio_local = _ratio(rows, *big, "punctuation", "tracker_local")
        ratio_plain = _ratio(rows, *big, "punctuation", "tracker")
        samples: dict = {}
        for r in [r for r in rows if r.sweep == "N"] + list(reps):
            samples.setdefault((r.mechanism, r.stages), []).append(r.latency_ms)
        lat = {k: statistics.median(v) for k, v in samples.items()}
        growth_t = lat[("tracker_local", 30)] / lat[("tracker_local", 5)]
        growth_p = lat[("punctuation", 30)] / lat[("punctuation", 5)]
        runs = len(samples[("tracker_local", 30)])
        lines += [
            "",
            "## Targets",
            "",
            f"- Messages at N=30, |P|=16, g=10: punctuations / trAcker-local = **{ratio_local:.1f}x** "
            f"(target >= 10x; paper: up to 30x); punctuations / trAcker without local agents = {ratio_plain:.1f}x "
            "(paper: 1.5-5x).",
            f"- Median notification latency N=5 -> N=30 (|P|=16, median over {runs} runs with seeds "
            f"{args.seed}..{args.seed + runs - 1}): trAcker-local "
            f"{lat[('tracker_local', 5)]:.1f} -> {lat[('tracker_local', 30)]:.1f} ms, grows **{growth_t:.2f}x** "
            f"(target < 2x); punctuations {lat[('punctuation', 5)]:.1f} -> {lat[('punctuation', 30)]:.1f} ms, "
            f"grow {growth_p:.2f}x.",
            "- Per-run medians: " + "; ".join(
                f"{m} N={n}: " + ", ".join(f"{v:.1f}" for v in samples[(m, n)])
                for m in ("tracker_local", "punctuation") for n in (5, 30)
            ) + " ms.",
        ]
        print(f"RATIO punctuation/tracker_local messages at N=30,P=16,g=10: {ratio_local:.2f}x")
        print(f"RATIO punctuation/tracker messages at N=30,P=16,g=10: {ratio_plain:.2f}x")
        print(f"LATENCY growth N=5->30: tracker_local {growth_t:.2f}x, punctuation {growth_p:.2f}x")
    lines += ["", "## Reading the numbers", "", ANALYSIS, "", "## The paper beside ours", "", PAPER_NOTES]
    name = f"tracker{suffix}.md"
    with open(os.path.join(DOCS, name), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote docs/benchmarks/{name}")


ANALYSIS = """- **Messages are exact counts**, not samples: punctuations are exactly
  K * N * |P|^2 (every process forwards each rise on each of its |P| output
  channels); trAcker counts are what the service received and pushed.
- **Where trAcker wins.** With executor-level local agents (`tracker_local`)
  reports are one flush per executor per 10 ms and one Notification per
  executor and release, so traffic is O(|executors|) per flush instead of
  O(N |P|^2) per substream: two orders of magnitude fewer messages at N=30,
  |P|=16. Its notification latency is the same for every stage of a run (see
  the stage spread column: all processes are released together) and it
  stays in tens of milliseconds where punctuations reach hundreds.
- **Where trAcker loses.** Without aggregation (`tracker`, one message per
  SND/RCV/PROMISE) it costs 2 (N+1) messages per element plus NEOSS: at
  |P|=4 that is more than punctuations (K N |P|^2 / elements = N |P|^2 / g),
  and each report is a synchronous RPC, so this machine saturates on big
  graphs (latencies of seconds; only 60 elements are run there). Per-process
  agents with aggregation (`tracker_agent`) cut reports but still send one
  Notification per process and substream and run 500 agents' threads in one
  interpreter: also saturated at N=30. Unthrottled throughput is lower with
  trAcker than with punctuations here, because the agents' reporting runs in
  the same Python process as the simulated data path; the paper measured the
  opposite on a JVM cluster.
- **Latency growth with N for trAcker** comes from this harness, not from
  graph depth: all 496 simulated processes share one interpreter and two
  cores with other jobs, so more stages mean more CPU contention for the
  service and agent threads; within a run every stage gets its NEOSS at the
  same time. Punctuation latency grows with N because the punctuation must
  be aligned at every stage (each process waits for all |P| inputs) and
  queues behind N |P|^2 punctuations per substream.
- **Cycles.** On the loop workload punctuations stall (the loop's own input
  never rises) while trAcker ends every substream
  (`tests/test_watermark_simulator.py::test_cyclic_graph_stalls_punctuations_but_not_tracker`).
"""


PAPER_NOTES = """The paper's figures are not reproducible as images here (our copy of 004 is
text only); what they show, from its section 5 text, next to what we see:

| paper (FlameStream, 15 VMs, RR-30, 50K elements at 100/s) | here (threads + loopback gRPC, one process per stage and partition) |
|---|---|
| Fig. 10a: punctuation traffic grows linearly with N | exact: K * N * \\|P\\|^2 punctuations |
| Fig. 10b: punctuation traffic quadratic in \\|P\\| | exact: quadratic (per substream N * \\|P\\|^2) |
| Fig. 10c: punctuation traffic grows with finer granularity | yes: one rise per substream per channel |
| trAcker 1.5-5x fewer messages, up to 30x with local agents | see Targets above; NEOSS alone are K * N * \\|P\\| messages, so the ratio cannot exceed \\|P\\| when every process holds its own agent; the paper's local agent aggregates a whole VM |
| Fig. 11: punctuation latency grows with N, \\|P\\|, granularity; trAcker flat | see the latency plot |
| Fig. 13b: throughput with punctuations falls at fine granularity | see the throughput table |
"""


if __name__ == "__main__":
    raise SystemExit(main())
