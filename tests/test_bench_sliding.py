"""The sliding benchmark's core functions on tiny sizes (not the timings)."""
from __future__ import annotations

import importlib.util
import os

import numpy as np

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "sliding.py")
_spec = importlib.util.spec_from_file_location("bench_sliding", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_benchmark_core_functions_on_tiny_data(tmp_path):
    data = bench.make_data(2_000, 3)
    exact = bench.exact_counts(data, 3600.0)
    # Brute force for a few events: count of the key's events in (t - 1h, t].
    for i in (0, 17, 1999):
        k, t = data["key"][i], data["ts"][i]
        n = int(np.sum((data["key"] == k) & (data["ts"] > t - 3600.0) & (data["ts"] <= t)))
        assert exact["n_w"][i] == n
    coarse = bench.hopping_error_rate(data, 3600.0, 3600.0, exact)
    fine = bench.hopping_error_rate(data, 3600.0, 1.0, exact)
    assert 0.0 <= fine < coarse <= 1.0  # a finer hop is wrong less often, but not never
    assert bench.engine_throughput(data, 3600.0, 300) > 0
    peak, eps = bench.engine_peak_memory(3_000, 7 * 86400.0, str(tmp_path / "r"))
    assert peak > 0 and eps > 0
    assert os.path.getsize(tmp_path / "r" / "chunks.bin") > 0  # events went to disk
