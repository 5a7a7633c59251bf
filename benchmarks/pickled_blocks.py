"""Values Beam pickles, per value: pickled one by one (Beam's coder) or a key's many as one list (a block).

Times, for small numpy arrays and dataclass instances (the values of
``runner_common.py``'s ``numpy_values`` and ``dataclass_values``), in one
process: ``pickle.dumps`` and ``pickle.loads`` of each value, as Beam's
``FastPrimitivesCoder`` calls them for a type it has no encoding for, against
``PickledValues.encode`` and ``decode_all`` of the same values as one block
(:mod:`beam_ext.runner._pickled_values`), and the bytes per value. The two
paths run alternately; prints the minimum of 7 runs in nanoseconds per value:

    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/pickled_blocks.py
    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/pickled_blocks.py --values 20

This is a secondary, in-process figure: the pipelines users run are timed
by ``runner_common.py`` (cases ``numpy_values`` and ``dataclass_values``).
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import time

import numpy as np
from apache_beam.coders import coders

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _user_classes import Purchase  # noqa: E402

from beam_ext.runner._pickled_values import PickledValues  # noqa: E402

_KINDS = {
    "numpy array of 4 int64": lambda i: np.arange(4) + i,
    "dataclass of an int, a float, a str": lambda i: Purchase(i % 1000, float(i), "book"),
}


def _best(fn, repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=1000, help="values in one key's block")
    parser.add_argument("--keys", type=int, default=20, help="blocks timed per run")
    args = parser.parse_args()
    blocks = PickledValues.of(coders.LengthPrefixCoder(coders.FastPrimitivesCoder()))
    protocol = pickle.HIGHEST_PROTOCOL
    n = args.values * args.keys
    print(f"{'values':40s} {'dumps each':>11s} {'block':>8s} {'loads each':>11s} {'block':>8s} "
          f"{'bytes each':>11s} {'block':>8s}   ns and bytes per value, {args.values} values a block")
    for name, make in _KINDS.items():
        keys = [[make(k * args.values + i) for i in range(args.values)] for k in range(args.keys)]
        each = [[pickle.dumps(v, protocol) for v in values] for values in keys]
        whole = [blocks.encode(values) for values in keys]
        dumps_each = _best(lambda: [[pickle.dumps(v, protocol) for v in values] for values in keys])
        dumps_block = _best(lambda: [blocks.encode(values) for values in keys])
        loads_each = _best(lambda: [[pickle.loads(b) for b in data] for data in each])
        loads_block = _best(lambda: [blocks.decode_all([data]) for data in whole])
        size_each = sum(len(b) for data in each for b in data) / n
        size_block = sum(map(len, whole)) / n
        print(f"{name:40s} {dumps_each / n * 1e9:11.0f} {dumps_block / n * 1e9:8.0f} {loads_each / n * 1e9:11.0f} "
              f"{loads_block / n * 1e9:8.0f} {size_each:11.0f} {size_block:8.0f}")


if __name__ == "__main__":
    main()
