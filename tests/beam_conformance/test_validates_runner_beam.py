"""Beam's ``it_validatesrunner`` tests from the installed apache_beam, on SparkRunner.

Importing the test classes is enough for pytest to collect them; the
conftest keeps the ones marked ``it_validatesrunner`` and points
``TestPipeline`` at SparkRunner. Beam's util_test classes run whole in
``test_beam_util_suite.py``.
"""
import pytest
from apache_beam.metrics.metric_test import MetricsTest  # noqa: F401
from apache_beam.pipeline_test import DoFnTest, PipelineTest  # noqa: F401
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.transforms.combinefn_lifecycle_test import CombineFnLifecycleTest  # noqa: F401
from apache_beam.transforms.combiners_test import (  # noqa: F401
    CombineGloballyTest,
    CombinerWithSideInputs,
    CombineTest,
    CombineValuesTest,
    LatestTest,
    TimestampCombinerTest,
)
from apache_beam.transforms.deduplicate_test import DeduplicateTest  # noqa: F401
from apache_beam.transforms.dofn_lifecycle_test import DoFnLifecycleTest  # noqa: F401
from apache_beam.transforms.ptransform_test import DeadLettersTest, PTransformTest, TestGroupBy  # noqa: F401
from apache_beam.transforms.sideinputs_test import SideInputsTest  # noqa: F401


@pytest.mark.it_validatesrunner
def test_beam_test_pipelines_run_on_spark_runner():
    """Guards the whole module: Beam's TestPipeline must pick SparkRunner here."""
    assert type(TestPipeline().runner).__name__ == "SparkRunner"
