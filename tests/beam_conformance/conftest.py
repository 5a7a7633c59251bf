"""Beam's own runner tests, pointed at SparkRunner.

``TestPipeline()`` inside Beam's tests reads its options from
``TestPipeline.pytest_test_pipeline_options``; setting it here makes every
``it_validatesrunner`` test run on SparkRunner, on the session's local[2]
SparkSession (SparkRunner attaches to the active session). Beam's streaming
tests pass their own options (``--streaming``), which a ``TestPipeline``
prefers to these: the ``test_pipelines_on_spark`` fixture points them at
SparkRunner too. Beam's DataFrame tests build ``beam.Pipeline()``, which
runs on Beam's default runner: the ``pipelines_on_spark`` fixture makes that
SparkRunner.
"""
from __future__ import annotations

import inspect
import sys

import pytest
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline

SPARK_RUNNER_OPTIONS = "--runner=beam_ext.runner.SparkRunner"

_ONE_BUNDLE = (
    "Beam's test assumes one bundle holds all input (its own comment says so for "
    "test_constant_batch): non-stateful BatchElements batches within a bundle, and "
    "SparkRunner's bundles are per Spark task: here the input spreads over two tasks")
_ONE_PROCESS = (
    "the result depends on every step running in one Python process, as on DirectRunner: "
    "{}; SparkRunner runs the steps in several Spark Python workers")

_REVERSE_TEST_STREAM = (
    "ReverseTestStream pairs elements with the runner's clock and watermark through "
    "PairWithTiming, a primitive only Beam's Python DirectRunner implements (it has no "
    "portable URN: the pipeline proto carries it as beam:transform:pickled_python:v1)")
_UNBOUNDED_SIDE_INPUT = (
    "the side input comes from the TestStream, an unbounded PCollection: SparkRunner "
    "streaming takes bounded side inputs only for now (complete before the main input "
    "needs them) and refuses this with NotImplementedError")

_DIRECT_STALLS = (
    "fails on Beam's DirectRunner in streaming too, which the transcript marks broken_on "
    "(SwitchingDirectRunner: {}); run on BundleBasedDirectRunner it ends in the executor's "
    "pipeline-stall error")

# Each skip names the test and why; docs/runner.md lists them too. Names
# match node ids by suffix: "TestStreamTranscriptTest::t" covers the
# WeakTestStreamTranscriptTest variant too.
SKIPPED_ON_SPARK = {
    # transforms/trigger_test.py transcripts on SparkRunner --streaming
    "TestStreamTranscriptTest::test_early_late_sessions": _DIRECT_STALLS.format(
        "'Watermark regresses, causing what should be late data to not be late'"),
    "TestStreamTranscriptTest::test_garbage_collection": _DIRECT_STALLS.format("'claims pipeline stall'"),
    "TestStreamTranscriptTest::test_timestamp_combiner_custom_timestamping_earliest_1": (
        "OUTPUT_AT_EARLIEST_TRANSFORMED has no Runner API encoding ('unknown enum label'): "
        "no portable runner can receive the pipeline; the transcript marks it broken on "
        "the DirectRunner, which fails the same way"),
    # testing/test_stream_test.py on SparkRunner --streaming
    "ReverseTestStreamTest::test_basic_execution": _REVERSE_TEST_STREAM,
    "ReverseTestStreamTest::test_basic_execution_in_records_format": _REVERSE_TEST_STREAM,
    "ReverseTestStreamTest::test_windowing": _REVERSE_TEST_STREAM,
    "TestStreamTest::test_basic_execution_sideinputs": _UNBOUNDED_SIDE_INPUT,
    "TestStreamTest::test_basic_execution_sideinputs_fixed_windows": _UNBOUNDED_SIDE_INPUT,
    "TestStreamTest::test_basic_execution_with_service": (
        "the TestStream reads its events at run time from a TestStreamService over gRPC "
        "(Interactive Beam's mechanism, read only by Beam's Python DirectRunner); SparkRunner "
        "plans a TestStream from the events in the pipeline and refuses an endpoint"),
    "TestStreamTest::test_windowed_values_interpreted_correctly": (
        "the element is a WindowedValueHolder asking to be placed in IntervalWindow(5, 10) "
        "although the TestStream's output is globally windowed; a portable runner carries "
        "elements encoded with the PCollection's window coder (GlobalWindowCoder), which "
        "cannot hold that window. Only Beam's Python DirectRunner, passing Python objects "
        "between steps, unreifies it"),

    # io/textio_test.py on SparkRunner
    "CsvTest::test_csv_read_with_filename": (
        "expects WriteToCsv to write one file: with num_shards=0 the runner picks the "
        "sharding, and a write makes one shard per bundle; FnApiRunner runs the 3 "
        "elements in one bundle, SparkRunner in one bundle per Spark task (2 files here)"),
    "TextSourceTest::test_read_from_text_file_pattern_with_dot_slash": (
        "the test os.chdir()s into its temp dir and reads './*.txt': the relative pattern "
        "is matched when the source splits, in a Spark Python worker, whose working "
        "directory stays the one Spark started in (FnApiRunner's worker is the test "
        "process), so it matches no file and reads nothing"),

    "BatchElementsTest::test_constant_batch": _ONE_BUNDLE,
    "BatchElementsTest::test_constant_batch_no_metrics": _ONE_BUNDLE,
    "BatchElementsTest::test_length_fn_without_stateful_is_ignored": _ONE_BUNDLE,
    "BatchElementsTest::test_stateful_in_global_window": _ONE_PROCESS.format(
        "stateful BatchElements keys elements by a per-process id (WithSharedKey), so two "
        "workers make two keys and their batches end separately (3 batches instead of 2; "
        "one key's batches are never split)"),
    "GroupIntoBatchesTest::test_with_sharded_key_in_global_window": _ONE_PROCESS.format(
        "WithShardedKey's shard id is a per-process id plus the thread id, so two workers "
        "make two shards and 3 batches instead of 2"),
    "GroupByEncryptedKeyTest::test_gbek_fake_secret_manager_roundtrips": (
        "expects a key's grouped values in input order ('a', [1, 2]); GroupByKey gives no "
        "order, and on Spark the two values of 'a' come from two tasks, so [2, 1] happens"),
    "WaitOnTest::test_find": _ONE_PROCESS.format(
        "the test counts calls in a module global of the process"),
    "TeeTest::test_tee": _ONE_PROCESS.format(
        "the test reads side effects from a class attribute in the test's own process"),
    "LogElementsTest::test_stdout_logs": _ONE_PROCESS.format(
        "the test captures what LogElements prints in the test's own process"),
    "LogElementsTest::test_stdout_logs_without_rfc3339": _ONE_PROCESS.format(
        "the test captures what LogElements prints in the test's own process"),
    "LogElementsTest::test_setting_level_uses_appropriate_log_channel": _ONE_PROCESS.format(
        "the test captures what LogElements logs in the test's own process"),
    "PTransformTest::test_group_by_key_importable_special_types_1": (
        "with --update_compatibility_version=2.66.0 the key's type is encoded with "
        "dill.dumps, whose bytes only load in the process that wrote them: in another "
        "Spark Python worker dill.loads intermittently fails ('A load persistent id "
        "instruction was encountered'); Beam's FnApiRunner runs one process. The "
        "default-version variant of the test passes."),
}


# Beam's streaming suites run this subset by default: every micro-batch costs
# a Spark job, and a transcript replays dozens of them. The subset is every
# test of test_stream_test.py and TriggerPipelineTest, and five strict
# transcripts of under 5 s each: early firings, late data, allowed lateness,
# a timestamp combiner, a failing check (the weak variants replay the same
# transcripts, the others more batches of the same features). Their
# other tests, but the skipped ones, carry the ``slow_streaming`` marker, which
# pytest.ini deselects; ``pytest -m slow_streaming tests/beam_conformance`` runs them.
_STREAMING_SUITES = ("test_beam_test_stream_suite.py", "test_beam_trigger_suite.py")
STREAMING_DEFAULT = (
    # test_stream_test.py: the tests that build no pipeline, then elements and watermarks,
    # processing time, bounded side inputs, GroupByKey with a watermark trigger
    "::TestStreamTest::test_basic_test_stream",
    "::TestStreamTest::test_test_stream_errors",
    "::TestStreamTest::test_instance_check_windowed_value_holder",
    "::TestStreamTest::test_roundtrip_proto",
    "::TestStreamTest::test_roundtrip_proto_multi",
    "::TestStreamTest::test_basic_execution",
    "::TestStreamTest::test_basic_execution_batch_sideinputs",
    "::TestStreamTest::test_gbk_execution_after_watermark_trigger",
    "::TestStreamTest::test_dicts_not_interpreted_as_windowed_values",
    "::TestStreamTest::test_multiple_outputs",
    "::TestStreamTest::test_multiple_outputs_with_watermark_advancement",
    "::TestStreamTest::test_gbk_execution_no_triggers",
    "::TestStreamTest::test_gbk_execution_after_processing_trigger_fired",
    "::TestStreamTest::test_basic_execution_batch_sideinputs_fixed_windows",
    # trigger_test.py: count, processing-time and accumulating triggers, a pane's watermark hold
    "::TriggerPipelineStreamingTest::test_after_processing_time",
    "::TriggerPipelineStreamingTest::test_on_pane_watermark_hold_no_pipeline_stall",
    "::TriggerPipelineStreamingTest::test_after_count_streaming",
    "::TriggerPipelineStreamingTest::test_repeatedly_after_processing_time",
    "::TriggerPipelineStreamingTest::test_multiple_accumulating_firings",
    # trigger_transcripts.yaml: early firings, late data, lateness, a timestamp combiner, a failing check
    "::TestStreamTranscriptTest::test_discarding_early_fixed",
    "::TestStreamTranscriptTest::test_missing_output",
    "::TestStreamTranscriptTest::test_known_late_data_no_watermark_hold_possible",
    "::TestStreamTranscriptTest::test_fixed_drop_late_data_after_allowed_lateness",
    "::TestStreamTranscriptTest::test_timestamp_combiner_earliest",
)

# Beam's DataFrame and text IO suites: every pipeline of a DataFrame costs
# several Spark jobs. By default they run this subset and, of textio_test,
# the tests that build no pipeline (reader and sink unit tests, under a
# second each; every transforms_test test runs pipelines); the others carry
# ``slow_dataframe``, deselected in pytest.ini:
# ``pytest -m slow_dataframe tests/beam_conformance`` runs them.
DATAFRAME_DEFAULT = (
    # transforms_test.py: grouping (a shuffle), elements to DataFrames and back
    "::TransformTest::test_groupby_sum_mean",
    "::TransformTest::test_batching_named_tuple_input",
    "::TransformTest::test_unbatching_series",
    # textio_test.py: a pattern of files, ReadAll, gzip, a sharded write, a
    # triggered write of a TestStream
    "::TextSourceTest::test_read_from_text_file_pattern",
    "::TextSourceTest::test_read_all_file_pattern",
    "::TextSourceTest::test_read_gzip",
    "::TextSinkTest::test_write_pipeline",
    "::WriteStreamingTest::test_write_streaming_2_shards_default_shard_name_template",
)


# parquetio_test.py runs whole, but for its one slow test that builds no
# pipeline: Beam's own source splitting (18 s), which the runner never calls.
PARQUET_SLOW = ("::TestParquet::test_dynamic_work_rebalancing",)


def _slow_dataframe(item) -> bool:
    if any(item.nodeid.endswith(name) for name in PARQUET_SLOW):
        return True
    if any(item.nodeid.endswith(name) for name in DATAFRAME_DEFAULT):
        return False
    if item.fspath.basename == "test_beam_dataframe_suite.py":
        return True
    # textio_test's tests build their pipelines in their own bodies (its helpers build none)
    return item.fspath.basename == "test_beam_textio_suite.py" and "Pipeline(" in inspect.getsource(item.obj)


# The PortableRunner suite repeats the FnApiRunner suite through the job
# server: PORTABLE_DEFAULT (in the suite's module) runs by default, the rest
# carries ``slow_portable``, which pytest.ini deselects.
_PORTABLE_SUITE = "test_portable_runner_suite.py"


@pytest.fixture(autouse=True, scope="session")
def _beam_tests_on_spark(spark):
    previous = TestPipeline.pytest_test_pipeline_options
    TestPipeline.pytest_test_pipeline_options = SPARK_RUNNER_OPTIONS
    yield
    TestPipeline.pytest_test_pipeline_options = previous


class _SparkTestPipeline(TestPipeline):
    """A ``TestPipeline`` on SparkRunner even when the test passes its own options.

    ``TestPipeline(options=...)`` ignores ``pytest_test_pipeline_options``
    and would run on Beam's default DirectRunner; a runner the test names
    (``TestPipeline('FnApiRunner')``) is kept.
    """

    def __init__(self, runner=None, options=None, *args, **kwargs):
        from beam_ext.runner import SparkRunner

        super().__init__(runner or SparkRunner(), options, *args, **kwargs)


@pytest.fixture
def test_pipelines_on_spark(request, monkeypatch):
    """Makes the ``TestPipeline`` of the Beam modules defining the test class run on SparkRunner."""
    for cls in request.cls.__mro__:
        module = sys.modules[cls.__module__]
        if cls.__module__.startswith("apache_beam.") and hasattr(module, "TestPipeline"):
            monkeypatch.setattr(module, "TestPipeline", _SparkTestPipeline)


@pytest.fixture
def pipelines_on_spark(monkeypatch):
    """Makes ``beam.Pipeline()`` without a runner, which Beam runs on DirectRunner, run on SparkRunner.

    ``beam.Pipeline()`` takes ``StandardOptions.DEFAULT_RUNNER`` when neither
    argument nor options name a runner; a runner the test names
    (``beam.Pipeline('FnApiRunner')``) is kept.
    """
    monkeypatch.setattr(StandardOptions, "DEFAULT_RUNNER", SPARK_RUNNER_OPTIONS.split("=", 1)[1])


def pytest_collection_modifyitems(config, items):
    """Of Beam's imported test classes, keep the runner-validation tests.

    Modules named ``test_validates_runner_*`` hold Beam's classes as they are
    (only ``it_validatesrunner`` tests run); ``test_fn_api_suite.py`` runs
    Beam's FnApiRunner suite on SparkRunner and ``test_beam_util_suite.py``
    Beam's util_test classes; both keep everything they collect. The
    streaming suites (``_STREAMING_SUITES``) keep ``STREAMING_DEFAULT`` and
    the skipped tests by default and mark the rest ``slow_streaming``; the
    PortableRunner suite marks all but its ``PORTABLE_DEFAULT`` ``slow_portable``;
    the DataFrame and text IO suites keep ``DATAFRAME_DEFAULT`` and mark
    the other tests that build a pipeline ``slow_dataframe``; the Parquet
    suite marks only ``PARQUET_SLOW`` so.
    """
    kept, dropped = [], []
    for item in items:
        skipped = False
        for name, reason in SKIPPED_ON_SPARK.items():
            if item.nodeid.endswith(name):
                item.add_marker(pytest.mark.skip(reason=reason))
                skipped = True
        if item.fspath.basename in _STREAMING_SUITES and not skipped and not any(
                item.nodeid.endswith(name) for name in STREAMING_DEFAULT):
            item.add_marker(pytest.mark.slow_streaming)
        if item.fspath.basename == _PORTABLE_SUITE and item.name not in item.module.PORTABLE_DEFAULT:
            item.add_marker(pytest.mark.slow_portable)
        if not skipped and _slow_dataframe(item):
            item.add_marker(pytest.mark.slow_dataframe)
        in_here = "beam_conformance" in str(item.fspath)
        if in_here and "test_validates_runner_" in item.fspath.basename:
            if item.get_closest_marker("it_validatesrunner") is None:
                dropped.append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
