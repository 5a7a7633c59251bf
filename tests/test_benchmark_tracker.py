"""The tracker benchmark's core runs on tiny sizes (no timing asserted)."""
import importlib.util
import os
import sys

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tracker.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_tracker", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_tracker"] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


def test_run_config_counts_messages_for_each_mechanism(bench):
    rows = bench.run_config(2, 2, 4, ("punctuation", "tracker_local"), 16, None, 1, "N")
    by = {r.mechanism: r for r in rows}
    assert by["punctuation"].messages == 4 * 2 * 2 ** 2  # K * N * |P|^2
    assert by["tracker_local"].messages > 0
    assert all(r.completed and r.violations == 0 for r in rows)
