"""SparkRunner on the Beam model, feature by feature; DirectRunner is the oracle."""
from __future__ import annotations

import os
import shutil

import apache_beam as beam
import pytest
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    CombiningValueStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import Timestamp
from pipeline_outputs import run_and_collect, spark_equals_direct, spark_jobs_run

pytestmark = pytest.mark.usefixtures("spark")

TEXT = ["the quick brown fox", "jumps over the lazy dog", "the dog", ""]

# Results must not depend on how a task cuts its input into bundles (Beam's
# own tests rerun with bundle sizes 1, 2, 3): the default (one bundle per
# task here), one element per bundle, and a few small elements per bundle.
BUNDLE_SIZES = pytest.mark.parametrize("bundle", [
    pytest.param([], id="default"),
    pytest.param(["--spark_bundle_size=1"], id="1B"),
    pytest.param(["--spark_bundle_size=48"], id="48B"),
])


def _timestamped(p, pairs, label="Create"):
    return (p | label >> beam.Create(pairs)
              | f"{label}Stamp" >> beam.MapTuple(lambda v, ts: window.TimestampedValue(v, ts)))


@BUNDLE_SIZES
def test_wordcount(tmp_path, bundle):
    out = spark_equals_direct(
        lambda p: (p | beam.Create(TEXT) | beam.FlatMap(str.split)
                   | beam.combiners.Count.PerElement()), tmp_path, bundle)
    assert ["the", 3] in out and ["dog", 2] in out and len(out) == 8


@BUNDLE_SIZES
def test_group_by_key_fixed_windows_with_timestamps(tmp_path, bundle):
    def build(p):
        return (_timestamped(p, [(("k", 1), 1), (("k", 2), 9), (("k", 3), 11), (("j", 4), 12)])
                | beam.WindowInto(window.FixedWindows(10))
                | beam.GroupByKey()
                | beam.MapTuple(lambda k, vs: (k, sorted(vs)))
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam:
                           (kv, float(w.start), float(t))))
    out = spark_equals_direct(build, tmp_path, bundle)
    assert [["k", [1, 2]], 0.0, 9.999] in out
    assert [["k", [3]], 10.0, 19.999] in out


@pytest.mark.parametrize("combiner", ["EARLIEST", "LATEST", "EOW"])
def test_timestamp_combiners(tmp_path, combiner):
    def build(p):
        return (_timestamped(p, [(("k", 1), 3), (("k", 2), 7)])
                | beam.WindowInto(window.FixedWindows(10),
                                  timestamp_combiner=getattr(window.TimestampCombiner,
                                                             f"OUTPUT_AT_{combiner}"))
                | beam.GroupByKey()
                | beam.Map(lambda kv, t=beam.DoFn.TimestampParam: float(t)))
    out = spark_equals_direct(build, tmp_path)
    assert out == [{"EARLIEST": 3.0, "LATEST": 7.0, "EOW": 9.999}[combiner]]


def test_sliding_windows(tmp_path):
    def build(p):
        return (_timestamped(p, [(("k", i), i) for i in range(12)])
                | beam.WindowInto(window.SlidingWindows(6, 3))
                | beam.CombinePerKey(sum)
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam: (float(w.start), kv[1])))
    out = spark_equals_direct(build, tmp_path)
    assert [0.0, sum(range(6))] in out and [-3.0, sum(range(3))] in out


def test_session_windows_merge(tmp_path):
    def build(p):
        return (_timestamped(p, [(("a", 1), 1), (("a", 2), 3), (("a", 3), 20), (("b", 4), 2)])
                | beam.WindowInto(window.Sessions(5))
                | beam.GroupByKey()
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam:
                           (kv[0], sorted(kv[1]), float(w.start), float(w.end))))
    out = spark_equals_direct(build, tmp_path)
    assert ["a", [1, 2], 1.0, 8.0] in out and ["a", [3], 20.0, 25.0] in out


class _EvenOddWindows(window.NonMergingWindowFn):
    """A user WindowFn: windows of 2 s starting at even seconds."""

    def assign(self, context):
        start = int(context.timestamp) // 2 * 2
        return [window.IntervalWindow(start, start + 2)]

    def get_window_coder(self):
        return beam.coders.coders.IntervalWindowCoder()


def test_custom_window_fn(tmp_path):
    def build(p):
        return (_timestamped(p, [(("k", i), i) for i in range(5)])
                | beam.WindowInto(_EvenOddWindows())
                | beam.CombinePerKey(sum)
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam: (float(w.start), kv[1])))
    assert spark_equals_direct(build, tmp_path) == [[0.0, 1], [2.0, 5], [4.0, 4]]


class _WindowPerElement(window.NonMergingWindowFn):
    """A user WindowFn reading the element and the window it was in: a window
    as long as the element's value, from the start of the window it was in."""

    def assign(self, context):
        start = context.window.start if isinstance(context.window, window.IntervalWindow) else context.timestamp
        return [window.IntervalWindow(start, start + context.element[1])]

    def get_window_coder(self):
        return beam.coders.coders.IntervalWindowCoder()


def test_a_custom_window_fn_reads_the_element_and_each_window_it_was_in(tmp_path):
    """Elements in two sliding windows each, re-windowed by a user's function
    of the element and the window: asked once per window, as Beam asks it."""
    def build(p):
        return (_timestamped(p, [(("k", i % 3 + 1), i) for i in range(7)])
                | "Slide" >> beam.WindowInto(window.SlidingWindows(4, 2))
                | "Mine" >> beam.WindowInto(_WindowPerElement())
                | beam.GroupByKey()
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam: (float(w.start), float(w.end), sorted(kv[1]))))
    out = spark_equals_direct(build, tmp_path)
    assert [2.0, 5.0, [3, 3]] in out and sum(len(values) for _, _, values in out) == 14


class _MeanFn(beam.CombineFn):
    def create_accumulator(self):
        return 0.0, 0

    def add_input(self, acc, x):
        return acc[0] + x, acc[1] + 1

    def merge_accumulators(self, accs):
        sums, counts = zip(*accs)
        return sum(sums), sum(counts)

    def extract_output(self, acc):
        return acc[0] / acc[1] if acc[1] else None


@BUNDLE_SIZES
def test_lifted_combiners_and_global_default(tmp_path, bundle):
    def build(p):
        pairs = p | beam.Create([("a", 1), ("a", 3), ("b", 10)] * 50)
        per_key = pairs | beam.CombinePerKey(_MeanFn())
        empty_total = (p | "Empty" >> beam.Create([]).with_output_types(int)
                       | beam.CombineGlobally(sum))
        return (per_key, empty_total | beam.Map(lambda s: ("empty", s))) | beam.Flatten()
    assert spark_equals_direct(build, tmp_path, bundle) == [["a", 2.0], ["b", 10.0], ["empty", 0]]


def test_flatten_including_empty_and_repeated(tmp_path):
    def build(p):
        a = p | "A" >> beam.Create([1, 2])
        b = p | "B" >> beam.Create([3])
        empty = p | "E" >> beam.Create([]).with_output_types(int)
        return (a, b, empty, a) | beam.Flatten()
    assert spark_equals_direct(build, tmp_path) == [1, 1, 2, 2, 3]


def test_reshuffle_keeps_every_element(tmp_path):
    out = spark_equals_direct(
        lambda p: p | beam.Create(range(200)) | beam.Reshuffle() | beam.Map(lambda x: x * 2),
        tmp_path)
    assert sorted(out) == [x * 2 for x in range(200)]


def test_side_inputs_of_every_kind(tmp_path):
    def build(p):
        main = p | "Main" >> beam.Create([1, 2, 3])
        side = p | "Side" >> beam.Create([("a", 1), ("b", 2), ("a", 3)])
        total = p | "Total" >> beam.Create([10])
        return main | beam.Map(
            lambda x, single, it, lst, dct, multi: (
                x + single, sorted(v for _, v in it), len(lst), sorted(dct.items()),
                sorted(multi["a"])),
            single=beam.pvalue.AsSingleton(total),
            it=beam.pvalue.AsIter(side),
            lst=beam.pvalue.AsList(side),
            dct=beam.pvalue.AsDict(side | "Last" >> beam.CombinePerKey(max)),
            multi=beam.pvalue.AsMultiMap(side))
    out = spark_equals_direct(build, tmp_path)
    assert out[0] == [11, [1, 2, 3], 3, [["a", 3], ["b", 2]], [1, 3]]


def _counts_and_shares(p, combines: int):
    """``combines`` CombineGlobally's of one ParDo's output (each injects its
    default through a side input of its result), the first total also read
    as a side input by two later steps."""
    numbers = p | beam.Create(range(1, 101)) | "Square" >> beam.Map(lambda x: x * x)
    results = [numbers | f"Sum{i}" >> beam.CombineGlobally(sum) for i in range(combines)]
    total = beam.pvalue.AsSingleton(results[0])
    shares = numbers | "Share" >> beam.Map(lambda x, t: x * 1000 // t, t=total)
    scaled = results[-1] | "Scaled" >> beam.Map(lambda s, t: s * 1000 // t, t=total)
    return (results + [shares | "SumShares" >> beam.CombineGlobally(sum), scaled]) | beam.Flatten()


def test_side_inputs_a_job_completes_are_collected_in_that_job(spark, tmp_path):
    # The job that collects the first total's side input also collects the
    # second's: three CombineGlobally's take the Spark jobs one takes, and a
    # side input two steps read is collected once.
    got = spark_equals_direct(lambda p: _counts_and_shares(p, 3), tmp_path)
    assert sorted(got) == sorted([338350] * 3 + [sum(x * x * 1000 // 338350 for x in range(1, 101)), 1000])
    assert spark_jobs_run(spark, lambda p: _counts_and_shares(p, 3)) == spark_jobs_run(
        spark, lambda p: _counts_and_shares(p, 1))


@pytest.mark.parametrize("kept", [range(0), range(1, 8), range(1, 2000)])
def test_a_global_combine_injects_its_default_in_the_job_that_computes_it(spark, tmp_path, kept):
    # CombineGlobally injects its default from a Create of one element that
    # reads the combined result as a side input. That step gathers the side
    # input in its one task, in the job computing it: one Spark job in all,
    # the default where nothing is left to combine.
    def build(p):
        numbers = p | beam.Create(range(1, 2000)) | "Keep" >> beam.Filter(lambda x, s=set(kept): x in s)
        return ((numbers | "Sum" >> beam.CombineGlobally(sum), numbers | "Count" >> beam.combiners.Count.Globally(),
                 numbers | "All" >> beam.combiners.ToList() | "Sorted" >> beam.Map(sorted)) | beam.Flatten())

    got = spark_equals_direct(build, tmp_path)
    assert sorted(got, key=repr) == sorted([sum(kept), len(kept), list(kept)], key=repr)
    assert spark_jobs_run(spark, lambda p: build(p) | beam.Map(print)) == 1


def _add(x: int, offset: int) -> int:
    return x + offset


def test_a_pipeline_run_again_sees_its_new_side_inputs(spark, tmp_path):
    # The same stages run again in one session: Python workers reuse their
    # bundle processors, which must not keep the previous run's side inputs.
    from beam_ext.runner import SparkRunner

    def build(offset):
        def pipeline(p):
            side = p | "Side" >> beam.Create([offset])
            return (p | "Main" >> beam.Create([1, 2, 3])
                    | beam.Map(_add, beam.pvalue.AsSingleton(side)))
        return pipeline

    for offset in (10, 20, 30):
        # The same output path each time: the stages, writes included, are equal.
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        out = run_and_collect(SparkRunner(), build(offset), str(tmp_path / "out"))
        assert out == [1 + offset, 2 + offset, 3 + offset]


def test_writing_the_same_files_again_replaces_them(spark, tmp_path):
    # WriteToText's bundles learn their temporary directory from a side input:
    # a second run writing there must use its own, and leave none behind.
    from beam_ext.runner import SparkRunner

    prefix = str(tmp_path / "out" / "part")
    for run in range(3):
        with beam.Pipeline(runner=SparkRunner()) as p:
            (p | beam.Create([f"{run}-{i}" for i in range(50)])
             | beam.io.WriteToText(prefix, num_shards=2))
        files = sorted(os.listdir(tmp_path / "out"))
        assert files == ["part-00000-of-00002", "part-00001-of-00002"]
        lines = sorted(read_lines_of(tmp_path / "out"))
        assert lines == sorted(f"{run}-{i}" for i in range(50))
    assert sorted(os.listdir(tmp_path)) == ["out"]


def read_lines_of(directory) -> list[str]:
    lines = []
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            lines += f.read().splitlines()
    return lines


def test_windowed_side_input(tmp_path):
    def build(p):
        main = (_timestamped(p, [(1, 1), (2, 12)], "Main")
                | "WM" >> beam.WindowInto(window.FixedWindows(10)))
        side = (_timestamped(p, [(100, 2), (200, 15)], "Side")
                | "WS" >> beam.WindowInto(window.FixedWindows(10)))
        return main | beam.Map(lambda x, s: (x, s), s=beam.pvalue.AsSingleton(side))
    assert spark_equals_direct(build, tmp_path) == [[1, 100], [2, 200]]


class _BufferUntilTimer(beam.DoFn):
    """Buffers a key's values and emits them, sorted, when its timer fires."""

    BUFFER = BagStateSpec("buffer", beam.coders.VarIntCoder())
    COUNT = CombiningValueStateSpec(
        "count", beam.coders.VarIntCoder(), beam.combiners.CountCombineFn())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)
    LATER = TimerSpec("later", TimeDomain.REAL_TIME)

    def process(self, kv, buffer=beam.DoFn.StateParam(BUFFER),
                count=beam.DoFn.StateParam(COUNT), flush=beam.DoFn.TimerParam(FLUSH),
                later=beam.DoFn.TimerParam(LATER)):
        buffer.add(kv[1])
        count.add(1)
        flush.set(Timestamp(100))
        later.set(Timestamp.now() + 1)

    @on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, buffer=beam.DoFn.StateParam(BUFFER),
                 count=beam.DoFn.StateParam(COUNT)):
        yield ("event", key, sorted(buffer.read()), count.read())
        buffer.clear()

    @on_timer(LATER)
    def on_later(self, key=beam.DoFn.KeyParam):
        yield ("processing", key, None, None)


@BUNDLE_SIZES
def test_stateful_dofn_with_event_and_processing_timers(tmp_path, bundle):
    def build(p):
        return (p | beam.Create([("a", 3), ("b", 1), ("a", 1), ("a", 2)] * 3)
                | beam.ParDo(_BufferUntilTimer()))
    out = spark_equals_direct(build, tmp_path, bundle)
    assert ["event", "a", [1, 1, 1, 2, 2, 2, 3, 3, 3], 9] in out
    assert ["processing", "b", None, None] in out and len(out) == 4


class _RangeSource(beam.DoFn, beam.transforms.core.RestrictionProvider):
    """Splittable: emits (i, partition id) for i in [0, n); splits in 8."""

    def initial_restriction(self, n):
        from apache_beam.io.restriction_trackers import OffsetRange
        return OffsetRange(0, n)

    def create_tracker(self, restriction):
        from apache_beam.io.restriction_trackers import OffsetRestrictionTracker
        return OffsetRestrictionTracker(restriction)

    def split(self, n, restriction):
        return restriction.split(max(1, restriction.size() // 8))

    def restriction_size(self, n, restriction):
        return restriction.size()

    def process(self, n, tracker=beam.DoFn.RestrictionParam()):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        where = ctx.partitionId() if ctx is not None else 0
        position = tracker.current_restriction().start
        while tracker.try_claim(position):
            yield position, where
            position += 1


def test_splittable_dofn_reads_everything_across_partitions(tmp_path):
    from pipeline_outputs import run_and_collect

    from beam_ext.runner import SparkRunner

    out = run_and_collect(
        SparkRunner(), lambda p: p | beam.Create([800]) | beam.ParDo(
            _RangeSource().with_output_types(tuple[int, int])), str(tmp_path))
    assert sorted(i for i, _ in out) == list(range(800))
    assert len({where for _, where in out}) > 1  # the initial splits ran in parallel


class _Measured(beam.DoFn):
    def process(self, x):
        beam.metrics.Metrics.counter("test", "seen").inc()
        beam.metrics.Metrics.distribution("test", "size").update(x)
        beam.metrics.Metrics.gauge("test", "last").set(x)
        yield x


@BUNDLE_SIZES
def test_user_metrics_are_merged_over_tasks(spark, bundle):
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_ext.runner import SparkRunner

    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(bundle))
    _ = p | beam.Create(list(range(1, 101))) | beam.Reshuffle() | beam.ParDo(_Measured())
    result = p.run()
    result.wait_until_finish()
    metrics = result.metrics().query()
    assert [c.committed for c in metrics["counters"]] == [100]
    dist = metrics["distributions"][0].committed
    assert (dist.count, dist.sum, dist.min, dist.max) == (100, 5050, 1, 100)
    assert metrics["gauges"][0].committed.value in range(1, 101)


@BUNDLE_SIZES
def test_spill_state_backend_gives_the_same_results(tmp_path, bundle):
    def build(p):
        return (p | beam.Create([("a", 3), ("b", 1), ("a", 1), ("a", 2)] * 3)
                | beam.ParDo(_BufferUntilTimer())
                | beam.Filter(lambda r: r[0] == "event"))
    out = spark_equals_direct(build, tmp_path, ["--spark_state_backend=spill",
                                                "--spark_state_memory=1024", *bundle])
    assert ["event", "a", [1, 1, 1, 2, 2, 2, 3, 3, 3], 9] in out


class _OnePerCall(beam.DoFn, beam.transforms.core.RestrictionProvider):
    """Splittable: emits one position of [0, n) per call, then defers the rest
    (for ``delay`` seconds)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def initial_restriction(self, n):
        from apache_beam.io.restriction_trackers import OffsetRange
        return OffsetRange(0, n)

    def create_tracker(self, restriction):
        from apache_beam.io.restriction_trackers import OffsetRestrictionTracker
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, n, restriction):
        return restriction.size()

    def process(self, n, tracker=beam.DoFn.RestrictionParam()):
        position = tracker.current_restriction().start
        if tracker.try_claim(position):
            yield n, position
            tracker.defer_remainder(beam.utils.timestamp.Duration(seconds=self.delay) if self.delay else None)


@BUNDLE_SIZES
def test_self_checkpointing_sdf_residuals_survive_every_bundle(tmp_path, bundle):
    out = spark_equals_direct(
        lambda p: (p | beam.Create(range(1, 21)) | beam.Reshuffle()
                   | beam.ParDo(_OnePerCall()).with_output_types(tuple[int, int])),
        tmp_path, bundle)
    assert len(out) == sum(range(1, 21))


class _BundleSizes(beam.DoFn):
    """Emits the number of elements of each bundle it processes."""

    def start_bundle(self):
        self._seen = 0

    def process(self, x):
        self._seen += 1

    def finish_bundle(self):
        yield beam.utils.windowed_value.WindowedValue(self._seen, 0, [window.GlobalWindow()])


def test_one_byte_bundles_hold_one_element_each(tmp_path):
    from pipeline_outputs import run_and_collect

    from beam_ext.runner import SparkRunner

    out = run_and_collect(
        SparkRunner(), lambda p: (p | beam.Create(range(20)) | beam.Reshuffle()
                                  | beam.ParDo(_BundleSizes())),
        str(tmp_path), ["--spark_bundle_size=1"])
    assert [n for n in out if n] == [1] * 20


def test_stateful_batches_of_one_key_are_whole_at_any_bundle_size(tmp_path):
    """A stateful batcher on one key: bundles of one element must not cut batches."""
    def build(p):
        return (p | beam.Create(range(10)) | beam.Map(lambda x: ("k", x))
                | beam.GroupIntoBatches(5) | beam.MapTuple(lambda k, batch: len(batch)))
    assert spark_equals_direct(build, tmp_path, ["--spark_bundle_size=1"]) == [5, 5]


class _Countdown(beam.DoFn):
    """A timer that sets itself again, once per element of its key, unless a
    multiple of 3 cleared it (for good: the result does not depend on order)."""

    LEFT = ReadModifyWriteStateSpec("left", beam.coders.VarIntCoder())
    CLEARED = ReadModifyWriteStateSpec("cleared", beam.coders.BooleanCoder())
    TICK = TimerSpec("tick", TimeDomain.WATERMARK)

    def process(self, kv, left=beam.DoFn.StateParam(LEFT), cleared=beam.DoFn.StateParam(CLEARED),
                tick=beam.DoFn.TimerParam(TICK)):
        left.write((left.read() or 0) + 1)
        if kv[1] % 3 == 0:
            tick.clear()
            cleared.write(True)
        elif not cleared.read():
            tick.set(Timestamp(10))

    @on_timer(TICK)
    def on_tick(self, key=beam.DoFn.KeyParam, left=beam.DoFn.StateParam(LEFT),
                tick=beam.DoFn.TimerParam(TICK), ts=beam.DoFn.TimestampParam):
        n = left.read()
        yield key, n, ts.micros
        if n > 1:
            left.write(n - 1)
            tick.set(ts + 1)


def test_timers_set_and_cleared_across_one_element_bundles(tmp_path):
    pairs = [("a", 1), ("b", 2), ("a", 7), ("c", 3), ("a", 4), ("b", 6), ("d", 5), ("d", 8)]
    out = spark_equals_direct(lambda p: p | beam.Create(pairs) | beam.ParDo(_Countdown()),
                              tmp_path, ["--spark_bundle_size=1"])
    assert out == [["a", 1, 12_000_000], ["a", 2, 11_000_000], ["a", 3, 10_000_000],
                   ["d", 1, 11_000_000], ["d", 2, 10_000_000]]
