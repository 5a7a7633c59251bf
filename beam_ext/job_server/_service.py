"""Beam's JobService API, backed by SparkRunner on one SparkSession."""
from __future__ import annotations

import argparse
import functools
import logging

import grpc
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.runners.portability import local_job_service

from beam_ext.job_server._job import SparkBeamJob
from beam_ext.job_server._sdks import UnsupportedPipelineError
from beam_ext.runner.options import SparkRunnerOptions

_LOG = logging.getLogger("beam_ext.job_server")
# Options of the server's SparkSession, set on the server's command line: a
# job's own values cannot change a running session.
_SERVER_OPTIONS = frozenset(["spark_master", "spark_conf", "spark_app_name"])
_OPTION_TYPES = {int: beam_job_api_pb2.PipelineOptionType.INTEGER,
                 float: beam_job_api_pb2.PipelineOptionType.NUMBER}


class _Recorder:
    """Collects ``add_argument`` calls of a PipelineOptions class."""

    def __init__(self) -> None:
        self.arguments: list[tuple[str, dict]] = []

    def add_argument(self, flag: str, **kwargs) -> None:
        self.arguments.append((flag, kwargs))


def _describe_job_options() -> list:
    recorder = _Recorder()
    SparkRunnerOptions._add_argparse_args(recorder)
    described = []
    for flag, kwargs in recorder.arguments:
        name = flag.lstrip("-")
        if name in _SERVER_OPTIONS:
            continue
        if kwargs.get("action") == "store_true":
            kind = beam_job_api_pb2.PipelineOptionType.BOOLEAN
        else:
            kind = _OPTION_TYPES.get(kwargs.get("type"), beam_job_api_pb2.PipelineOptionType.STRING)
        default = kwargs.get("default")
        described.append(beam_job_api_pb2.PipelineOptionDescriptor(
            name=name, type=kind, description=kwargs.get("help", ""), group="SparkRunnerOptions",
            default_value="" if default is None else str(default).lower() if isinstance(default, bool)
            else str(default)))
    return described


class SparkJobServicer(local_job_service.LocalJobServicer):
    """Beam's JobService on Spark: ``PortableRunner --job_endpoint=HOST:PORT`` submits here.

    Jobs run in threads of this process on ``spark`` (a SparkSession or a
    SparkContext), one for all. Beam's ``LocalJobServicer`` provides the Job API and artifact
    staging; jobs are :class:`SparkBeamJob`. ``Prepare`` refuses, with
    status INVALID_ARGUMENT and a message naming the SDK or version, a
    pipeline this server cannot run.

    Example::

        servicer = SparkJobServicer(spark)
        port = servicer.start_grpc_server(8099)
        ...   # python my_pipeline.py --runner=PortableRunner --job_endpoint=localhost:8099
        servicer.stop()
    """

    def __init__(self, spark, host: str = "localhost", staging_dir: str | None = None) -> None:
        super().__init__(staging_dir=staging_dir, beam_job_type=functools.partial(SparkBeamJob, spark=spark))
        self._host = host
        runner_log = logging.getLogger("beam_ext")
        if runner_log.getEffectiveLevel() > logging.INFO:
            # Stage progress is logged at INFO: jobs' message streams carry it.
            runner_log.setLevel(logging.INFO)

    def get_service_address(self) -> str:
        return self._host

    def Prepare(self, request, context=None, timeout=None):
        before = set(self._jobs)
        try:
            return super().Prepare(request, context, timeout)
        except (UnsupportedPipelineError, ValueError) as e:
            for refused in set(self._jobs) - before:
                del self._jobs[refused]
            _LOG.warning("Refused job %r: %s", request.job_name, e)
            if context is None:
                raise
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"beam_ext job server: {e}")

    def GetJobMetrics(self, request, context=None):
        if request.job_id not in self._jobs:
            raise LookupError(f"Job {request.job_id} does not exist")
        result = self._jobs[request.job_id].result
        infos = [] if result is None else result.metrics().merged_user_monitoring_infos()
        return beam_job_api_pb2.GetJobMetricsResponse(
            metrics=beam_job_api_pb2.MetricResults(committed=infos, attempted=infos))

    def DescribePipelineOptions(self, request, context=None, timeout=None):
        return beam_job_api_pb2.DescribePipelineOptionsResponse(options=_describe_job_options())


def parse_server_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The job server's command line (see ``python -m beam_ext.job_server --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m beam_ext.job_server",
        description="Beam job server running Python pipelines on Spark through beam_ext's SparkRunner. "
        "Submit with --runner=PortableRunner --job_endpoint=HOST:PORT.")
    parser.add_argument("--port", type=int, default=8099, help="job service port (0: any free port)")
    parser.add_argument("--host", default="localhost",
                        help="interface to listen on, also given to clients as the artifact endpoint")
    parser.add_argument("--spark_master", default="local[*,4]",
                        help="Spark master URL of the server's SparkSession (local[N], spark://host:port, ...)")
    parser.add_argument("--spark_conf", action="append", default=None, metavar="KEY=VALUE",
                        help="Spark configuration of the server's SparkSession; repeatable")
    parser.add_argument("--staging_dir", default=None,
                        help="where staged artifacts go (default: a temporary directory)")
    return parser.parse_args(argv)
