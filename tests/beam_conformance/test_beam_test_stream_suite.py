"""Beam's ``apache_beam/testing/test_stream_test.py`` on ``SparkRunner --streaming``.

Beam's tests build ``TestPipeline(options=...)`` with ``--streaming``; the
conftest's ``test_pipelines_on_spark`` makes those run on SparkRunner too
(a ``TestPipeline`` given options would otherwise ignore the conftest's
default runner). Skips are in the conftest's ``SKIPPED_ON_SPARK``, each
with its reason (also in docs/runner.md).
"""
import pytest
from apache_beam.testing.test_stream_test import ReverseTestStreamTest, TestStreamTest  # noqa: F401

pytestmark = pytest.mark.usefixtures("test_pipelines_on_spark")
