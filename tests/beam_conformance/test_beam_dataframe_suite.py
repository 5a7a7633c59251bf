"""Beam's ``apache_beam/dataframe/transforms_test.py`` on SparkRunner.

Beam's tests build ``beam.Pipeline()``, which runs on Beam's default
runner (DirectRunner); the conftest's ``pipelines_on_spark`` fixture makes
that default SparkRunner. ``TransformTest`` checks each pandas operation on
a deferred DataFrame against pandas itself, ``TransformPartsTest`` the
re-batching step of ``DataframeTransform``. ``FusionTest`` is left out: it
pins ``beam.Pipeline('FnApiRunner')`` and counts FnApiRunner's fused stages.
By default the conftest's ``DATAFRAME_DEFAULT`` tests run; the others are
marked ``slow_dataframe`` (``pytest -m slow_dataframe tests/beam_conformance``).
"""
import pytest
from apache_beam.dataframe.transforms_test import TransformPartsTest, TransformTest  # noqa: F401

pytestmark = pytest.mark.usefixtures("pipelines_on_spark")
