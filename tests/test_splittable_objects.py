"""Splittable DoFns processed on element objects (``beam_ext/runner/worker/_splittable.py``).

Each pipeline runs on SparkRunner and is checked against Beam's own runner
and against offsets listed in Python: every claimed offset once, in each
window of its element, whatever the initial splits and deferred remainders.
"""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.io import iobase
from apache_beam.io.range_trackers import OffsetRangeTracker
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.transforms import window
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_outputs import run_and_collect, spark_equals_direct

from beam_ext.runner import PipelineError, SparkRunner
from beam_ext.runner.planning import plan_pipeline

_WINDOWS = {
    "global": (window.GlobalWindows(), lambda t: [None]),
    "fixed": (window.FixedWindows(10), lambda t: [t - t % 10]),
    "sliding": (window.SlidingWindows(10, 5), lambda t: [s for s in (t - t % 5 - 5, t - t % 5) if s + 10 > t]),
}


class _Offsets(beam.DoFn, beam.RestrictionProvider):
    """Element ``n``'s offsets ``[0, n)``, split into ``parts`` at the start;
    after every ``defer`` claims it defers the rest of its restriction."""

    def __init__(self, parts: int = 1, defer: int = 0) -> None:
        self.parts = parts
        self.defer = defer

    def initial_restriction(self, n):
        return OffsetRange(0, n)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, n, restriction):
        return restriction.size()

    def split(self, n, restriction):
        yield from restriction.split(max(1, -(-restriction.size() // self.parts)))

    # Beam binds the tracker by keyword: the DoFn's parameters before it take their places.
    def process(self, n, timestamp=beam.DoFn.TimestampParam, tracker=beam.DoFn.RestrictionParam()):
        offset = tracker.current_restriction().start
        claimed = 0
        while tracker.try_claim(offset):
            yield n, offset, int(timestamp)
            offset += 1
            claimed += 1
            if self.defer and claimed % self.defer == 0:
                tracker.defer_remainder()
                return


class _OffsetsPerWindow(_Offsets):
    """:class:`_Offsets` observing its window: Beam calls it once per window."""

    def process(self, n, timestamp=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam,
                tracker=beam.DoFn.RestrictionParam()):
        for row in super().process(n, timestamp, tracker):
            yield *row, "per window", _start(w)


def _start(w):
    return None if isinstance(w, window.GlobalWindow) else int(w.start)


def _offsets(p, ns: list[int], windows: str, dofn: beam.DoFn):
    return (p | beam.Create(ns) | "Stamp" >> beam.Map(lambda n: window.TimestampedValue(n, n))
            | beam.WindowInto(_WINDOWS[windows][0]) | "Offsets" >> beam.ParDo(dofn)
            | "Window" >> beam.Map(lambda x, w=beam.DoFn.WindowParam: [*x, _start(w)]))


def _oracle(ns: list[int], windows: str, per_window: bool) -> list:
    starts = _WINDOWS[windows][1]
    out = [[n, i, n, *(["per window", s] if per_window else []), s]
           for n in ns for s in starts(n) for i in range(n)]
    return sorted(out, key=repr)


def _sorted(rows: list) -> list:
    return sorted(rows, key=repr)


def _splittable_on_objects(build) -> list[bool]:
    """Of each stage processing a splittable DoFn's restrictions: whether it runs on element objects."""
    p = beam.Pipeline()
    build(p)
    plan = plan_pipeline(p.to_runner_api(), 1 << 20, 2)
    return [stage.direct is not None for stage in plan.stages if stage.spread]


@pytest.mark.parametrize("windows, per_window, parts, defer", [
    ("global", False, 1, 0),
    ("fixed", True, 3, 0),
    ("sliding", False, 2, 2),
    ("sliding", True, 1, 3),
])
def test_offsets_equal_beam_and_python(tmp_path, windows, per_window, parts, defer):
    ns = [0, 1, 4, 7, 12, 13]
    dofn = (_OffsetsPerWindow if per_window else _Offsets)(parts, defer)
    assert _splittable_on_objects(lambda p: _offsets(p, ns, windows, dofn)) == [True]
    got = spark_equals_direct(lambda p: _offsets(p, ns, windows, dofn), tmp_path)
    assert _sorted(got) == _oracle(ns, windows, per_window)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ns=st.lists(st.integers(0, 25), max_size=6), windows=st.sampled_from(sorted(_WINDOWS)),
       per_window=st.booleans(), parts=st.integers(1, 4), defer=st.integers(0, 3))
def test_random_restrictions_equal_python(tmp_path_factory, ns, windows, per_window, parts, defer):
    dofn = (_OffsetsPerWindow if per_window else _Offsets)(parts, defer)
    got = run_and_collect(SparkRunner(), lambda p: _offsets(p, ns, windows, dofn), str(tmp_path_factory.mktemp("sdf")))
    assert _sorted(got) == _oracle(ns, windows, per_window)


class _StopsEarly(_Offsets):
    """Claims one offset of each restriction and returns: Beam's check that the restriction is done fails."""

    def process(self, n, tracker=beam.DoFn.RestrictionParam()):
        if tracker.try_claim(tracker.current_restriction().start):
            yield n


def test_a_restriction_left_unclaimed_fails_naming_the_step():
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create([5]) | "Unfinished" >> beam.ParDo(_StopsEarly())
    assert "Unfinished" in str(info.value) and "claimed" in str(info.value)


class _WithWatermark(_Offsets):
    """Keeps a watermark estimator: Beam's bundle processor runs it."""

    def process(self, n, tracker=beam.DoFn.RestrictionParam(),
                estimator=beam.DoFn.WatermarkEstimatorParam(ManualWatermarkEstimator.default_provider())):
        offset = tracker.current_restriction().start
        while tracker.try_claim(offset):
            yield n, offset, n
            offset += 1


def test_a_splittable_dofn_keeping_a_watermark_estimator_keeps_the_bundle_processor(tmp_path):
    def build(p):
        return _offsets(p, [3, 5], "global", _WithWatermark())

    assert _splittable_on_objects(build) == [False]
    assert _sorted(run_and_collect(SparkRunner(), build, str(tmp_path))) == _oracle([3, 5], "global", False)


class _Squares(iobase.BoundedSource):
    """The squares of ``[0, n)``, in bundles of 7 offsets."""

    def __init__(self, n: int) -> None:
        self.n = n

    def estimate_size(self):
        return self.n

    def get_range_tracker(self, start, stop):
        return OffsetRangeTracker(0 if start is None else start, self.n if stop is None else stop)

    def read(self, range_tracker):
        offset = range_tracker.start_position()
        while range_tracker.try_claim(offset):
            yield offset * offset
            offset += 1

    def split(self, desired_bundle_size, start_position=None, stop_position=None):
        start = start_position or 0
        stop = self.n if stop_position is None else stop_position
        for at in range(start, stop, 7):
            yield iobase.SourceBundle(min(7, stop - at), self, at, min(at + 7, stop))


def test_a_bounded_source_read_runs_on_objects_as_beam(tmp_path):
    def build(p):
        return p | beam.io.Read(_Squares(30))

    assert _splittable_on_objects(build) == [True]
    assert sorted(spark_equals_direct(build, tmp_path)) == [i * i for i in range(30)]


class _OffsetsScaled(_Offsets):
    """:class:`_Offsets` scaled by a side input read whole, and by a keyword one."""

    def process(self, n, scales, tracker=beam.DoFn.RestrictionParam(), shift=0):
        for row in super().process(n, 0, tracker):
            yield row[0], row[1] * scales.get(row[0] % 3, 1) + shift


def _scaled_offsets(p):
    scales = p | "Scales" >> beam.Create([(0, 10), (1, 100)])
    shift = p | "Shift" >> beam.Create([7])
    return (p | beam.Create([3, 4, 5]) | "Offsets" >> beam.ParDo(
        _OffsetsScaled(parts=2), beam.pvalue.AsDict(scales), shift=beam.pvalue.AsSingleton(shift)))


def test_a_splittable_dofn_reading_side_inputs_runs_on_objects_as_beam(tmp_path):
    got = spark_equals_direct(_scaled_offsets, tmp_path)
    scale = {0: 10, 1: 100}
    assert _sorted(got) == _sorted([[n, i * scale.get(n % 3, 1) + 7] for n in (3, 4, 5) for i in range(n)])
    assert _splittable_on_objects(_scaled_offsets) == [True]


def test_beams_read_from_csv_runs_on_objects_as_beam(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("key,amount,name\n" + "".join(f"{i % 7},{i * 0.5},n{i % 3}\n" for i in range(2_000)))

    def build(p):
        return (p | beam.io.ReadFromCsv(str(path)) | beam.GroupBy("key").aggregate_field("amount", sum, "total")
                | beam.Map(tuple))
    got = spark_equals_direct(build, tmp_path)
    assert sorted(map(tuple, got)) == [(k, sum(i * 0.5 for i in range(2_000) if i % 7 == k)) for k in range(7)]
    # The reader (a splittable DoFn with a side input) and the rows its frames explode into, on objects.
    assert _splittable_on_objects(build) == [True]
