"""Streaming on SparkRunner survives a killed driver and a killed Python worker.

The jobs run in processes of their own (``streaming_fault_job.py``): the
driver is killed with ``kill -9`` together with the JVM it started, then
started again on the same ``--checkpoint_dir``; or one of its Spark Python
workers kills itself mid-stream and Spark retries the task. Either way the
files written must be exactly the DirectRunner's: nothing lost, nothing
duplicated, no pane computed from lost or twice-applied state.
"""
from __future__ import annotations

import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid

import apache_beam as beam
import pytest
import streaming_fault_job as job
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

from beam_ext.runner import SparkRunner
from beam_ext.runner.executors._commit_log import CheckpointMismatch

_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "streaming_fault_job.py")
_COMMIT = re.compile(r"^(\d+)\.commit$")
_SPARK_ARGS = ["--runner=beam_ext.runner.SparkRunner", "--spark_conf=spark.ui.enabled=false",
               "--spark_conf=spark.ui.showConsoleProgress=false"]

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the job's processes in /proc")


@pytest.fixture(scope="module")
def direct_outputs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("direct")
    with beam.Pipeline(runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])) as p:
        job.build(p, str(out))
    outputs = job.read_outputs(str(out))
    # The stream has early, on-time and late panes and timer flushes: a test that can fail.
    assert {pane[2] for name, pane in outputs.items() if not name.startswith("flush")} == {0, 1, 2}
    return outputs


def _job_env(token: str) -> dict:
    # Every process the job starts (JVM, PySpark daemon, Python workers)
    # inherits the token, which is how the test finds them after the kill.
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", BEAM_EXT_FAULT_RUN=token)


def _processes_of(token: str) -> list[int]:
    needle = f"BEAM_EXT_FAULT_RUN={token}".encode()
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _has_token(int(entry), needle)]


def _has_token(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False  # gone, or a zombie


def _kill_processes_of(token: str) -> list[int]:
    """Kills what is left of the run; a pid reused meanwhile by another process is spared."""
    needle = f"BEAM_EXT_FAULT_RUN={token}".encode()
    killed = []
    for pid in _processes_of(token):
        try:
            handle = os.pidfd_open(pid)  # pins the process: its pid cannot name another one now
        except ProcessLookupError:
            continue
        try:
            if _has_token(pid, needle):
                signal.pidfd_send_signal(handle, signal.SIGKILL)
                killed.append(pid)
        except ProcessLookupError:
            pass
        finally:
            os.close(handle)
    return killed


def _committed(checkpoint: str) -> int:
    try:
        names = os.listdir(os.path.join(checkpoint, "commits"))
    except FileNotFoundError:
        return -1
    return max((int(m.group(1)) for m in map(_COMMIT.match, names) if m), default=-1)


def _uncommitted_versions(checkpoint: str) -> bool:
    """Whether a task wrote state for a batch the driver has not committed yet."""
    committed = _committed(checkpoint)
    for _, _, names in os.walk(os.path.join(checkpoint, "state")):
        if any(name.endswith(".bin") and int(name[:-4]) > committed for name in names):
            return True
    return False


def _run_job(args: list[str], token: str, log) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, _JOB, *args], env=_job_env(token), stdout=log,
                          stderr=subprocess.STDOUT, timeout=600, check=False)


def _tail(path) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()[-4000:]


# The spill backend's run is the stricter one: besides the commit log's
# versions it has LMDB segments a restart must not read. The memory
# backend's (the default) resumes from a checkpoint in
# test_checkpoint_dir_that_cannot_be_written_is_named_and_a_freed_one_resumes
# by default; its killed driver runs with ``-m slow_streaming`` (38 s).
@pytest.mark.slow  # two JVMs of its own and ~15 micro-batches
@pytest.mark.parametrize("backend", [pytest.param("memory", marks=pytest.mark.slow_streaming), "spill"])
def test_killed_driver_resumes_from_its_checkpoint_with_nothing_lost_or_duplicated(spark, tmp_path, direct_outputs,
                                                                                   backend):
    # On spill, the kill lands after tasks flushed their segments into LMDB
    # and wrote versions naming them, before the commit: the restart must
    # read the committed version's segments only and collect the others.
    out, checkpoint, log_path = tmp_path / "out", str(tmp_path / "ckpt"), tmp_path / "job.log"
    out.mkdir()
    args = [str(out), *_SPARK_ARGS, "--spark_master=local[2]", f"--checkpoint_dir={checkpoint}",
            f"--spark_state_backend={backend}"]
    kill_after = random.Random(2024).randint(2, 9)
    token = uuid.uuid4().hex
    with open(log_path, "w") as log:
        # A session of its own: kill -9 reaches the driver and the JVM it launched.
        first = subprocess.Popen([sys.executable, _JOB, *args], env=_job_env(token), stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # Killed mid-batch: after tasks wrote their state versions, before the commit.
            while _committed(checkpoint) < kill_after or not _uncommitted_versions(checkpoint):
                assert first.poll() is None, f"the job ended before batch {kill_after}:\n{_tail(log_path)}"
                time.sleep(0.02)
        finally:
            if first.returncode is None:  # not reaped yet, so its pid still names its process group
                os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    # PySpark's daemon leads a process group of its own and takes its
    # workers down when the JVM's pipe closes: wait until every process of
    # the run is gone, so none can write into the checkpoint after the restart.
    deadline = time.monotonic() + 120
    while _processes_of(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _kill_processes_of(token), "processes of the killed job outlived it"
    killed_at = _committed(checkpoint)
    assert killed_at >= kill_after
    if backend == "spill":  # the state the restart resumes from is in LMDB
        assert glob.glob(os.path.join(checkpoint, "state", "*", "*", "spill", "data.mdb"))
    assert job.read_outputs(str(out)) != direct_outputs  # killed mid-stream

    # Another pipeline on this checkpoint is refused, and leaves it as it was.
    other = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        ["--streaming", f"--checkpoint_dir={checkpoint}"]))
    job.build(other, str(tmp_path / "other"))
    _ = other | "Extra" >> beam.Create([1])
    with pytest.raises(CheckpointMismatch, match=re.escape(checkpoint)):
        other.run()
    assert _committed(checkpoint) == killed_at

    with open(log_path, "a") as log:
        second = _run_job(args, uuid.uuid4().hex, log)
    assert second.returncode == 0, _tail(log_path)
    assert f"resuming after committed batch {killed_at}" in _tail(log_path)
    assert job.read_outputs(str(out)) == direct_outputs


@pytest.mark.slow  # a JVM of its own and ~15 micro-batches
def test_python_worker_killed_mid_stream_is_retried_to_the_exact_output(tmp_path, direct_outputs):
    out, marker, log_path = tmp_path / "out", tmp_path / "killed", tmp_path / "job.log"
    out.mkdir()
    args = [str(out), *_SPARK_ARGS, "--spark_master=local[2,4]", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            f"--kill_marker={marker}"]
    with open(log_path, "w") as log:
        done = _run_job(args, uuid.uuid4().hex, log)
    assert done.returncode == 0, _tail(log_path)
    assert marker.exists()  # a worker did die
    assert job.read_outputs(str(out)) == direct_outputs



def _mount_namespace() -> list[str]:
    """``unshare`` in a private mount namespace (as root, or mapped to root), or skip."""
    command = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        command.insert(1, "--map-root-user")
    try:
        probe = subprocess.run([*command, "mount", "-t", "tmpfs", "tmpfs", "/mnt"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("unshare is not available")
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace: {probe.stderr.decode(errors='replace')}")
    return command


_MOUNT_AND_RUN = """
mount -t tmpfs -o ro,size=1m tmpfs "$1" &&
mount -t tmpfs -o size=128k tmpfs "$2" && { cat /dev/zero > "$2/filler" 2>/dev/null; true; } &&
mount -t tmpfs -o size=4m tmpfs "$3" &&
exec "$5" "$6" "$1" "$2" "$3" "$4"
"""


@pytest.mark.slow  # a JVM of its own and ~25 micro-batches
def test_checkpoint_dir_that_cannot_be_written_is_named_and_a_freed_one_resumes(tmp_path, direct_outputs):
    namespace = _mount_namespace()
    mounts = [tmp_path / name for name in ("read_only", "full", "fills")]
    for mount in mounts:
        mount.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    job_path = os.path.join(os.path.dirname(_JOB), "checkpoint_dir_job.py")
    done = subprocess.run([*namespace, "sh", "-c", _MOUNT_AND_RUN, "sh", *map(str, mounts), str(out),
                           sys.executable, job_path], env=_job_env(uuid.uuid4().hex), capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    read_only, full = report["read_only"], report["full"]
    assert read_only["error"] == "CheckpointUnwritable", read_only
    assert str(mounts[0] / "ckpt") in read_only["message"] and "Read-only file system" in read_only["message"]
    assert full["error"] == "CheckpointUnwritable", full
    assert str(mounts[1] / "ckpt") in full["message"] and "No space left on device" in full["message"]
    fills = report["fills"]
    assert fills["error"] is not None and fills["commits"], fills  # failed mid-stream
    assert str(mounts[2] / "ckpt") in fills["message"] and "No space left on device" in fills["message"], fills
    assert report["after_freeing"]["error"] is None, report["after_freeing"]
    assert job.read_outputs(str(out)) == direct_outputs



def test_every_planning_numbers_the_stages_of_a_pipeline_alike():
    # A restarted driver finds its stages' state under their numbers. Beam's
    # own order depends on where the planner's objects sit in memory: it
    # differs between processes, and between plannings in one process too.
    from apache_beam.transforms import environments

    from beam_ext.runner.planning import plan_pipeline

    orders = set()
    for _ in range(8):
        p = beam.Pipeline(options=PipelineOptions(["--streaming"]))
        job.build(p, "unused")
        proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
        plan = plan_pipeline(proto, 1 << 20, 2, "memory", 1 << 20, streaming=True)
        orders.add(tuple(stage.name for stage in plan.stages))
    assert len(orders) == 1 and len(next(iter(orders))) == 4

def _write_version(root: str, state: dict) -> None:
    from beam_ext.runner.state import _versioned as versioned

    versioned.write(root, "stage3", 0, 5, state)


def test_a_state_version_rewritten_by_another_worker_is_read_as_rewritten(tmp_path):
    # A task writes batch 5's state and its batch fails elsewhere; the batch
    # runs again and another Python worker writes batch 5 anew, from other
    # input (processing time, a lookup). The first worker must not hand out
    # the copy it kept in memory when it next runs that partition.
    import multiprocessing

    from beam_ext.runner.state import _versioned as versioned

    root = str(tmp_path)
    _write_version(root, {"attempt": 1})
    other = multiprocessing.get_context("fork").Process(target=_write_version, args=(root, {"attempt": 2}))
    other.start()
    other.join()
    assert other.exitcode == 0
    assert versioned.read(root, "stage3", 0, 5) == {"attempt": 2}
