"""SlidingAggregate on SparkRunner, run by test_sliding_spark.py in a process of its own.

That process starts its own SparkContext with ``spark.python.use.daemon=false``:
every Python worker is a fresh interpreter, as on a cluster, so Python's
``hash()`` of ``None`` or NaN differs between the workers. Fresh workers are
slow to start, so the pipeline has few stages: each bundle writes its
``[event id, count]`` rows as json lines to a file of its own under the
directory given as the first argument.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_ext import SlidingAggregate, SlidingWindow, agg

N_EVENTS = 4000
WINDOW = 30.0
KEYS = ("a", 7, None, math.nan)


def events() -> list[dict]:
    """A quarter of the events for each key, None and NaN included."""
    rng = random.Random(11)
    return [{"id": i, "card": KEYS[i % 4], "ts": rng.randint(0, 2000) / 20}
            for i in range(N_EVENTS)]


class _WriteJson(beam.DoFn):
    """Json lines, one file per bundle (fewer stages than WriteToText)."""

    def __init__(self, directory: str) -> None:
        self._directory = directory

    def start_bundle(self) -> None:
        self._rows = []

    def process(self, row) -> None:
        self._rows.append(json.dumps(row))

    def finish_bundle(self) -> None:
        with open(os.path.join(self._directory, f"{uuid.uuid4().hex}.json"), "w") as f:
            f.writelines(line + "\n" for line in self._rows)


def main(argv: list[str]) -> None:
    out, pipeline_args = argv[0], argv[1:]
    with beam.Pipeline(options=PipelineOptions(pipeline_args)) as p:
        _ = (p | beam.Create(events())
             | SlidingAggregate(key="card", timestamp="ts", windows={"w": SlidingWindow(WINDOW)},
                                aggregations={"n": agg.count()})
             | beam.MapTuple(lambda e, f: [e["id"], f["n_w"]])
             | beam.ParDo(_WriteJson(out)))


if __name__ == "__main__":
    main(sys.argv[1:])
