"""The job server: Beam's PortableRunner submits, SparkRunner runs on the session's SparkSession."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import apache_beam as beam
import grpc
import pytest
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc, beam_runner_api_pb2
from apache_beam.runners.portability.portable_runner import JobServiceHandle, PortableRunner
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import environments
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from beam_ext.job_server import SparkJobServicer, UnsupportedPipelineError, check_python_pipeline


@pytest.fixture(scope="module")
def endpoint(spark):
    servicer = SparkJobServicer(spark)
    port = servicer.start_grpc_server(0)
    yield f"localhost:{port}"
    servicer.stop()


def _options(endpoint: str, *flags: str) -> PipelineOptions:
    return PipelineOptions(["--runner=PortableRunner", f"--job_endpoint={endpoint}",
                            "--environment_type=LOOPBACK", *flags])


class _CountWords(beam.DoFn):
    def process(self, line):
        for word in line.split():
            Metrics.counter("words", "seen").inc()
            Metrics.distribution("words", "length").update(len(word))
            yield word


def _word_count(p, out: str):
    return (p | beam.Create(["a b", "b c c", "c"]) | beam.ParDo(_CountWords())
            | beam.combiners.Count.PerElement() | beam.MapTuple(lambda word, n: f"{word}:{n}")
            | beam.io.WriteToText(out, shard_name_template=""))


def _lines(path) -> list[str]:
    with open(path) as f:
        return sorted(f.read().split())


def _wait_terminal(result) -> str:
    while True:
        state = result.state
        if state in (PipelineState.DONE, PipelineState.FAILED, PipelineState.CANCELLED):
            return state
        time.sleep(0.2)


def _wait_running(result) -> None:
    while result.state != PipelineState.RUNNING:
        assert result.state not in (PipelineState.DONE, PipelineState.FAILED, PipelineState.CANCELLED)
        time.sleep(0.2)


def test_batch_pipeline_results_metrics_messages(endpoint, tmp_path):
    out = str(tmp_path / "counts")
    p = beam.Pipeline(options=_options(endpoint))
    _word_count(p, out)
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    assert _lines(out) == ["a:1", "b:2", "c:3"]
    metrics = result.metrics().query()
    assert [c.committed for c in metrics["counters"]] == [6]
    (length,) = metrics["distributions"]
    assert (length.committed.count, length.committed.sum, length.committed.max) == (6, 6, 1)
    texts = [m.message_response.message_text for m in result._messages if m.HasField("message_response")]
    assert any("Running" in t and "stages on Spark" in t for t in texts)
    assert any(t.startswith("stage 1/") for t in texts)
    states = [m.state_response.state for m in result._messages if m.HasField("state_response")]
    s = beam_job_api_pb2.JobState
    assert states == [s.STOPPED, s.STARTING, s.RUNNING, s.DONE]


def _fail(word):
    raise ValueError(f"no such word: {word}")


def test_failing_pipeline_reports_failed_with_the_error(endpoint):
    p = beam.Pipeline(options=_options(endpoint))
    p | beam.Create(["x"]) | beam.Map(_fail)
    result = p.run()
    with pytest.raises(RuntimeError, match="no such word: x"):
        result.wait_until_finish()
    assert result.state == PipelineState.FAILED


def test_cancel_streaming_pipeline(endpoint):
    p = beam.Pipeline(options=_options(endpoint, "--streaming"))
    p | PeriodicImpulse(fire_interval=0.5) | beam.Map(lambda t: t)
    result = p.run()
    _wait_running(result)
    result.cancel()
    assert _wait_terminal(result) == PipelineState.CANCELLED


def _slow(x):
    time.sleep(3)
    return x


def test_cancel_batch_pipeline(endpoint):
    p = beam.Pipeline(options=_options(endpoint))
    # About ten minutes of sleeping on two tasks, unless cancelled.
    p | beam.Create(list(range(400))) | beam.Reshuffle() | beam.Map(_slow)
    result = p.run()
    _wait_running(result)
    result.cancel()
    assert _wait_terminal(result) == PipelineState.CANCELLED


def _python_proto():
    p = beam.Pipeline()
    p | beam.Create([1]) | beam.Map(str)
    return p.to_runner_api(default_environment=environments.DockerEnvironment(
        environments.DockerEnvironment.default_docker_image(),
        capabilities=environments.python_sdk_docker_capabilities()))


def _as_java(proto):
    image = "apache/beam_java17_sdk:2.77.0"
    for env in proto.components.environments.values():
        env.CopyFrom(beam_runner_api_pb2.Environment(
            urn=common_urns.environments.DOCKER.urn,
            payload=beam_runner_api_pb2.DockerPayload(container_image=image).SerializeToString(),
            capabilities=[environments.SDK_VERSION_CAPABILITY_PREFIX + image]))
    return proto


def _prepare(endpoint: str, proto, options: PipelineOptions):
    stub = beam_job_api_pb2_grpc.JobServiceStub(grpc.insecure_channel(endpoint))
    return JobServiceHandle(stub, options).prepare(proto)


def test_java_pipeline_is_refused_at_prepare(endpoint):
    with pytest.raises(grpc.RpcError) as refused:
        _prepare(endpoint, _as_java(_python_proto()), PipelineOptions())
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "of the Java SDK" in refused.value.details()
    assert "runs Python steps only" in refused.value.details()


def test_pipeline_of_another_beam_version_is_refused():
    proto = _python_proto()
    for env in proto.components.environments.values():
        env.capabilities[:] = [c for c in env.capabilities
                               if not c.startswith(environments.SDK_VERSION_CAPABILITY_PREFIX)]
        env.capabilities.append(environments.SDK_VERSION_CAPABILITY_PREFIX + "apache/beam_python3.9_sdk:2.50.0")
    with pytest.raises(UnsupportedPipelineError, match="built with Beam 2.50.0 on Python 3.9"):
        check_python_pipeline(proto)


def test_python_docker_environment_runs_embedded():
    notes = check_python_pipeline(_python_proto())
    assert notes and "is not started: its steps run in Spark's Python workers" in notes[0]


def test_invalid_runner_option_is_refused_at_prepare(endpoint):
    proto = PortableRunner.get_proto_pipeline(beam.Pipeline(), PipelineOptions())
    with pytest.raises(grpc.RpcError, match="--spark_bundle_size must be a positive integer"):
        _prepare(endpoint, proto, PipelineOptions(["--spark_bundle_size=0"]))


def test_job_server_command(tmp_path):
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "beam_ext.job_server", f"--port={port}",
                               "--spark_master=local[1]", "--spark_conf=spark.ui.enabled=false"],
                              env=os.environ.copy())
    try:
        endpoint = f"localhost:{port}"
        _wait_for_server(endpoint, server)
        out = str(tmp_path / "counts")
        # The default environment: Beam's Python SDK container, run embedded.
        p = beam.Pipeline(options=PipelineOptions(["--runner=PortableRunner", f"--job_endpoint={endpoint}"]))
        _word_count(p, out)
        assert p.run().wait_until_finish() == PipelineState.DONE
        assert _lines(out) == ["a:1", "b:2", "c:3"]
    finally:
        server.terminate()
        server.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _wait_for_server(endpoint: str, server: subprocess.Popen) -> None:
    stub = beam_job_api_pb2_grpc.JobServiceStub(grpc.insecure_channel(endpoint))
    while True:
        assert server.poll() is None, "the job server exited"
        try:
            stub.GetState(beam_job_api_pb2.GetJobStateRequest(job_id="[none]"))
            return
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                return
        time.sleep(0.5)
