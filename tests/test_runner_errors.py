"""Bad input, wrong options and user failures give errors naming the culprit."""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_ext.runner import PipelineError, SparkRunner, SparkUnavailableError, recommended_spark_conf
from beam_ext.runner.options import parse_spark_conf
from beam_ext.runner.session import _check_master_reachable, _local_driver_java_options


def test_spark_conf_entries_are_parsed_and_bad_ones_named():
    assert parse_spark_conf(["spark.a=1", "spark.b=x=y"]) == {"spark.a": "1", "spark.b": "x=y"}
    with pytest.raises(ValueError, match="--spark_conf expects KEY=VALUE, got 'oops'"):
        parse_spark_conf(["oops"])


@pytest.mark.parametrize("flag", [
    "--spark_parallelism=0", "--spark_parallelism=-3", "--spark_bundle_size=0",
    "--spark_bundle_size=-1", "--spark_state_memory=0", "--spark_state_memory=-5",
    "--spark_group_memory=0"])
def test_out_of_range_options_are_rejected_naming_the_flag(spark, flag):
    name, value = flag.split("=")
    with pytest.raises(ValueError, match=f"^{name} must be a positive integer, got {value}$"):
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([flag])) as p:
            _ = p | beam.Create([1, 2, 3]) | beam.Reshuffle()


def test_unreachable_master_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SparkUnavailableError, match=f"spark://127.0.0.1:{port}.*unreachable"):
        _check_master_reachable(f"spark://127.0.0.1:{port}")


def _boom(x):
    if x == 3:
        raise ValueError(f"bad element {x}")
    return x


def test_user_error_names_stage_and_shows_traceback(spark):
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create([1, 2, 3]) | "ExplodeOnThree" >> beam.Map(_boom)
    message = str(info.value)
    assert "ExplodeOnThree" in message          # the stage
    assert "ValueError: bad element 3" in message  # the user's error
    assert "_boom" in message                   # and where it came from


def _exit_on_three(x):
    if x == 3:
        os._exit(1)
    return x


def _kill_on_three(x):
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@pytest.mark.parametrize("die", [_exit_on_three, _kill_on_three], ids=["os._exit", "SIGKILL"])
def test_dead_python_worker_keeps_sparks_cause_and_names_the_steps(spark, die):
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create([1, 2, 3]) | "DieOnThree" >> beam.Map(die)
    message = str(info.value)
    assert "Python worker exited unexpectedly (crashed)" in message  # Spark's cause
    assert "'DieOnThree'" in message  # the user's step
    assert "ref_AppliedPTransform" not in message  # not the fused stage's id
    assert "collectAndServe" not in message


def test_default_local_master_retries_a_dead_worker_not_forever_a_user_error(tmp_path):
    job = os.path.join(os.path.dirname(__file__), "local_retry_job.py")
    done = subprocess.run([sys.executable, job, str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["master"] == "local[*,4]"
    # The runner's stages need only a SparkContext; a user's session is built on it.
    assert report["sql_session_started"] is False
    assert report["users_session"] == {"same_context": True, "count": 5}
    assert report["settings"] == recommended_spark_conf()  # a session the runner starts has them
    assert "-XX:TieredStopAtLevel=1" in report["java_options"].split()  # local: the quick compiler
    # Workers fork from the warm daemon the runner started beside the JVM,
    # also after one was killed, and Spark's stop ends it.
    assert report["worker_parents"] == [report["warm_daemon"]]
    assert report["warm_daemon_exit"] != "still running"
    assert report["killed"] and report["written"] == list(range(10))  # exact after a retry
    error = report["error"]
    assert error.startswith("Beam step 'FailOnThree' failed on Spark:")
    assert "ValueError: bad element 3" in error
    assert report["attempts"] == 4  # a deterministic failure is tried 4 times, no more


@pytest.mark.parametrize("user, expected", [
    ("", "-XX:TieredStopAtLevel=1"),
    ("-Xss4m", "-Xss4m -XX:TieredStopAtLevel=1"),
    ("-XX:TieredStopAtLevel=4", "-XX:TieredStopAtLevel=4"),  # the user's choice of compiler wins
    ("-Xss4m -XX:-TieredCompilation", "-Xss4m -XX:-TieredCompilation"),
])
def test_a_local_driver_runs_the_quick_compiler_unless_the_user_chose(user, expected):
    assert _local_driver_java_options(user) == expected


def test_runner_by_dotted_path_uses_the_active_session(spark, tmp_path):
    before = spark.sparkContext.applicationId
    options = PipelineOptions(["--runner=beam_ext.runner.SparkRunner"])
    out = tmp_path / "out"
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create(["x"]) | beam.io.WriteToText(str(out))
    assert type(p.runner).__name__ == "SparkRunner"
    assert spark.sparkContext.applicationId == before
    assert (tmp_path / "out-00000-of-00001").read_text() == "x\n"


def test_non_deterministic_key_coder_is_rejected(spark):
    class Unordered:
        pass

    with pytest.raises(Exception, match="deterministic"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = (p | beam.Create([1]) | beam.Map(lambda x: (Unordered(), x)).with_output_types(
                beam.typehints.Tuple[Unordered, int]) | beam.GroupByKey())


def test_sharded_batches_of_untyped_keys_run_as_on_the_direct_runner(spark, tmp_path):
    """Beam's ShardedKeyCoder has no deterministic form of its own: Beam's
    FnApiRunner refuses this pipeline, the DirectRunner runs it. SparkRunner
    codes the sharded key with its key's deterministic coder."""
    from pipeline_outputs import run_and_collect

    def build(p):
        return (p | beam.Create(range(4)) | beam.FlatMap(lambda s: [(s % 2, f"v{i}") for i in range(s * 10)])
                | beam.GroupIntoBatches.WithShardedKey(7) | beam.MapTuple(lambda k, vs: (k.key, len(vs)))
                | beam.CombinePerKey(sum))

    direct = run_and_collect(beam.runners.DirectRunner(), build, str(tmp_path / "direct"))
    assert run_and_collect(SparkRunner(), build, str(tmp_path / "spark")) == direct == [[0, 20], [1, 40]]


class _Opaque:
    """A key class Beam can pickle but not encode deterministically."""


def test_a_sharded_key_without_a_deterministic_encoding_is_rejected_naming_the_step(spark):
    with pytest.raises(Exception, match=r"deterministic.*Batches"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = (p | beam.Create([1]) | beam.Map(lambda x: (_Opaque(), x)).with_output_types(
                beam.typehints.Tuple[_Opaque, int]) | "Batches" >> beam.GroupIntoBatches.WithShardedKey(2))


def test_a_flatten_of_global_and_fixed_windows_is_refused_naming_it(spark):
    # Beam's Python SDK builds it; its output would read one input's windows
    # with the other's window coder (a global window's element came out as None).
    from apache_beam.transforms import window

    with pytest.raises(ValueError, match=r"Flatten 'Both': its input .*global_window.*interval_window"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            fixed = (p | "Fixed" >> beam.Create([("a", 1)]) | beam.Map(lambda kv: window.TimestampedValue(kv, 5))
                     | beam.WindowInto(window.FixedWindows(25)) | beam.GroupByKey())
            plain = p | "Plain" >> beam.Create([("c", [3])])
            _ = (fixed, plain) | "Both" >> beam.Flatten()


class _DeclaresUnknownNative(beam.PTransform):
    """A composite naming a URN the runner's table does not have."""

    def annotations(self):
        from beam_ext.transforms._native import native_annotations

        return {**super().annotations(), **native_annotations("beam_ext:no_such_native:v1", b"")}

    def expand(self, pcoll):
        return pcoll | beam.Map(lambda x: x * 2)


def test_a_declared_native_without_implementation_runs_its_expansion_and_says_so(spark, caplog):
    import logging

    from apache_beam.testing.util import assert_that, equal_to

    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            assert_that(p | beam.Create([1, 2]) | "Doubled" >> _DeclaresUnknownNative(),
                        equal_to([2, 4]))
    assert ("step 'Doubled': no Spark-native implementation of beam_ext:no_such_native:v1; "
            "running its Beam expansion") in caplog.text


@pytest.mark.parametrize("kwargs, message", [
    ({"spark_state_backend": "bogus"},
     "--spark_state_backend must be one of 'memory', 'spill', got 'bogus'"),
    ({"spark_parallelism": 2**31},
     f"--spark_parallelism must be at most {2**31 - 1} \\(Spark's partition count\\), got {2**31}"),
    ({"spark_conf": "spark.a=1"},
     "--spark_conf expects a list of KEY=VALUE entries, got the string 'spark.a=1'"),
], ids=["backend", "parallelism", "conf-string"])
def test_options_set_in_code_are_checked_before_spark_runs(spark, kwargs, message):
    # Options given as keyword arguments skip argparse's types and choices.
    with pytest.raises(ValueError, match=f"^{message}$"):
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(**kwargs)) as p:
            _ = p | beam.Create([("a", 1)]) | beam.GroupByKey()


class _FailsInSetup(beam.DoFn):
    def setup(self):
        raise ValueError("no connection in setup")

    def process(self, x):
        yield x


class _FailsInFinishBundle(beam.DoFn):
    def process(self, x):
        yield x

    def finish_bundle(self):
        raise ValueError("no flush in finish_bundle")


@pytest.mark.parametrize("fn, cause", [
    (_FailsInSetup, "ValueError: no connection in setup"),
    (_FailsInFinishBundle, "ValueError: no flush in finish_bundle"),
], ids=["setup", "finish_bundle"])
def test_errors_outside_process_name_the_step(spark, fn, cause):
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = (p | beam.Create([1, 2]) | "Before" >> beam.Map(abs)
                 | "Lifecycle" >> beam.ParDo(fn()) | "After" >> beam.Map(abs))
    message = str(info.value)
    assert message.startswith("Beam step 'Lifecycle' failed on Spark:")
    assert cause in message


def test_dead_worker_after_a_group_names_the_consumer(spark):
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = (p | beam.Create([(1, 1), (3, 3)]) | "Group" >> beam.GroupByKey()
                 | "DieAfterGroup" >> beam.MapTuple(lambda k, v: _kill_on_three(k)))
    message = str(info.value)
    assert "Python worker exited unexpectedly (crashed)" in message
    assert "'DieAfterGroup'" in message and "'Group'" not in message


def test_a_session_lacking_a_recommended_setting_is_told_which(spark, caplog, monkeypatch):
    from beam_ext.runner import session
    from beam_ext.runner.options import SparkRunnerOptions

    assert session.get_or_create_context(SparkRunnerOptions(), "x") is spark.sparkContext
    assert "recommended settings" not in caplog.text  # the test session has them
    monkeypatch.setattr(session, "recommended_spark_conf", lambda: {"spark.beam_ext.absent": "true"})
    with caplog.at_level(logging.INFO, logger="beam_ext.runner.session"):
        assert session.get_or_create_context(SparkRunnerOptions(), "x") is spark.sparkContext
    assert "spark.beam_ext.absent=true" in caplog.text
