"""Pickling batches of elements: PySpark's cloudpickle against the standard pickler.

In-process and secondary (no pipeline runs): what one batch of 512
``WindowedValue`` elements costs to pickle and unpickle, in an interval
window and in the global window, with the cloudpickle PySpark 4 pickles an
RDD's records with and with Python's own ``pickle``. The headline figures
of the steps that use it (``Reshuffle``, file writes with more shards than
tasks, SlidingAggregate on elements) are the ``runner_common.py`` cases.

    python benchmarks/object_pickling.py
"""
from __future__ import annotations

import pickle
import timeit

from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from pyspark import cloudpickle

BATCH = 512


def _best(fn) -> float:
    return min(timeit.repeat(fn, number=1, repeat=20))


def main() -> None:
    batches = {
        "interval window": [WindowedValue((i % 100, i), Timestamp(micros=i * 1000),
                                          (IntervalWindow(i // 60 * 60, i // 60 * 60 + 60),)) for i in range(BATCH)],
        "global window": [WindowedValue((i % 100, i), Timestamp(micros=i * 1000), (GlobalWindow(),))
                          for i in range(BATCH)],
    }
    picklers = {"cloudpickle (PySpark's)": cloudpickle.dumps, "pickle": pickle.dumps}
    print("| elements | pickler | pickle, ns an element | unpickle, ns an element | bytes an element |")
    print("|---|---|---:|---:|---:|")
    for name, batch in batches.items():
        for label, dumps in picklers.items():
            data = dumps(batch, pickle.HIGHEST_PROTOCOL)
            dump_s = _best(lambda: dumps(batch, pickle.HIGHEST_PROTOCOL))
            load_s = _best(lambda: pickle.loads(data))
            print(f"| {name} | {label} | {dump_s / BATCH * 1e9:,.0f} | {load_s / BATCH * 1e9:,.0f} | "
                  f"{len(data) / BATCH:.0f} |")


if __name__ == "__main__":
    main()
