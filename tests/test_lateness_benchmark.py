"""The lateness benchmark's core runs on tiny sizes (correctness only, no timing)."""
from __future__ import annotations

import importlib.util
import os
import sys

_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "lateness.py")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_lateness", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_lateness"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_run_config_spill_and_memory_process_every_event(tmp_path):
    bench = _bench()
    results = {}
    for variant in ("spill", "memory", "no-prestage"):
        config = bench.Config("average", 3, variant, events_per_step=60, keys=2,
                              budget_bytes=32 << 10)
        results[variant] = bench.run_config(config, workdir=str(tmp_path / variant))
    spill, memory = results["spill"], results["memory"]
    assert spill.events == memory.events == 40 * 60
    # Same pane logic, same seed: the same panes and dead letters either way.
    assert (spill.panes, spill.dead_letters) == (memory.panes, memory.dead_letters)
    assert spill.dead_letters > 0  # lognormal lateness beyond 3 windows exists
    assert spill.reexecutions > 0 and memory.reexecutions == 0
    assert results["no-prestage"].panes == spill.panes


def test_bigrams_window_function_counts_distinct_bigrams():
    bench = _bench()
    assert bench._window_function("bigrams", [b"a b c|\0", b"a b|\0\0"]) == 2
