"""Beam's own runner tests, pointed at SparkRunner.

``TestPipeline()`` inside Beam's tests reads its options from
``TestPipeline.pytest_test_pipeline_options``; setting it here makes every
``it_validatesrunner`` test run on SparkRunner, on the session's local[2]
SparkSession (SparkRunner attaches to the active session).
"""
from __future__ import annotations

import pytest
from apache_beam.testing.test_pipeline import TestPipeline

SPARK_RUNNER_OPTIONS = "--runner=beam_ext.runner.SparkRunner"

_ONE_BUNDLE = (
    "Beam's test assumes one bundle holds all input (its own comment says so for "
    "test_constant_batch): non-stateful BatchElements batches within a bundle, and "
    "SparkRunner's bundles are per Spark task: here the input spreads over two tasks")
_ONE_PROCESS = (
    "the result depends on every step running in one Python process, as on DirectRunner: "
    "{}; SparkRunner runs the steps in several Spark Python workers")

# Each skip names the test and why; docs/runner.md lists them too.
SKIPPED_ON_SPARK = {
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


@pytest.fixture(autouse=True, scope="session")
def _beam_tests_on_spark(spark):
    previous = TestPipeline.pytest_test_pipeline_options
    TestPipeline.pytest_test_pipeline_options = SPARK_RUNNER_OPTIONS
    yield
    TestPipeline.pytest_test_pipeline_options = previous


def pytest_collection_modifyitems(config, items):
    """Of Beam's imported test classes, keep the runner-validation tests.

    Modules named ``test_validates_runner_*`` hold Beam's classes as they are
    (only ``it_validatesrunner`` tests run); ``test_fn_api_suite.py`` runs
    Beam's FnApiRunner suite on SparkRunner and ``test_beam_util_suite.py``
    Beam's util_test classes; both keep everything they collect.
    """
    kept, dropped = [], []
    for item in items:
        for name, reason in SKIPPED_ON_SPARK.items():
            if item.nodeid.endswith(name):
                item.add_marker(pytest.mark.skip(reason=reason))
        in_here = "beam_conformance" in str(item.fspath)
        if in_here and "test_validates_runner_" in item.fspath.basename:
            if item.get_closest_marker("it_validatesrunner") is None:
                dropped.append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
