"""The partial combine before a lifted CombinePerKey's shuffle, alone, per element.

Times beam_ext's object-stage partial combine (``_precombine`` in
``beam_ext/runner/worker/_direct.py``) over 200,000 ``(key, value)`` pairs
drawn from 5,000 keys, in one process, for Beam's ``MeanCombineFn``,
``CountCombineFn`` and ``CombineFn.from_callable(sum)``; prints the minimum
of 7 runs in nanoseconds per element. Batches are built before timing. The
``beam_ext`` imported is the one on ``PYTHONPATH``, so two checkouts compare
side by side:

    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/partial_combine.py

This is a secondary, in-process figure: the pipelines users run are timed by
``runner_throughput.py`` and ``runner_ab.py``.
"""
from __future__ import annotations

import random
import time

from apache_beam.internal import pickler
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.transforms import combiners, core, window

import beam_ext
from beam_ext.runner import _element_batches as element_batches
from beam_ext.runner.worker import _direct

PAIRS, KEYS, RUNS = 200_000, 5_000, 7


def main() -> None:
    rng = random.Random(1)
    keys = [f"w{i}" for i in range(KEYS)]
    values = [window.GlobalWindows.windowed_value((rng.choice(keys), rng.random())) for _ in range(PAIRS)]
    print(f"beam_ext from {beam_ext.__file__}")
    for name, fn in (("mean", combiners.MeanCombineFn()), ("count", combiners.CountCombineFn()),
                     ("sum", core.CombineFn.maybe_from_callable(sum))):
        combine = _direct.DirectCombine("t", pickler.dumps((fn, [], {})), core.Windowing(window.GlobalWindows()))
        best = float("inf")
        for _ in range(RUNS):
            batches = element_batches.batched(iter(values))
            if hasattr(_direct, "_same"):  # checkouts since shared-windowing batches
                batches = map(element_batches.as_batch, batches)
            batches = list(batches)
            start = time.perf_counter()
            for _ in _direct._precombine(combine, _direct._Tracker(), _direct._State(MetricsContainer("t")),
                                         iter(batches)):
                pass
            best = min(best, time.perf_counter() - start)
        print(f"{name}: {best / PAIRS * 1e9:.0f} ns per element")


if __name__ == "__main__":
    main()
