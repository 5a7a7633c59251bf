"""The sampling benchmark's core runs on tiny sizes (not its timing)."""
from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np


def _bench():
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sampling.py")
    spec = importlib.util.spec_from_file_location("bench_sampling", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_sampling"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_run_config_measures_every_algorithm():
    bench = _bench()
    runs = bench.run_config("nyt", "EG", rate=1000.0, duration=21.0, seed=0, cost_us=10.0)
    assert set(runs) == set(bench.ALGORITHMS)
    for run in runs.values():
        assert len(run.latency) == 4  # windows 9-21 s
        assert np.all(run.latency >= run.wait) and np.all(run.wait >= 0)
    assert runs["Default"].rate == 1.0 and runs["Default"].error.max() < 1e-9
    assert runs["Aion (ours)"].rate < runs["Default"].rate
    # the K-slack baselines wait the same watermark
    assert np.allclose(runs["Default"].wait, runs["Aion-minus"].wait)
    assert runs["Aion (ours)"].wait.mean() < runs["Default"].wait.mean()


def test_run_config_ysb_keys():
    runs = _bench().run_config("ysb", "GG", rate=2000.0, duration=15.0, seed=1, cost_us=2.0)
    assert len(runs["Aion (ours)"].error) == 10 * 2  # 10 campaigns x windows 9-15 s


def test_plots_and_report_are_written(tmp_path):
    import argparse

    bench = _bench()
    results = {(w, "EG", rate): bench.run_config(w, "EG", 1000.0, 12.0, 0, 1.0)
               for w in bench.WORKLOADS for rate in bench.RATES}
    files = bench._plots(results, str(tmp_path))
    args = argparse.Namespace(duration=12.0, seeds=1, coverage_seeds=1, cost_ysb_us=1.0,
                              cost_nyt_us=1.0)
    bench._write_doc(["| table |"], files, args, 1.0, results, ["| cov |"], str(tmp_path))
    assert all((tmp_path / f).stat().st_size > 0 for f in files)
    assert "python benchmarks/sampling.py" in (tmp_path / "sampling.md").read_text()
