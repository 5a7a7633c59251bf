"""Beam's ``apache_beam/io/parquetio_test.py`` (``TestParquet``) on SparkRunner.

Beam's ``TestPipeline()`` calls run on SparkRunner through the conftest.
``TestPipeline.run`` rebuilds the pipeline from its proto, so these run
Beam's own Parquet read and write on SparkRunner, not the native ones
(``tests/test_native_parquetio.py`` tests those).
Skips are in the conftest's ``SKIPPED_ON_SPARK``, each with its reason
(also in docs/runner.md). ``WriteStreamingTest`` is not included: it writes
from an unbounded TestStream, where the runner keeps Beam's own write.
"""
import pytest
from apache_beam.io.parquetio_test import TestParquet  # noqa: F401

pytestmark = pytest.mark.usefixtures("test_pipelines_on_spark")
