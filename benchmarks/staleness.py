"""Aion figure 9: late re-executions needed for a staleness bound, planner vs deltat / deltaev.

Every method is planned on history windows and measured on fresh windows of
the same distribution. A schedule "meets" a bound when, on the windows it
is measured on, at least 80 % have max staleness <= bound and none exceeds
1.1x the bound (the issue's judging rule).

- planner: ``StalenessPlanner(history, T, window_arrivals=...).plan(bound)``.
- deltat: k executions evenly spaced in time, the last at T; k = the
  fewest meeting the bound on the history windows.
- deltaev: an execution after every N/k late events of the window (N = the
  mean late arrivals per history window); k chosen the same way.

Run: ``.venv/bin/python benchmarks/staleness.py`` (add ``--quick`` for a
smoke run). Writes docs/benchmarks/staleness.md and two PNGs.
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np

from beam_ext.transforms.staleness import StalenessPlanner
from beam_ext.transforms.staleness._schedule import interval_staleness

T = 100.0
BOUNDS = (0.1, 0.05, 0.01)
# lognormal(0, 1) scaled so that T is its 99.9th percentile (exp(3.0902)).
LNORM_DIVISOR = float(np.exp(3.0902))
DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def _lnorm(rng, n, divisor=LNORM_DIVISOR):
    return rng.lognormal(0.0, 1.0, n) * T / divisor


def _bursts(rng, n):
    which = rng.choice(3, size=n, p=[0.5, 0.3, 0.2])
    centre = np.array([0.15, 0.5, 0.8])[which] * T
    spread = np.array([0.03, 0.05, 0.04])[which] * T
    return rng.normal(centre, spread)


DISTRIBUTIONS = {
    "lnorm": _lnorm,
    "unif": lambda rng, n: rng.uniform(0.0, T, n),
    "norm": lambda rng, n: rng.normal(T / 2, T / 8, n),
    "bursts": _bursts,
}


def draw_window(draw, rng, n: int) -> np.ndarray:
    """n late offsets in (0, T], sorted (the distribution conditioned on the window's life)."""
    out = np.empty(0)
    while out.size < n:
        v = draw(rng, 2 * n)
        out = np.concatenate([out, v[(v > 0) & (v <= T)]])
    return np.sort(out[:n])


def deltat(k: int) -> np.ndarray:
    return T * np.arange(1, k + 1) / k


def deltaev_staleness(window: np.ndarray, k: int, expected: float) -> float:
    """Max staleness when firing after every expected/k late events of this window."""
    step = max(expected / k, 1.0)
    idx = np.floor(step * np.arange(1, k + 1)).astype(int) - 1
    x = np.unique(window[idx[idx < window.size]])
    return float(interval_staleness(x, window, T).max())


def schedule_staleness(x, windows) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return np.array([interval_staleness(x, w, T).max() for w in windows])


def meets(values: np.ndarray, bound: float) -> bool:
    return bool((values <= bound).mean() >= 0.8 and values.max() <= 1.1 * bound)


@dataclasses.dataclass
class Row:
    dist: str
    bound: float
    method: str
    executions: int | None  # None: not reached within k_max
    fresh_meet: float        # fraction of fresh windows within the bound
    fresh_worst: float       # worst fresh window / bound


def _baseline(name, history, fresh, bound, expected, k_max):
    def values(k, windows):
        if name == "deltat":
            return schedule_staleness(deltat(k), windows)
        return np.array([deltaev_staleness(w, k, expected) for w in windows])

    for k in range(1, k_max + 1):
        if meets(values(k, history), bound):
            v = values(k, fresh)
            return Row("", bound, name, k, float((v <= bound).mean()), float(v.max() / bound))
    return Row("", bound, name, None, float("nan"), float("nan"))


def figure9_right(history_windows: int, fresh_windows: int, arrivals: int, k_max: int,
                  seed: int = 0, dists=DISTRIBUTIONS, bounds=BOUNDS) -> list[Row]:
    """Executions needed per distribution and bound, for the three methods."""
    rows = []
    for d, (name, draw) in enumerate(dists.items()):
        rng = np.random.default_rng(seed + d)
        history = [draw_window(draw, rng, arrivals) for _ in range(history_windows)]
        fresh = [draw_window(draw, rng, arrivals) for _ in range(fresh_windows)]
        planner = StalenessPlanner(np.concatenate(history), T, window_arrivals=arrivals)
        expected = float(np.mean([w.size for w in history]))
        for bound in bounds:
            x = planner.plan(bound)
            v = schedule_staleness(x, fresh)
            rows.append(Row(name, bound, "planner", len(x), float((v <= bound).mean()),
                            float(v.max() / bound)))
            for method in ("deltat", "deltaev"):
                row = _baseline(method, history, fresh, bound, expected, k_max)
                row.dist = name
                rows.append(row)
    return rows


def figure9_left(history_windows: int, fresh_windows: int, arrivals: int, k_max: int = 30,
                 seed: int = 100, divisor: float = LNORM_DIVISOR) -> dict[str, np.ndarray]:
    """Mean max staleness on fresh log-normal windows for k = 1..k_max executions."""
    rng = np.random.default_rng(seed)
    draw = lambda r, n: _lnorm(r, n, divisor)  # noqa: E731
    history = [draw_window(draw, rng, arrivals) for _ in range(history_windows)]
    fresh = [draw_window(draw, rng, arrivals) for _ in range(fresh_windows)]
    planner = StalenessPlanner(np.concatenate(history), T, window_arrivals=arrivals)
    expected = float(np.mean([w.size for w in history]))
    ks = np.arange(1, k_max + 1)
    out = {"k": ks, "planner": [], "deltat": [], "deltaev": []}
    for k in ks:
        out["planner"].append(schedule_staleness(planner.plan_for_budget(int(k)), fresh).mean())
        out["deltat"].append(schedule_staleness(deltat(int(k)), fresh).mean())
        out["deltaev"].append(np.mean([deltaev_staleness(w, int(k), expected) for w in fresh]))
    return {key: np.asarray(v) for key, v in out.items()}


def planning_time(samples: int = 100_000, k: int = 30, repeats: int = 5, seed: int = 7):
    """Median seconds for plan_for_budget(k) and plan(0.01), constructor (sort) included."""
    history = _lnorm(np.random.default_rng(seed), samples)
    history = history[history <= T]
    budget, bound = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        StalenessPlanner(history, T).plan_for_budget(k)
        budget.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        StalenessPlanner(history, T, window_arrivals=5000).plan(0.01)
        bound.append(time.perf_counter() - t0)
    return float(np.median(budget)), float(np.median(bound)), len(history)


def _fmt_k(row: Row, k_max: int) -> str:
    return str(row.executions) if row.executions is not None else f">{k_max}"


def _table(rows: list[Row], k_max: int) -> list[str]:
    lines = ["| distribution | bound | planner | deltat | deltaev | planner / deltat | "
             "planner / deltaev | fresh windows within bound (planner / deltat / deltaev) |",
             "|---|---|---|---|---|---|---|---|"]
    by = {(r.dist, r.bound, r.method): r for r in rows}
    for dist in dict.fromkeys(r.dist for r in rows):
        for bound in dict.fromkeys(r.bound for r in rows):
            p, t, e = (by[(dist, bound, m)] for m in ("planner", "deltat", "deltaev"))

            def ratio(other):
                if other.executions is None:
                    return f"<{p.executions / k_max:.0%}"
                return f"{p.executions / other.executions:.0%}"

            def fresh(r):
                if r.executions is None:
                    return "-"
                return f"{r.fresh_meet:.0%} (worst {r.fresh_worst:.2f}x)"

            lines.append(f"| {dist} | {bound} | {p.executions} | {_fmt_k(t, k_max)} | "
                         f"{_fmt_k(e, k_max)} | {ratio(t)} | {ratio(e)} | "
                         f"{fresh(p)} / {fresh(t)} / {fresh(e)} |")
    return lines


def _plot_left(left, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, style in (("planner", "o-"), ("deltat", "s--"), ("deltaev", "^:")):
        ax.semilogy(left["k"], left[name], style, label=name, markersize=3)
    for b in BOUNDS:
        ax.axhline(b, color="grey", linewidth=0.5)
    ax.set_xlabel("late executions")
    ax.set_ylabel("max staleness (mean over fresh windows)")
    ax.set_title("log-normal late arrivals (Aion fig. 9 left)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_right(rows, k_max, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dists = list(dict.fromkeys(r.dist for r in rows))
    fig, axes = plt.subplots(1, len(BOUNDS), figsize=(11, 3.6), sharey=True)
    by = {(r.dist, r.bound, r.method): r for r in rows}
    for ax, bound in zip(axes, BOUNDS):
        for j, method in enumerate(("planner", "deltat", "deltaev")):
            ks = [by[(d, bound, method)].executions for d in dists]
            heights = [k if k is not None else k_max for k in ks]
            bars = ax.bar(np.arange(len(dists)) + (j - 1) * 0.27, heights, 0.27, label=method,
                          hatch=None if method == "planner" else ("//" if j == 1 else ".."))
            for bar, k in zip(bars, ks):
                if k is None:
                    ax.text(bar.get_x() + bar.get_width() / 2, k_max, f">{k_max}",
                            ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(dists)), dists)
        ax.set_title(f"bound {bound}")
    axes[0].set_ylabel("executions needed")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small smoke run; writes its report to a temporary directory")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help=f"report directory (default {DOCS})")
    args = parser.parse_args(argv)
    out = args.out or (pathlib.Path(tempfile.mkdtemp(prefix="staleness_bench_")) if args.quick
                       else DOCS)
    if args.quick:
        hw, fw, n, k_max, samples = 5, 30, 1000, 60, 20_000
    else:
        hw, fw, n, k_max, samples = 20, 200, 5000, 120, 100_000
    command = ".venv/bin/python benchmarks/staleness.py" + (" --quick" if args.quick else "")

    t0 = time.perf_counter()
    rows = figure9_right(hw, fw, n, k_max)
    left = figure9_left(hw, fw, n)
    left99 = figure9_left(hw, fw, n, seed=101, divisor=float(np.exp(2.3263)))
    sens = figure9_right(hw, fw, n, k_max, seed=50,
                         dists={"lnorm (T at p99)": lambda r, m: _lnorm(r, m, np.exp(2.3263))})
    budget_s, bound_s, used = planning_time(samples)
    elapsed = time.perf_counter() - t0

    for line in _table(rows, k_max):
        print(line)
    print(f"planning: plan_for_budget(30) {budget_s * 1e3:.1f} ms, plan(0.01) "
          f"{bound_s * 1e3:.1f} ms over {used} samples")

    out.mkdir(parents=True, exist_ok=True)
    left_png, right_png = "staleness_fig9_left.png", "staleness_fig9_right.png"
    _plot_left(left, out / left_png)
    _plot_right(rows, k_max, out / right_png)

    by = {(r.dist, r.bound, r.method): r for r in rows}
    ln05 = [by[("lnorm", 0.05, m)] for m in ("planner", "deltat", "deltaev")]
    ln01 = [by[("lnorm", 0.01, m)] for m in ("planner", "deltat", "deltaev")]
    reach = lambda r: r.executions is not None and r.executions <= 30  # noqa: E731
    left_rows = ["| executions | planner | deltat | deltaev | planner, T at p99 | "
                 "deltat, T at p99 | deltaev, T at p99 |", "|---|---|---|---|---|---|---|"]
    for i in (0, 1, 2, 4, 9, 14, 19, 29):
        if i < len(left["k"]):
            left_rows.append(
                f"| {left['k'][i]} | {left['planner'][i]:.4f} | {left['deltat'][i]:.4f} | "
                f"{left['deltaev'][i]:.4f} | {left99['planner'][i]:.4f} | "
                f"{left99['deltat'][i]:.4f} | {left99['deltaev'][i]:.4f} |")
    md = [
        "# Staleness trigger: Aion figure 9 reproduced",
        "",
        f"Reproduce: `{command}` (full run {elapsed:.0f} s here). Numbers were taken on a "
        "shared 2-core machine with other jobs running; planning times are noisy, counts "
        "of executions are not (seeded).",
        "",
        f"Python {platform.python_version()}, numpy {np.__version__}. Late offsets in "
        f"(0, T], T = {T:g} s. History: {hw} windows x {n} late arrivals "
        f"({hw * n} samples); measured on {fw} fresh windows of {n} arrivals.",
        "",
        "Distributions: `lnorm` log-normal(0, 1) scaled so that T is its 99.9th percentile; "
        "`unif` uniform on (0, T); `norm` normal(T/2, T/8); `bursts` a mixture of normals "
        "at 0.15T, 0.5T, 0.8T (sd 0.03T, 0.05T, 0.04T; weights 0.5, 0.3, 0.2); all "
        "conditioned on (0, T].",
        "",
        "A method *meets* a bound when >= 80 % of the windows it is measured on have max "
        "staleness <= bound and none exceeds 1.1x. deltat and deltaev get the fewest "
        "executions meeting the bound on the history windows; the planner's count is "
        "`len(plan(bound))` from the pooled history. All three are then measured on the "
        f"fresh windows (last column). `>{k_max}`: not reached within {k_max}.",
        "",
        "## Executions needed (figure 9, right)",
        "",
        *_table(rows, k_max),
        "",
        f"![executions needed]({right_png})",
        "",
        f"Figure reproduced by `{command}`.",
        "",
        "## Max staleness vs executions, log-normal (figure 9, left)",
        "",
        "Mean over fresh windows of the max staleness; planner = `plan_for_budget(k)` on "
        "the history. The right-hand columns repeat it with T at the 99th percentile "
        "instead of the 99.9th (a less skewed window).",
        "",
        *left_rows,
        "",
        f"![max staleness vs executions]({left_png})",
        "",
        f"Figure reproduced by `{command}`.",
        "",
        "## Against Aion's published figures",
        "",
        "| claim | Aion (paper) | beam_ext (this run) |",
        "|---|---|---|",
        f"| lnorm, bound 0.05: executions vs deltat | 31 % | "
        f"{ln05[0].executions}/{_fmt_k(ln05[1], k_max)} = "
        f"{ln05[0].executions / (ln05[1].executions or k_max):.0%} |",
        f"| lnorm, bound 0.05: executions vs deltaev | 27 % | "
        f"{ln05[0].executions}/{_fmt_k(ln05[2], k_max)} = "
        f"{ln05[0].executions / (ln05[2].executions or k_max):.0%} |",
        f"| lnorm, bound 0.01 within 30 executions | AION yes; deltat, deltaev no | "
        f"planner {'yes' if reach(ln01[0]) else 'no'} ({ln01[0].executions}); deltat "
        f"{'yes' if reach(ln01[1]) else 'no'} ({_fmt_k(ln01[1], k_max)}); deltaev "
        f"{'yes' if reach(ln01[2]) else 'no'} ({_fmt_k(ln01[2], k_max)}) |",
        "| unif: deltat as good as the planner | yes | see the table |",
        f"| planning time, 30 executions over 100,000 samples | < 1 s | "
        f"{budget_s * 1e3:.0f} ms (`plan_for_budget(30)`, {used} samples, sort included); "
        f"`plan(0.01)` {bound_s * 1e3:.0f} ms |",
        "",
        "Aion's plot values are not in the text we have (only the percentages and the "
        "'fails to reach 0.01' statements above), so the bars cannot be compared number "
        "by number. Aion does not say how its log-normal was scaled to T; the ratios depend "
        "on it (the less skewed p99 scaling is in the next table).",
        "",
        "## Sensitivity: log-normal with T at its 99th percentile",
        "",
        *_table(sens, k_max),
        "",
        "## Where we lose",
        "",
        "- `unif`: a uniform arrival rate is what deltat assumes, so the planner can only "
        "match it (within an execution: deltat spends its last one at T, the planner's "
        "margin can cost one).",
        "- The 25 % target at bound 0.05 depends on how skewed the window is: with T at the "
        "log-normal's 99th percentile (sensitivity table) the planner needs "
        f"{sens[3].executions} executions against deltat's {_fmt_k(sens[4], k_max)} and "
        f"deltaev's {_fmt_k(sens[5], k_max)} "
        f"({sens[3].executions / (sens[4].executions or k_max):.0%} / "
        f"{sens[3].executions / (sens[5].executions or k_max):.0%}; Aion: 31 % / 27 %).",
        "- The planner's margin is sized for the stated arrivals per window; with much "
        "smaller fresh windows than declared it can miss the 80 % rule (see "
        "docs/staleness.md).",
    ]
    (out / "staleness.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print(f"wrote {out / 'staleness.md'} in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
