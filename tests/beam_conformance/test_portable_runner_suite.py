"""Beam's PortableRunner test suite, submitted to beam_ext's job server.

``PortableRunnerTest`` is ``FnApiRunnerTest`` with every pipeline submitted
through ``PortableRunner`` to a job service: Beam starts its own
``LocalJobServicer``; the subclass below starts
:class:`beam_ext.job_server.SparkJobServicer` on the test session's
SparkSession instead, so each pipeline crosses the Job API (Prepare,
artifact staging, Run, state and message streams, metrics) and runs on
SparkRunner.

A test skipped on SparkRunner (``test_fn_api_suite._NOT_APPLICABLE``) is
skipped here for the same reason; ``_JOB_SERVER_SKIPS`` adds the job
server's own. The suite repeats what ``test_fn_api_suite.py`` runs on
SparkRunner directly, so only ``PORTABLE_DEFAULT`` runs by default: the rest
is marked ``slow_portable`` (deselected in pytest.ini; run it with
``pytest -m slow_portable tests/beam_conformance/test_portable_runner_suite.py``).
"""
from __future__ import annotations

import pytest
from apache_beam.runners.portability import portable_runner_test
from test_fn_api_suite import _NOT_APPLICABLE  # tests/beam_conformance is on sys.path

from beam_ext.job_server import SparkJobServicer
from beam_ext.runner.session import active_session

_JOB_SERVER_SKIPS: dict[str, str] = {}

# Pipelines that exercise the Job API's paths rather than SparkRunner's
# translation, which test_fn_api_suite.py covers test by test: plain
# transforms, side inputs, combining, windowing, timers, state, SDF, metrics through
# GetJobMetrics, a failure's message through the message stream, and
# PortableRunnerTest's own test.
PORTABLE_DEFAULT = frozenset([
    "test_create",
    "test_pardo_side_inputs",
    "test_combine_per_key",
    "test_windowing",
    "test_pardo_timers",
    "test_sdf",
    "test_metrics",
    "test_error_message_includes_stage",
    "test_pardo_state_with_custom_key_coder",
])


class SparkJobServerPortableSuite(portable_runner_test.PortableRunnerTest):
    @classmethod
    def _create_job_endpoint(cls):
        cls._servicer = SparkJobServicer(active_session())
        return f"localhost:{cls._servicer.start_grpc_server()}"

    @classmethod
    def tearDownClass(cls):
        if "_servicer" in cls.__dict__:
            cls._servicer.stop()
        super().tearDownClass()

    def setUp(self):
        reason = _NOT_APPLICABLE.get(self._testMethodName) or _JOB_SERVER_SKIPS.get(self._testMethodName)
        if reason:
            pytest.skip(reason)

