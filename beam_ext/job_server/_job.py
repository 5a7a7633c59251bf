"""One submitted pipeline: run by SparkRunner in a thread, watched through Beam's Job API."""
from __future__ import annotations

import logging
import threading
import time
import traceback

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_job_api_pb2, beam_runner_api_pb2
from apache_beam.runners.job import utils as job_utils
from apache_beam.runners.portability import local_job_service
from apache_beam.runners.runner import PipelineState

from beam_ext.job_server._sdks import check_python_pipeline
from beam_ext.runner import SparkRunner
from beam_ext.runner.options import SparkRunnerOptions, check_options

_LOG = logging.getLogger("beam_ext.job_server")
_STATES = {PipelineState.DONE: beam_job_api_pb2.JobState.DONE,
           PipelineState.FAILED: beam_job_api_pb2.JobState.FAILED,
           PipelineState.CANCELLED: beam_job_api_pb2.JobState.CANCELLED}
# The Python SDK stages this record of the client's packages with every job.
_SUBMISSION_RECORD = "submission_environment_dependencies.txt"
# Seconds between two checks of a streaming job for a cancel request, and
# between two cancels of a batch job's Spark jobs (a stage may start after one).
_POLL = 0.2


class _JobLogHandler(local_job_service.JobLogHandler):
    """Beam's handler, for the job's thread and the threads it starts (a streaming loop)."""

    def __init__(self, log_queues) -> None:
        super().__init__(log_queues)
        self.threads: set[threading.Thread] = set()

    def __enter__(self):
        self.threads.add(threading.current_thread())
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *args):
        logging.getLogger().removeHandler(self)
        self.threads.clear()
        self.close()

    def emit(self, record) -> None:
        if threading.current_thread() in self.threads:
            self._logged_thread = threading.current_thread()
            super().emit(record)


class SparkBeamJob(local_job_service.BeamJob):
    """A pipeline submitted to the job server, run on the server's Spark context.

    ``prepare`` refuses pipelines with steps of another SDK, Beam or Python
    version, and invalid runner options; ``run`` starts SparkRunner in a
    thread under a Spark job group named after the job, so ``cancel`` can
    stop a batch job's Spark jobs; a streaming job stops after its
    micro-batch under way.
    """

    def __init__(self, *args, spark=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._sc = getattr(spark, "sparkContext", spark)  # a SparkSession's, or a SparkContext
        self._notes: list[str] = []
        self._cancel_requested = threading.Event()
        self._finished = threading.Event()

    def pipeline_options(self) -> PipelineOptions:
        # from_dictionary parses the values as the client's flags were
        # (the Job API carries integers as strings).
        options = job_utils.struct_to_dict(self._pipeline_options)
        return PipelineOptions.from_dictionary({
            key[len("beam:option:"):-len(":v1")]: value for key, value in options.items()
            if key.startswith("beam:option:") and key.endswith(":v1")})

    def prepare(self) -> None:
        self._notes = check_python_pipeline(self._pipeline_proto)
        check_options(self.pipeline_options().view_as(SparkRunnerOptions))

    def run(self) -> None:
        self.set_state(beam_job_api_pb2.JobState.STARTING)
        self._run_thread = threading.Thread(target=self._run_job, name=f"beam_ext-job-{self._job_id}",
                                            daemon=True)
        self._run_thread.start()

    def _run_job(self) -> None:
        with _JobLogHandler(self._log_queues) as log_handler:
            try:
                self._update_dependencies()
                self._log_environment()
                self.set_state(beam_job_api_pb2.JobState.RUNNING)
                start = time.monotonic()
                state = self._run_on_spark(log_handler)
                _LOG.info("Job %s ended in %.2fs with state %s", self._job_id, time.monotonic() - start,
                          beam_job_api_pb2.JobState.Enum.Name(state))
                self.set_state(state)
            except Exception:  # noqa: BLE001 - every failure reaches the client as FAILED
                if self._cancel_requested.is_set():
                    _LOG.info("Job %s cancelled", self._job_id)
                    self.set_state(beam_job_api_pb2.JobState.CANCELLED)
                else:
                    _LOG.exception("Job %s failed", self._job_id)
                    # The client raises the last error message as the pipeline's error.
                    self._log_queues.put(beam_job_api_pb2.JobMessage(
                        message_id=log_handler._next_id(), time=time.strftime("%Y-%m-%d %H:%M:%S."),
                        importance=beam_job_api_pb2.JobMessage.JOB_MESSAGE_ERROR,
                        message_text=traceback.format_exc()))
                    self.set_state(beam_job_api_pb2.JobState.FAILED)
            finally:
                self._finished.set()

    def _run_on_spark(self, log_handler: _JobLogHandler) -> int:
        sc = self._sc
        # A job group is a property of this thread: it tags every Spark job
        # the batch executor starts here, so cancel() can stop them.
        sc.setJobGroup(self._job_id, f"Beam job {self._job_name}", interruptOnCancel=False)
        self.result = SparkRunner().run_proto(self._pipeline_proto, self.pipeline_options())
        streaming_thread = getattr(self.result, "_thread", None)
        if streaming_thread is not None:
            log_handler.threads.add(streaming_thread)
            while self.result.wait_until_finish(duration=_POLL * 1000) == PipelineState.RUNNING:
                if self._cancel_requested.is_set():
                    _LOG.info("Cancelling: stopping after the micro-batch under way")
                    self.result.cancel()
                    break
        return _STATES.get(self.result.state, beam_job_api_pb2.JobState.UNSPECIFIED)

    def _log_environment(self) -> None:
        for note in self._notes:
            _LOG.info(note)
        staged = sorted({_staged_name(dep) for env in self._pipeline_proto.components.environments.values()
                         for dep in env.dependencies} - {None, _SUBMISSION_RECORD})
        if staged:
            _LOG.warning("Staged files are not installed: Spark's Python workers use the job server's "
                         "Python environment. Install these where the job server and its executors run: %s",
                         ", ".join(staged))

    def cancel(self):
        if self.is_terminal_state(self.state):
            return self.state
        self.set_state(beam_job_api_pb2.JobState.CANCELLING)
        self._cancel_requested.set()
        if self.state == beam_job_api_pb2.JobState.CANCELLING and self._run_thread_started():
            threading.Thread(target=self._cancel_spark_jobs, daemon=True,
                             name=f"beam_ext-cancel-{self._job_id}").start()
        else:
            self.set_state(beam_job_api_pb2.JobState.CANCELLED)
        return self.state

    def _run_thread_started(self) -> bool:
        return getattr(self, "_run_thread", None) is not None

    def _cancel_spark_jobs(self) -> None:
        # A batch job runs a Spark job per collected side input and one at the
        # end: cancelling the group stops the one under way, and repeating
        # catches one started meanwhile.
        # A streaming job's loop reads the request between micro-batches.
        while not self._finished.wait(_POLL):
            if self.result is None:
                self._sc.cancelJobGroup(self._job_id)


def _staged_name(dep: beam_runner_api_pb2.ArtifactInformation) -> str | None:
    if dep.role_urn != common_urns.artifact_roles.STAGING_TO.urn:
        return None
    return beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dep.role_payload).staged_name
