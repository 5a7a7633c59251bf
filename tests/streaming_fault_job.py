"""A streaming pipeline whose output files a replay overwrites, run by test_streaming_faults.py.

Run as a process of its own, so a test can ``kill -9`` its driver (with the
JVM it started) and start it again on the same ``--checkpoint_dir``::

    python streaming_fault_job.py OUT_DIR [--kill_marker=PATH] --runner=... --checkpoint_dir=...

The pipeline: a seeded TestStream of keyed values (on-time, late within the
allowed lateness, and too late) and watermark and processing-time advances;
fixed windows with early (processing time), on-time and late panes;
``CombinePerKey`` (into lists); and a stateful DoFn that buffers
per key and flushes at an event-time timer. Every output goes to its own
file named by what it is -- (kind, key, window, pane index or flush number)
-- so a micro-batch run again after a crash rewrites the same files, and a
pane lost, duplicated under another index, or computed from lost state
shows as a missing, extra or different file.
"""
from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.timeutil import TimeDomain

KEYS = ("a", "b", "c")
WINDOW = 10
ALLOWED_LATENESS = 20


def test_stream(seed: int = 7, rounds: int = 7) -> TestStream:
    """Elements, then a watermark or processing-time advance, ``rounds`` times; then +inf.

    Each round adds on-time elements near the watermark, sometimes one late
    (behind the watermark, within the allowed lateness) and one too late.
    """
    rng = random.Random(seed)
    stream = TestStream()
    watermark = 0
    for n in range(rounds):
        values = [window.TimestampedValue((rng.choice(KEYS), rng.randint(1, 9)),
                                          watermark + rng.randint(0, 14)) for _ in range(rng.randint(1, 3))]
        closed = watermark // WINDOW * WINDOW  # the end of the last window the watermark passed
        if closed and rng.random() < 0.7:
            values.append(window.TimestampedValue((rng.choice(KEYS), 100 + n), closed - rng.randint(1, WINDOW)))
        if watermark > ALLOWED_LATENESS + WINDOW and n % 3 == 0:
            values.append(window.TimestampedValue(("a", 1000 + n), watermark - ALLOWED_LATENESS - WINDOW - 1))
        stream = stream.add_elements(values)
        if n % 3 == 1:
            stream = stream.advance_processing_time(6)  # fires the early panes
        else:
            watermark += rng.choice((5, 8, 12))
            stream = stream.advance_watermark_to(watermark)
    return stream.advance_watermark_to_infinity()


class BufferUntilWindowEnd(beam.DoFn):
    """Buffers values per key; flushes them, numbered, at the end of the window."""

    BUFFER = userstate.BagStateSpec("buffer", VarIntCoder())
    FLUSHES = userstate.ReadModifyWriteStateSpec("flushes", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, kv, w=beam.DoFn.WindowParam, buffer=beam.DoFn.StateParam(BUFFER),
                flush=beam.DoFn.TimerParam(FLUSH)):
        buffer.add(kv[1])
        flush.set(w.end)

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, w=beam.DoFn.WindowParam, buffer=beam.DoFn.StateParam(BUFFER),
                 flushes=beam.DoFn.StateParam(FLUSHES)):
        n = flushes.read() or 0
        flushes.write(n + 1)
        values = sorted(buffer.read())
        buffer.clear()
        if values:
            yield key, (n, values)


class FailOnce(beam.DoFn):
    """At the first flush holding ``value``, once (``marker`` remembers): a fault.

    The fault is the death of this Spark Python worker (``kill -9``), or,
    given ``fill``, a file at that path written until its filesystem is full.
    """

    def __init__(self, marker: str, value: int, fill: str | None = None) -> None:
        self._marker = marker
        self._value = value
        self._fill = fill

    def process(self, element):
        if self._value in element[1][1] and not os.path.exists(self._marker):
            with open(self._marker, "w") as f:
                f.write(str(os.getpid()))
            if self._fill is None:
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                with open(self._fill, "wb") as f:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
            except OSError:
                pass  # full
        yield element


class PaneFiles(beam.DoFn):
    """Writes each element to ``directory/<kind>-<key>-<window>-<index>.json``, atomically.

    The index is the pane's (or the element's own, for ``kind="flush"``):
    running a micro-batch again rewrites the same file with the same content.
    """

    def __init__(self, directory: str, kind: str) -> None:
        self._directory = directory
        self._kind = kind

    def process(self, kv, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        key, value = kv
        if self._kind == "flush":
            index, value = value
            record = [key, value]
        else:
            index = pane.index
            record = [key, sorted(value) if isinstance(value, list) else value,
                      pane.timing, pane.is_first, pane.is_last]
        name = f"{self._kind}-{key}-{float(w.start):g}-{float(w.end):g}-{index}.json"
        path = os.path.join(self._directory, name)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, path)


def build(p: beam.Pipeline, out_dir: str, fault_marker: str | None = None, fill: str | None = None) -> None:
    """The pipeline, writing its panes and flushes under ``out_dir``.

    ``fault_marker``: kill a Python worker (or fill the filesystem of
    ``fill``) at the flush holding 7, once, mid-stream.
    """
    windowed = p | test_stream() | beam.WindowInto(
        window.FixedWindows(WINDOW),
        trigger=trigger.AfterWatermark(early=trigger.AfterProcessingTime(5), late=trigger.AfterCount(1)),
        allowed_lateness=ALLOWED_LATENESS, accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
    # Combined (lifted: pre-combined before the shuffle, merged after), into
    # the list of values so a pane shows what it holds, not just a sum.
    _ = (windowed | beam.CombinePerKey(beam.combiners.ToListCombineFn())
         | "PaneFiles" >> beam.ParDo(PaneFiles(out_dir, "pane")))
    flushed = windowed | beam.ParDo(BufferUntilWindowEnd())
    if fault_marker is not None:
        flushed = flushed | beam.ParDo(FailOnce(fault_marker, 7, fill))
    _ = flushed | "FlushFiles" >> beam.ParDo(PaneFiles(out_dir, "flush"))


def read_outputs(out_dir: str) -> dict[str, object]:
    """The files :class:`PaneFiles` wrote: name -> content."""
    found = {}
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".json"):
            with open(os.path.join(out_dir, name), encoding="utf-8") as f:
                found[name] = json.load(f)
    return found


def main(argv: list[str]) -> None:
    out_dir, args = argv[0], argv[1:]
    kill = [a for a in args if a.startswith("--kill_marker=")]
    args = [a for a in args if a not in kill]
    marker = kill[0].split("=", 1)[1] if kill else None
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("beam_ext.runner").setLevel(logging.INFO)  # "resuming after committed batch N"
    with beam.Pipeline(options=PipelineOptions(["--streaming"] + args)) as p:
        build(p, out_dir, marker)


if __name__ == "__main__":
    # DoFns pickled from this module by name: workers import it from PYTHONPATH.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import streaming_fault_job

    streaming_fault_job.main(sys.argv[1:])
