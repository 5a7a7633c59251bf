"""Beam's ``apache_beam/io/textio_test.py`` on SparkRunner.

Beam's ``TestPipeline()`` calls run on SparkRunner through the conftest
(``TestPipeline(options=...)`` through its ``test_pipelines_on_spark``).
Skips are in the conftest's ``SKIPPED_ON_SPARK``, each with its reason
(also in docs/runner.md). By default the tests that build no pipeline
(reader and sink unit tests) and the conftest's ``DATAFRAME_DEFAULT`` run;
the other pipeline tests are marked ``slow_dataframe``
(``pytest -m slow_dataframe tests/beam_conformance``).
"""
import pytest
from apache_beam.io.textio_test import (  # noqa: F401
    CsvTest,
    JsonTest,
    TextSinkTest,
    TextSourceTest,
    WriteStreamingTest,
)

pytestmark = pytest.mark.usefixtures("test_pipelines_on_spark")
