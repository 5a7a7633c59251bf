"""Building a pipeline around a large ``beam.Create``: SparkRunner's apply against Beam's.

Times, in one process, for Creates of several sizes of ``(int, int)`` pairs
(``--values pairs``: the side-input table of ``runner_throughput.py``'s
side-input join has 10,000) or of records as dicts (``--values dicts``: the
demo's payments, 5,000 of them):

- ``Create(values)``: Beam infers the output type from every value to choose
  the coder. The same on every runner; shown for scale.
- applying it to a pipeline: on Beam's own expansion (``Pipeline()``, the
  DirectRunner's), which infers the type from every value again, and on
  SparkRunner, which infers it once per shape of value
  (``beam_ext/runner/planning/_create_type.py``). Both give the same type.

Both appliers run alternately in each round, so the ratio holds however the
machine's speed drifts. Prints the minimum and median of the rounds:

    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/create_apply.py [--rounds 15] [--values dicts]

This is a secondary, driver-only figure: the pipelines users run are timed
by ``runner_throughput.py`` and ``runner_ab.py`` (case ``side_join``).
"""
from __future__ import annotations

import argparse
import statistics
import time

import apache_beam as beam

from beam_ext.runner import SparkRunner

SIZES = (1_000, 10_000, 100_000)
VALUES = {
    "pairs": lambda i: (i, i * 2),
    "dicts": lambda i: {"id": i, "card": f"card-{i % 83:04d}", "merchant": f"shop-{i % 12:03d}",
                        "ts": i * 17.5, "amount": round(i * 0.37 % 200, 2)},
}


def _apply_seconds(runner, values: list) -> tuple[float, float, object]:
    start = time.perf_counter()
    create = beam.Create(values)
    built = time.perf_counter()
    out = beam.Pipeline(runner=runner) | create
    return built - start, time.perf_counter() - built, out.element_type


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--values", choices=sorted(VALUES), default="pairs")
    args = parser.parse_args(argv)
    print("| values | Create(values) ms | apply, Beam's ms | apply, SparkRunner ms | Beam / SparkRunner |")
    print("|---:|---:|---:|---:|---:|")
    for size in SIZES:
        values = [VALUES[args.values](i) for i in range(size)]
        built, beams, ours = [], [], []
        for _ in range(args.rounds):
            b, t, beam_type = _apply_seconds(None, values)
            built.append(b)
            beams.append(t)
            _, t, our_type = _apply_seconds(SparkRunner(), values)
            ours.append(t)
            assert our_type == beam_type, (our_type, beam_type)

        def ms(xs: list[float]) -> str:
            return f"{min(xs) * 1e3:,.1f} (median {statistics.median(xs) * 1e3:,.1f})"
        print(f"| {size:,} | {ms(built)} | {ms(beams)} | {ms(ours)} | "
              f"{statistics.median(beams) / statistics.median(ours):.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
