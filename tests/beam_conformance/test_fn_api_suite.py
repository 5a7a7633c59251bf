"""Beam's FnApiRunner test suite, run on SparkRunner.

``FnApiRunnerTest`` is how Beam checks its own portable runner: ParDo, side
inputs, state, timers, SDF, windowing, metrics, flatten, combiners... The
subclass below runs every one of its tests through SparkRunner instead.
Tests that check FnApiRunner internals rather than Beam semantics are listed
in ``_NOT_APPLICABLE`` with the reason (also in docs/runner.md).
"""
import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import fn_runner_test

from beam_ext.runner import SparkRunner

_NOT_APPLICABLE: dict[str, str] = {}


class SparkRunnerFnApiSuite(fn_runner_test.FnApiRunnerTest):
    def create_pipeline(self, is_drain=False):
        return beam.Pipeline(runner=SparkRunner())

    def setUp(self):
        reason = _NOT_APPLICABLE.get(self._testMethodName)
        if reason:
            pytest.skip(reason)
