"""Map-like stages next to native steps run on element objects, with Beam's results.

Oracles: DirectRunner on the same pipeline, and plain Python on the same
lines. Also checked: user metrics count under their step, errors name the
step, timestamps and windows of outputs follow Beam's rules.
"""
from __future__ import annotations

import glob
import json
import logging
import random

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.internal import pickler
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.transforms.window import GlobalWindows, TimestampedValue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_ext import SlidingAggregate, SlidingWindow, agg
from beam_ext.runner import PipelineError, SparkRunner
from beam_ext.runner._element_batches import BATCH, BOUNDED, Same, windowed
from beam_ext.runner.worker._direct import DirectChain, DirectStep, run_direct_chain

DIRECT = "runs its steps on element objects"


def _lines(path, lines) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def _read_lines(prefix: str) -> list[str]:
    return sorted(line.rstrip("\n") for f in glob.glob(prefix + "*") for line in open(f))


def _shout(word, suffix):
    return word.upper() + suffix


def _words(line):
    words = line.split()
    return words or None  # None: no output, as Beam's FlatMap treats it


def _chain(p, path, out):
    return (p | beam.io.ReadFromText(path) | beam.FlatMap(_words) | beam.Filter(lambda w: len(w) > 1)
            | beam.Map(_shout, "!") | beam.MapTuple(lambda a, *rest: a + "".join(rest)) | beam.io.WriteToText(out))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.text(alphabet="ab c", max_size=12), min_size=1, max_size=40))
def test_a_chain_between_native_steps_equals_plain_python(spark, tmp_path_factory, lines):
    tmp = tmp_path_factory.mktemp("chain")
    path = _lines(tmp / "in.txt", lines)
    with beam.Pipeline(runner=SparkRunner()) as p:
        _chain(p, path, str(tmp / "out"))
    want = sorted(w.upper() + "!" for line in lines for w in line.split() if len(w) > 1)
    assert _read_lines(str(tmp / "out")) == want


def test_the_direct_path_is_taken_and_equals_direct_runner(spark, tmp_path, caplog):
    path = _lines(tmp_path / "in.txt", [f"w{i % 7} x{i} y" for i in range(300)])
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _chain(p, path, str(tmp_path / "spark"))
    assert DIRECT in caplog.text
    with beam.Pipeline(runner="DirectRunner") as p:
        _chain(p, path, str(tmp_path / "direct"))
    assert _read_lines(str(tmp_path / "spark")) == _read_lines(str(tmp_path / "direct"))


class _Counting:
    def __init__(self):
        self.seen = Metrics.counter("direct", "seen")
        self.sizes = Metrics.distribution("direct", "size")

    def __call__(self, line):
        self.seen.inc()
        self.sizes.update(len(line))
        return line


def test_user_metrics_count_under_their_step(spark, tmp_path):
    path = _lines(tmp_path / "in.txt", ["a", "bb", "ccc"] * 10)
    p = beam.Pipeline(runner=SparkRunner())
    _ = (p | beam.io.ReadFromText(path) | "Count" >> beam.Map(_Counting())
         | "Again" >> beam.Map(_Counting()) | beam.io.WriteToText(str(tmp_path / "out")))
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    assert sorted((c.key.step, c.committed) for c in counters) == [("Again", 30), ("Count", 30)]
    [sizes] = result.metrics().query(MetricsFilter().with_name("size").with_step("Count"))["distributions"]
    assert (sizes.committed.count, sizes.committed.sum, sizes.committed.min, sizes.committed.max) == (30, 60, 1, 3)


def test_the_last_steps_of_a_pipeline_run_on_objects(spark, tmp_path, caplog):
    # No step reads their output: the line ends the pipeline. It still runs,
    # counts its metrics under its steps, and names a failing step.
    path = _lines(tmp_path / "in.txt", ["a", "bb", "ccc"] * 10)
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        p = beam.Pipeline(runner=SparkRunner())
        _ = (p | beam.io.ReadFromText(path) | "Count" >> beam.Map(_Counting())
             | "Last" >> beam.Map(_Counting()))
        result = p.run()
        result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    assert sorted((c.key.step, c.committed) for c in counters) == [("Count", 30), ("Last", 30)]
    assert f"stage Count+Last {DIRECT}" in caplog.text
    bad = _lines(tmp_path / "bad.txt", ["ok", "bad"])
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.io.ReadFromText(bad) | beam.Map(str.strip) | "Explode" >> beam.Map(_explode)
    assert info.value.step == "Explode"


def _draw(line):
    return f"{line} {random.random()}"


def test_a_stage_read_twice_gives_both_readers_the_same_elements(spark, tmp_path):
    # A PCollection is one set of elements whoever reads it. Objects handed
    # on are not persisted: were both writes to take the Map's objects, Spark
    # would run the Map once per write and each would see other draws.
    path = _lines(tmp_path / "in.txt", [f"l{i}" for i in range(25)])
    with beam.Pipeline(runner=SparkRunner()) as p:
        drawn = p | beam.io.ReadFromText(path) | "Draw" >> beam.Map(_draw)
        _ = drawn | "One" >> beam.io.WriteToText(str(tmp_path / "one"))
        _ = drawn | "Two" >> beam.io.WriteToText(str(tmp_path / "two"))
    one = _read_lines(str(tmp_path / "one"))
    assert len(one) == 25 and one == _read_lines(str(tmp_path / "two"))


def _explode(line):
    if line == "bad":
        raise ValueError(f"cannot take {line!r}")
    return line


def test_an_error_names_the_step_and_shows_the_traceback(spark, tmp_path):
    path = _lines(tmp_path / "in.txt", ["ok", "bad", "ok"])
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.io.ReadFromText(path) | "Explode" >> beam.Map(_explode) | beam.io.WriteToText(
                str(tmp_path / "out"))
    message = str(info.value)
    assert "Beam step 'Explode'" in message
    assert "ValueError: cannot take 'bad'" in message and "_explode" in message
    assert info.value.step == "Explode"


def test_a_tagged_output_fails_naming_the_step(spark, tmp_path):
    path = _lines(tmp_path / "in.txt", ["x"])
    with pytest.raises(PipelineError, match="'Tag'"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = (p | beam.io.ReadFromText(path) | "Tag" >> beam.Map(lambda x: beam.pvalue.TaggedOutput("t", x))
                 | beam.io.WriteToText(str(tmp_path / "out")))


PAYMENTS = pa.schema([("id", pa.int64()), ("card", pa.string()), ("ts", pa.float64()), ("amount", pa.float64())])
FEATURES = pa.schema([("id", pa.int64()), ("n_10s", pa.int64()), ("total_10s", pa.float64())])


def _timestamped_features(runner, path: str, out: str) -> list[str]:
    # The Map gives each event its timestamp; SlidingAggregate without a
    # timestamp field reads the element timestamp: a lost timestamp shows.
    with beam.Pipeline(runner=runner) as p:
        _ = (p | beam.io.ReadFromParquet(path)
             | beam.Map(lambda r: TimestampedValue(r, r["ts"]))
             | SlidingAggregate(key="card", windows={"10s": SlidingWindow(10)},
                                aggregations={"n": agg.count(), "total": agg.sum("amount")})
             | beam.Map(lambda ef: {"id": ef[0]["id"], **ef[1]})
             | beam.io.WriteToParquet(out, FEATURES))
    return sorted(json.dumps(r, sort_keys=True) for f in glob.glob(out + "*") for r in pq.read_table(f).to_pylist())


def test_timestamped_outputs_keep_their_timestamps(spark, tmp_path, caplog):
    rng = random.Random(2)
    rows = [{"id": i, "card": rng.choice("ab"), "ts": rng.randint(0, 100) / 2, "amount": float(i)} for i in range(200)]
    path = str(tmp_path / "p.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=PAYMENTS), path)
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        got = _timestamped_features(SparkRunner(), path, str(tmp_path / "spark" / "f"))
    assert caplog.text.count(DIRECT) == 2
    assert got == _timestamped_features("DirectRunner", path, str(tmp_path / "direct" / "f"))


class _Priced(beam.DoFn):
    """A DoFn that loads its table in ``setup``, as a model or a client is loaded:
    each ``setup`` leaves a file named after its worker process and instance."""

    def __init__(self, marks: str):
        self._marks = marks

    def setup(self):
        import os
        import uuid

        self._prices = {w: len(w) * 10 for w in ("a", "bb", "ccc")}
        open(os.path.join(self._marks, f"{os.getpid()}-{uuid.uuid4().hex}"), "w").close()

    def process(self, word):
        yield word, self._prices[word]

    def teardown(self):
        self._prices = None


def _priced(p, path, marks, out):
    _ = (p | beam.io.ReadFromText(path) | "Price" >> beam.ParDo(_Priced(marks))
         | beam.MapTuple(lambda w, price: f"{w}={price}") | beam.io.WriteToText(out))


def test_a_dofn_with_setup_runs_on_objects_set_up_once_per_worker(spark, tmp_path, caplog):
    import os

    path = _lines(tmp_path / "in.txt", ["a", "bb", "ccc"] * 400)
    marks = tmp_path / "marks"
    marks.mkdir()
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        # Twelve tasks on two cores: workers run several tasks each.
        with beam.Pipeline(runner=SparkRunner(), options=beam.options.pipeline_options.PipelineOptions(
                ["--spark_parallelism=12"])) as p:
            _priced(p, path, str(marks), str(tmp_path / "spark"))
    assert DIRECT in caplog.text
    (tmp_path / "marks_direct").mkdir()
    with beam.Pipeline(runner="DirectRunner") as p:
        _priced(p, path, str(tmp_path / "marks_direct"), str(tmp_path / "direct"))
    assert _read_lines(str(tmp_path / "spark")) == _read_lines(str(tmp_path / "direct"))
    setups = os.listdir(marks)
    workers = {name.split("-")[0] for name in setups}
    # One instance per worker, kept between its tasks (twelve setups otherwise).
    assert len(setups) == len(workers) < 12


class _FailingSetup(beam.DoFn):
    def setup(self):
        raise ConnectionError("cannot reach the price service")

    def process(self, x):
        yield x


def test_a_failing_setup_names_the_step(spark, tmp_path):
    path = _lines(tmp_path / "in.txt", ["x"])
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = (p | beam.io.ReadFromText(path) | "Connect" >> beam.ParDo(_FailingSetup())
                 | beam.io.WriteToText(str(tmp_path / "out")))
    assert info.value.step == "Connect"
    assert "cannot reach the price service" in str(info.value)


_MADE: list[int] = []


def _many(x):
    for i in range(2 * BATCH + 5):
        _MADE.append(i)
        yield x, i


def test_a_generators_large_fan_out_is_passed_on_a_batch_at_a_time():
    # In this process, no Spark: the chain reads the generator only as far as each batch it hands on.
    _MADE.clear()
    step = DirectStep("Explode", pickler.dumps((beam.FlatMap(_many).fn, (), {}, [], None)), GlobalWindows())
    batches = run_direct_chain(DirectChain((step,), None, None), None, iter([Same(BOUNDED, [1, 2])]), [],
                               batches_out=True)
    first = next(batches)
    assert len(windowed(first)) == BATCH == len(_MADE)
    values = [wv.value for batch in (first, *batches) for wv in windowed(batch)]
    assert values == [(x, i) for x in (1, 2) for i in range(2 * BATCH + 5)]
