"""The streaming benchmark's generator, Beam pipeline (DirectRunner) and report, on tiny sizes.

No timing is asserted: only that every engine row is produced and counts are right.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import numpy as np
import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "streaming.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_streaming", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_streaming"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_generator_agrees_across_any_split(bench):
    cfg = bench.Config("direct", rate=1000.0, duration=10.0)
    whole = bench.generate(cfg, 100.0, 0, cfg.total)
    cuts = [0, 1, 4095, 4096, 4097, 5000, 9000, cfg.total]
    parts = [bench.generate(cfg, 100.0, lo, hi) for lo, hi in zip(cuts, cuts[1:])]
    for i in range(3):
        assert np.array_equal(whole[i], np.concatenate([p[i] for p in parts]))
    key, arrival, event_time = whole
    late = arrival - event_time
    assert set(np.unique(key)) == set(range(cfg.keys))
    assert 0.03 < np.mean(late > 0) < 0.07
    assert late[late > 0].min() >= cfg.late_min and late.max() <= cfg.late_max
    assert sum(bench.expected_counts(cfg, 100.0).values()) == cfg.total


def test_direct_runner_rows_count_every_event(bench, tmp_path):
    cfg = bench.Config("direct", rate=500.0, duration=3.0, out=str(tmp_path / "direct.csv"), warmup=0.0)
    r = bench.run_engine(cfg, warm_up=False)
    assert r.not_run is None and r.finished
    assert r.rows > 0 and r.late_rows > 0
    assert r.events == r.expected_events == 1500
    assert r.mismatched_windows == 0
    assert np.isfinite(r.p999_ms) and r.p50_ms <= r.p999_ms

    refused = bench.Result(bench.Config("sparkrunner"), not_run="NotImplementedError: no streaming")
    args = argparse.Namespace(quick=True, rate=500.0, duration=3.0, watermarks=None)
    bench._write_report([r, refused], bench._command(args), str(tmp_path))
    report = (tmp_path / "streaming.md").read_text()
    assert "python benchmarks/streaming.py --quick" in report
    assert "not run: `NotImplementedError: no streaming`" in report
    assert (tmp_path / "streaming_latency.png").stat().st_size > 0
