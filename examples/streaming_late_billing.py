"""A streaming billing job on Spark: files arrive, some usage arrives late.

Usage records (JSON lines: customer, cents, event time) land as files in a
watched directory. The job, an unbounded Beam pipeline on SparkRunner,
computes per customer and 10-second window:

* ``bills/``: the exact bill, re-fired on late usage (``LateWindowedGroupByKey``),
  usage more than 30 s late to ``dead_letters/``;
* ``stale_bills/``: the same bill, with the fewest late panes that keep its
  staleness under 5 % (``StalenessTrigger``, planned from past lateness);
* ``estimates/``: a mean bill per window from a sample that completes by
  the window's deadline, without waiting for stragglers
  (``ApproximateWindowAggregate``);
* ``features/``: per usage record, the customer's spend over the last minute
  (``SlidingAggregate``), answered as records arrive.

Each pane is written to its own file named by customer, window and pane
index, so a micro-batch replayed after a crash overwrites its files instead
of duplicating them.

Run it (a generator thread writes 20 s of traffic, 10 % of it late; the job
stops by itself once the directory watch ends)::

    .venv/bin/python examples/streaming_late_billing.py --out /tmp/billing

or point it at your own directory and stop it with Ctrl-C::

    .venv/bin/python examples/streaming_late_billing.py --watch 'in/*.jsonl' --out out \\
        --duration 0 --checkpoint_dir /tmp/billing-ckpt

Rerunning with the same ``--checkpoint_dir`` resumes after the last
committed micro-batch.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import tempfile
import threading
import time

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_ext import (
    ApproximateWindowAggregate,
    EveryNLateEvents,
    LateWindowedGroupByKey,
    SlidingAggregate,
    SlidingWindow,
    SparkRunner,
    StalenessRefire,
    StalenessTrigger,
    agg,
)

WINDOW = 10.0
LATENESS = 30.0
CUSTOMERS = ("acme", "globex", "initech", "umbrella")


def generate(directory: str, seconds: float, rate: float = 40.0, seed: int = 7) -> None:
    """Writes one file of usage records per second; 10 % are 5-40 s late."""
    rng = random.Random(seed)
    for second in range(int(seconds)):
        now = time.time()
        records = []
        for i in range(int(rate)):
            late = rng.random() < 0.1
            records.append({"id": f"{second}-{i}", "customer": rng.choice(CUSTOMERS),
                            "cents": rng.randint(1, 500),
                            "ts": now - (rng.uniform(5, 40) if late else rng.uniform(0, 1)),
                            "arr_ts": now})
        tmp = os.path.join(directory, f".usage-{second:05d}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        os.replace(tmp, os.path.join(directory, f"usage-{second:05d}.jsonl"))
        time.sleep(max(0.0, now + 1.0 - time.time()))


class WritePane(beam.DoFn):
    """Writes each pane to ``<out>/<name>/<key>-<window start>-<pane index>.json``."""

    def __init__(self, out: str, name: str) -> None:
        self._dir = os.path.join(out, name)

    def setup(self) -> None:
        os.makedirs(self._dir, exist_ok=True)

    def process(self, element, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        key, value = element
        start = int(w.start.micros // 1_000_000) if hasattr(w, "start") else 0
        path = os.path.join(self._dir, f"{key}-{start}-{pane.index}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"key": key, "window_start": start, "pane": pane.index,
                       "timing": ("EARLY", "ON_TIME", "LATE", "UNKNOWN")[pane.timing],
                       "value": value}, f, default=repr)
        os.replace(path + ".tmp", path)


def build(p: beam.Pipeline, pattern: str, out: str, stop: Timestamp) -> None:
    usage = (p
             | "Watch" >> fileio.MatchContinuously(pattern, interval=0.5, stop_timestamp=stop)
             | "Read" >> fileio.ReadMatches()
             | "Lines" >> beam.FlatMap(lambda f: f.read_utf8().splitlines())
             | "Parse" >> beam.Map(json.loads)
             | "EventTime" >> beam.Map(lambda r: window.TimestampedValue(r, r["ts"])))
    windowed = (usage
                | "Window" >> beam.WindowInto(window.FixedWindows(WINDOW))
                | "ByCustomer" >> beam.Map(lambda r: (r["customer"], r["cents"])))
    bills, dead = windowed | "Bill" >> LateWindowedGroupByKey(
        trigger=EveryNLateEvents(1), cleanup=LATENESS).with_dead_letters()
    _ = (bills | "Total" >> beam.MapTuple(lambda customer, cents: (customer, sum(cents)))
         | "WriteBills" >> beam.ParDo(WritePane(out, "bills")))
    _ = (dead | "DeadKey" >> beam.Map(lambda e: (str(e[0]) if isinstance(e, tuple) else "dead", repr(e)))
         | "WriteDead" >> beam.ParDo(WritePane(out, "dead_letters")))
    trigger = StalenessTrigger(max_staleness=0.05, allowed_lateness=LATENESS,
                               history=[[2.0, 5.0, 11.0, 23.0, 31.0]])
    _ = (windowed | "StaleBill" >> StalenessRefire(trigger)
         | "StaleTotal" >> beam.MapTuple(lambda customer, cents: (customer, sum(cents)))
         | "WriteStale" >> beam.ParDo(WritePane(out, "stale_bills")))
    _ = (usage
         | "Estimate" >> ApproximateWindowAggregate(window=WINDOW, value="cents", aggregate="mean",
                                                     substream=1.0, event_time="ts", arrival_time="arr_ts",
                                                     seed=1)
         | "EstimateKey" >> beam.Map(lambda r: (f"{r.key}-{r.window_start:.0f}", {
             "estimate": r.estimate, "low": r.ci_low, "high": r.ci_high,
             "waited_for_stragglers": r.waited_for_stragglers}))
         | "WriteEstimates" >> beam.ParDo(WritePane(out, "estimates")))
    _ = (usage
         | "Spend1m" >> SlidingAggregate(key="customer", timestamp="ts",
                                         windows={"1m": SlidingWindow(60.0)},
                                         aggregations={"spend": agg.sum("cents")},
                                         allowed_disorder=LATENESS)
         | "FeatureKey" >> beam.Map(lambda ef: (ef[0]["id"], ef[1]))
         | "WriteFeatures" >> beam.ParDo(WritePane(out, "features")))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watch", help="file pattern to watch (default: a generated stream)")
    parser.add_argument("--out", default="out/streaming_late_billing")
    parser.add_argument("--duration", type=float, default=20.0,
                        help="seconds of generated traffic, and of watching; 0 = until Ctrl-C")
    args, beam_args = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    pattern = args.watch
    if pattern is None:
        directory = tempfile.mkdtemp(prefix="usage-")
        pattern = os.path.join(directory, "*.jsonl")
        threading.Thread(target=generate, args=(directory, args.duration), daemon=True).start()
    # Watch a little longer than traffic lasts, so the last files are read.
    stop = Timestamp.of(time.time() + args.duration + 5) if args.duration else MAX_TIMESTAMP
    options = PipelineOptions(["--streaming", *beam_args])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    build(p, pattern, args.out, stop)
    result = p.run()
    try:
        print("pipeline", result.wait_until_finish())
    except KeyboardInterrupt:
        print("pipeline", result.cancel())
    for name in ("bills", "dead_letters", "stale_bills", "estimates", "features"):
        directory = os.path.join(args.out, name)
        count = len(os.listdir(directory)) if os.path.isdir(directory) else 0
        print(f"{name}: {count} panes in {directory}")


if __name__ == "__main__":
    main()
