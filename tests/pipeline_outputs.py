"""Running one pipeline on two runners and comparing what it wrote."""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from hypothesis import strategies as st


def run_and_collect(runner: Any, build: Callable[[beam.Pipeline], beam.PCollection],
                    out_dir: str, options: list[str] | None = None) -> list:
    """Runs ``build`` on ``runner``; returns the output elements, sorted.

    Elements are written as JSON lines (tuples become lists), so outputs of
    different runners compare equal exactly when their elements do.
    """
    prefix = os.path.join(out_dir, "part")
    with beam.Pipeline(runner=runner, options=PipelineOptions(options or [])) as p:
        (build(p)
         | "ToJson" >> beam.Map(lambda e: json.dumps(e, sort_keys=True, default=repr))
         | "Write" >> beam.io.WriteToText(prefix))
    lines = []
    for path in glob.glob(prefix + "*"):
        with open(path, encoding="utf-8") as f:
            lines += [json.loads(line) for line in f if line.strip()]
    return sorted(lines, key=lambda x: json.dumps(x, sort_keys=True))


def planned_on_objects(build: Callable[[beam.Pipeline], Any], step: str, streaming: bool = False) -> list[bool]:
    """Of each stage SparkRunner plans for ``build`` with a step whose name
    holds ``step``: whether it runs on element objects."""
    from beam_ext.runner.planning import plan_pipeline

    p = beam.Pipeline()
    build(p)
    plan = plan_pipeline(p.to_runner_api(), 1 << 20, 2, streaming=streaming)
    return [stage.direct is not None for stage in plan.stages if any(step in s for s in stage.steps)]


def spark_equals_direct(build, tmp_path, options: list[str] | None = None) -> list:
    """Asserts SparkRunner and DirectRunner write the same elements; returns them.

    The DirectRunner side is its batch engine, Beam's FnApiRunner, named
    directly: for pipelines with processing-time timers DirectRunner would
    switch to its legacy engine, which fails on file sinks after such timers.
    """
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from beam_ext.runner import SparkRunner

    direct = run_and_collect(FnApiRunner(), build, str(tmp_path / "direct"), options)
    spark = run_and_collect(SparkRunner(), build, str(tmp_path / "spark"), options)
    assert spark == direct
    return spark


class AppendLines(beam.DoFn):
    """Appends each element as one JSON line to ``path`` (streaming-safe: no file finalisation).

    Lines shorter than the pipe buffer are written atomically with O_APPEND,
    so concurrent Spark workers do not interleave them.
    """

    def __init__(self, path: str) -> None:
        self._path = path

    def process(self, element):
        line = json.dumps(element, sort_keys=True, default=repr) + "\n"
        with open(self._path, "a", encoding="utf-8") as f:
            f.write(line)


def read_lines(path: str) -> list:
    """The JSON lines :class:`AppendLines` wrote, sorted."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return sorted(lines, key=lambda x: json.dumps(x, sort_keys=True))


def streaming_equals_direct(build, tmp_path, options: list[str] | None = None) -> list:
    """Asserts SparkRunner and the DirectRunner, both streaming, output the same; returns it.

    ``build(p)`` returns the PCollection to compare. The DirectRunner side is
    its streaming engine (BundleBasedDirectRunner), Beam's reference for
    streaming semantics.
    """
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

    from beam_ext.runner import SparkRunner

    results = []
    for name, runner in (("direct", BundleBasedDirectRunner()), ("spark", SparkRunner())):
        path = str(tmp_path / f"{name}.jsonl")
        with beam.Pipeline(runner=runner, options=PipelineOptions(["--streaming"] + (options or []))) as p:
            _ = build(p) | f"Append[{name}]" >> beam.ParDo(AppendLines(path))
        results.append(read_lines(path))
    direct, spark = results
    assert spark == direct
    return spark


def spark_jobs_run(spark, build: Callable[[beam.Pipeline], Any]) -> int:
    """How many Spark jobs a pipeline ``build`` makes runs on SparkRunner (on ``spark``'s context)."""
    from beam_ext.runner import SparkRunner

    sc = spark.sparkContext
    before = max(sc.statusTracker().getJobIdsForGroup(), default=-1)
    with beam.Pipeline(runner=SparkRunner()) as p:
        build(p)
    return max(sc.statusTracker().getJobIdsForGroup(), default=-1) - before


def keyed_test_stream(events: list[tuple[str, Any]]) -> Any:
    """A TestStream of ``(key, value)`` strings and ints from ``events``:
    ``("elements", [(key, value, timestamp), ...])`` and ``("watermark", t)``
    (a watermark that would go back is left out), then the watermark to
    infinity."""
    from apache_beam.coders import StrUtf8Coder, TupleCoder, VarIntCoder
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms import window

    stream, watermark = TestStream(coder=TupleCoder([StrUtf8Coder(), VarIntCoder()])), 0
    for kind, arg in events:
        if kind == "elements":
            stream = stream.add_elements([window.TimestampedValue((k, v), ts) for k, v, ts in arg])
        elif arg > watermark:  # a TestStream's watermark only moves forward
            watermark = arg
            stream = stream.advance_watermark_to(arg)
    return stream.advance_watermark_to_infinity()


@st.composite
def keyed_events(draw, keys: str = "abc"):
    """Events for :func:`keyed_test_stream`: up to four element events of
    (key, value, timestamp in 0-59 s), and watermark advances (0-90 s)
    anywhere between them, so some elements come late and some past the
    allowed lateness."""
    events, value = [], 0
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 6))
        stamps = draw(st.lists(st.integers(0, 59), min_size=n, max_size=n))
        chosen = draw(st.lists(st.sampled_from(keys), min_size=n, max_size=n))
        events.append(("elements", [(k, value + i, ts) for i, (k, ts) in enumerate(zip(chosen, stamps))]))
        value += n
        if draw(st.booleans()):
            events.append(("watermark", draw(st.integers(0, 90))))
    return events
