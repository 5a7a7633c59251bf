"""DoFns with ``start_bundle``/``finish_bundle`` on element objects: bundles cut as Beam's bundle processor cuts them.

Oracles: plain Python on the same elements, DirectRunner on the same
pipeline, and the same DoFn on Beam's bundle processor (a variant that
asks for bundle finalization keeps that path): every bundle holds the same
elements on both paths.
"""
from __future__ import annotations

import heapq

import apache_beam as beam
import pytest
from apache_beam.transforms.window import GlobalWindows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_outputs import run_and_collect, spark_equals_direct

from beam_ext.runner import PipelineError, SparkRunner
from beam_ext.runner.planning import plan_pipeline

pytestmark = pytest.mark.usefixtures("spark")


class _Bundles(beam.DoFn):
    """Emits, at the end of each bundle, the bundle's elements, sorted (none for an empty bundle)."""

    def start_bundle(self):
        self._seen = []

    def process(self, x):
        self._seen.append(x)

    def finish_bundle(self):
        if self._seen:
            yield GlobalWindows.windowed_value(sorted(self._seen))


class _BundlesFinalized(_Bundles):
    """The same, asking for bundle finalization: it keeps Beam's bundle processor."""

    def process(self, x, finalizer=beam.DoFn.BundleFinalizerParam):
        self._seen.append(x)


class _Flushes(beam.DoFn):
    """Writes in batches of three, as a DoFn that batches calls to a service
    does; what is left goes out when the bundle finishes."""

    def start_bundle(self):
        self._buffer = []

    def process(self, x):
        self._buffer.append(x)
        if len(self._buffer) == 3:
            yield list(self._buffer)
            self._buffer.clear()

    def finish_bundle(self):
        if self._buffer:
            yield GlobalWindows.windowed_value(list(self._buffer))


def _on_objects(build) -> int:
    """How many planned stages run DoFns that see bundles on element objects."""
    p = beam.Pipeline()
    build(p)
    plan = plan_pipeline(p.to_runner_api(), 1 << 20, 2)
    return sum(stage.direct is not None and stage.direct.sees_bundles() for stage in plan.stages)


def _bundles(fn, values):
    def build(p):
        return p | beam.Create(values) | "Double" >> beam.Map(lambda x: 2 * x) | "Bundles" >> beam.ParDo(fn)
    return build


@pytest.mark.parametrize("bundle_size", [1, 40, 1 << 20])
def test_each_bundle_holds_what_beams_bundle_processor_gives_it(tmp_path, bundle_size):
    values = list(range(80))
    options = [f"--spark_bundle_size={bundle_size}"]
    assert _on_objects(_bundles(_Bundles(), values)) == 1
    assert _on_objects(_bundles(_BundlesFinalized(), values)) == 0
    on_objects = run_and_collect(SparkRunner(), _bundles(_Bundles(), values), str(tmp_path / "objects"), options)
    processor = run_and_collect(SparkRunner(), _bundles(_BundlesFinalized(), values), str(tmp_path / "processor"),
                                options)
    assert on_objects == processor
    assert sorted(x for bundle in on_objects for x in bundle) == [2 * x for x in values]
    if bundle_size == 1:
        assert all(len(bundle) == 1 for bundle in on_objects)
    elif bundle_size == 40:  # an element is 2 to 4 bytes encoded: several elements, several bundles per task
        assert 2 * 2 < len(on_objects) < len(values)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(-1000, 1000), max_size=50), bundle_size=st.sampled_from([1, 9, 1 << 20]))
def test_a_dofn_flushing_in_finish_bundle_loses_and_repeats_nothing(tmp_path_factory, values, bundle_size):
    def build(p):
        return (p | beam.Create(values) | "Flush" >> beam.ParDo(_Flushes())
                | "Sizes" >> beam.FlatMap(lambda batch: [[len(batch) <= 3, x] for x in batch]))
    assert _on_objects(build) == 1
    got = spark_equals_direct(build, tmp_path_factory.mktemp("flush"), [f"--spark_bundle_size={bundle_size}"])
    assert sorted(got) == sorted([True, x] for x in values)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(-100, 100), max_size=60), n=st.integers(1, 6))
def test_top_equals_plain_python_and_beam(tmp_path_factory, values, n):
    def build(p):
        numbers = p | beam.Create(values)
        largest = numbers | "TopLargest" >> beam.combiners.Top.Largest(n) | "L" >> beam.Map(lambda xs: ["largest", xs])
        smallest = (numbers | "TopSmallest" >> beam.combiners.Top.Smallest(n)
                    | "S" >> beam.Map(lambda xs: ["smallest", xs]))
        return (largest, smallest) | beam.Flatten()
    assert _on_objects(build) == 2  # each Top's per-bundle step
    got = spark_equals_direct(build, tmp_path_factory.mktemp("top"))
    assert sorted(got) == sorted([["largest", heapq.nlargest(n, values)], ["smallest", heapq.nsmallest(n, values)]])


class _OutputsNotWindowed(_Bundles):
    def finish_bundle(self):
        yield sorted(self._seen)


class _OutputsInStartBundle(_Bundles):
    def start_bundle(self):
        self._seen = []
        return [1]


@pytest.mark.parametrize("fn, cause", [
    (_OutputsNotWindowed(), "Finish Bundle should only output WindowedValue type"),
    (_OutputsInStartBundle(), "Start Bundle should not output any elements"),
], ids=["finish_bundle", "start_bundle"])
def test_bundle_methods_outputs_are_checked_as_beam_checks_them(fn, cause):
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _bundles(fn, [1, 2, 3])(p)
    message = str(info.value)
    assert message.startswith("Beam step 'Bundles' failed on Spark:")
    assert cause in message
