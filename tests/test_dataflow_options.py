"""Dataflow's pipeline options on SparkRunner: the mapping, the report, the
options that must fail, the dependency cache, and one Dataflow command line
run end to end on local Spark in its own process."""
from __future__ import annotations

import glob
import json
import logging
import os
import subprocess
import sys

import apache_beam as beam
import pytest
from _user_packages import write_package
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_ext.runner import SparkRunner, _dependencies
from beam_ext.runner.dataflow_options import (
    DataflowOptionError,
    _unmapped,
    machine_resources,
    map_dataflow_options,
)

_DATAFLOW_ARGS = ["--project", "p", "--region", "r", "--job_name", "j", "--num_workers", "3",
                  "--max_num_workers", "5", "--autoscaling_algorithm", "THROUGHPUT_BASED",
                  "--worker_machine_type", "n1-standard-4", "--experiments", "use_runner_v2",
                  "--service_account_email", "x@y"]
_IGNORED = ["--project", "--region", "--experiments", "--service_account_email"]


def _report(args):
    return map_dataflow_options(PipelineOptions(args))


def test_every_dataflow_option_has_a_meaning_or_a_reason():
    assert _unmapped() == set()


@pytest.mark.parametrize("machine, expected", [
    ("n1-standard-4", (4, 15360)), ("n1-highmem-2", (2, 13312)), ("n1-highcpu-16", (16, 14746)),
    ("e2-highmem-8", (8, 65536)), ("n2-standard-32", (32, 131072)), ("c2d-highcpu-4", (4, 8192)),
    ("custom-6-23040", (6, 23040)), ("n2-custom-2-4096", (2, 4096)),
    ("e2-medium", None), ("f1-micro", None), ("n1-standard-", None), ("a2-highgpu-1g", None)])
def test_machine_resources(machine, expected):
    assert machine_resources(machine) == expected


def test_dataflow_command_line_maps_to_spark_conf():
    report = _report(_DATAFLOW_ARGS)
    assert report.app_name == "j"
    assert report.spark_conf == {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "1",
        "spark.dynamicAllocation.initialExecutors": "3",
        "spark.dynamicAllocation.maxExecutors": "5",
        "spark.executor.cores": "4",
        "spark.executor.memory": "7680m",
        "spark.executor.memoryOverhead": "6144m"}
    assert sorted(m.option for m in report.ignored) == sorted(_IGNORED)
    assert report.unsupported == ()


def test_only_options_the_user_set_are_reported():
    assert _report([]).mappings == ()
    # Set to their defaults: nothing to report either.
    assert _report(["--pickle_library=default", "--no_save_main_session"]).mappings == ()
    assert [m.option for m in _report(["--label", "a=b"]).mappings] == ["--label"]


def test_fixed_workers_and_harness_threads():
    report = _report(["--num_workers=4", "--autoscaling_algorithm=NONE",
                      "--worker_machine_type=e2-highmem-8", "--number_of_worker_harness_threads=2"])
    assert report.spark_conf == {"spark.executor.instances": "4", "spark.dynamicAllocation.enabled": "false",
                                 "spark.executor.memory": "32768m", "spark.executor.memoryOverhead": "26214m",
                                 "spark.executor.cores": "2"}


def test_underivable_machine_type_is_reported():
    report = _report(["--worker_machine_type=e2-small"])
    assert report.spark_conf == {}
    assert [(m.option, m.kind) for m in report.mappings] == [("--worker_machine_type", "ignored")]


def test_explicit_spark_conf_wins():
    report = _report(["--num_workers=3", "--autoscaling_algorithm=NONE",
                      "--spark_conf=spark.executor.instances=7", "--spark_app_name=mine", "--job_name=j"])
    assert report.spark_conf == {"spark.dynamicAllocation.enabled": "false"}
    assert report.overridden == {"spark.executor.instances": ("3", "7")}
    assert report.app_name is None


@pytest.mark.parametrize("flag", ["--update", "--template_location=gs://b/t", "--dataflow_job_file=/tmp/j",
                                  "--create_from_snapshot=s"])
def test_options_that_would_change_results_fail_by_name(flag):
    with pytest.raises(DataflowOptionError, match=flag.split("=")[0]):
        _report([flag]).raise_unsupported()


def test_unsupported_option_fails_the_pipeline_before_it_runs(spark, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(DataflowOptionError, match="--template_location"):
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
                ["--template_location=gs://b/t"])) as p:
            p | beam.Create([1]) | beam.Map(str) | beam.io.WriteToText(str(out))
    assert not glob.glob(str(out) + "*")


def test_running_session_reports_what_it_could_not_apply(spark, caplog):
    caplog.set_level(logging.INFO, logger="beam_ext.runner")
    with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
            ["--num_workers=2", "--autoscaling_algorithm=NONE", "--zone=z"])) as p:
        assert_that(p | beam.Create([1, 2]) | beam.Map(lambda x: x * 10), equal_to([10, 20]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warnings if "no meaning on Spark" in w] == [
        "Dataflow options with no meaning on Spark, ignored: --zone (Spark does not create worker VMs: "
        "the cluster's executors are what they are)"]
    (not_applied,) = [w for w in warnings if "already running" in w]
    assert "--num_workers, --autoscaling_algorithm could not be applied" in not_applied
    assert "spark.executor.instances=2" in not_applied


def test_dependencies_are_built_once_per_content(tmp_path):
    setup_py = write_package(tmp_path / "src", "cachedpkg")
    options = PipelineOptions([f"--setup_file={setup_py}", f"--staging_location={tmp_path / 'staging'}"])
    first = _dependencies.build(options)
    assert first.startswith(str(tmp_path / "staging" / "beam_ext-deps"))
    built_at = os.stat(first).st_mtime_ns
    assert _dependencies.build(options) == first
    assert os.stat(first).st_mtime_ns == built_at
    (setup_py.parent / "cachedpkg" / "__init__.py").write_text("NAME = 'changed'\n")
    second = _dependencies.build(options)
    assert second != first
    import zipfile

    with zipfile.ZipFile(second) as z:
        assert z.read("cachedpkg/__init__.py") == b"NAME = 'changed'\n"


def test_missing_dependency_file_is_named(tmp_path):
    with pytest.raises(_dependencies.DependencyError, match="--requirements_file"):
        _dependencies.build(PipelineOptions([f"--requirements_file={tmp_path / 'nope.txt'}"]))


def test_a_package_pip_cannot_install_is_named(tmp_path):
    broken = tmp_path / "broken.whl"
    broken.write_bytes(b"not a wheel")
    with pytest.raises(_dependencies.DependencyError, match="--extra_package"):
        _dependencies.build(PipelineOptions([f"--extra_package={broken}",
                                             f"--staging_location={tmp_path / 's'}"]))


def _run_job(out, sys_path, modules, args, env=None):
    job = os.path.join(os.path.dirname(__file__), "dataflow_job.py")
    return subprocess.run([sys.executable, job, str(out), sys_path, modules,
                           "--runner=beam_ext.runner.SparkRunner", *args],
                          env=env or dict(os.environ, PYSPARK_PYTHON=sys.executable),
                          capture_output=True, text=True, timeout=900)


def _results(out):
    rows = []
    for path in glob.glob(str(out) + "-*"):
        with open(path) as f:
            rows += [line.strip() for line in f]
    return sorted(rows)


def test_dataflow_command_line_on_local_spark(tmp_path):
    """The whole Dataflow command line, in its own process (tests share one
    session): Spark conf, one warning naming each ignored option once, the
    --setup_file package and the main session on the executors."""
    setup_py = write_package(tmp_path / "src", "userpkg", with_dofn=True)
    temp = tmp_path / "temp"
    out = tmp_path / "out"
    done = _run_job(out, str(setup_py.parent), "userpkg", [
        "--spark_master=local[2]", *_DATAFLOW_ARGS, "--temp_location", str(temp),
        "--setup_file", str(setup_py), "--pickle_library=dill", "--save_main_session"])
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(row[len("main:"):]) for row in _results(out)]
    assert [element for element, _ in rows] == ["a", "b", "c"]
    # Built under --temp_location (no --staging_location), and what executors imported.
    (built,) = glob.glob(str(temp / "beam_ext-deps" / "*" / "beam_ext_deps-*.zip"))
    for _, files in rows:
        assert files["userpkg"].endswith(os.path.join(os.path.basename(built), "userpkg", "__init__.py"))
    with open(str(out) + ".conf.json") as f:
        conf = json.load(f)
    assert conf["spark.app.name"] == "j"
    for key, value in {"spark.dynamicAllocation.enabled": "true",
                       "spark.dynamicAllocation.initialExecutors": "3",
                       "spark.dynamicAllocation.maxExecutors": "5", "spark.executor.cores": "4",
                       "spark.executor.memory": "7680m"}.items():
        assert conf[key] == value, key
    warnings = [line for line in done.stderr.splitlines() if "no meaning on Spark" in line]
    assert len(warnings) == 1, warnings
    for flag in _IGNORED:
        assert done.stderr.count(f"{flag} (") == 1, flag


def test_options_built_without_flags_map_to_nothing():
    # PipelineOptions() keeps no flag list at all (Beam's own streaming tests build theirs so).
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    assert map_dataflow_options(options).mappings == ()


def test_options_a_job_server_rebuilds_from_a_portable_client_report_nothing():
    # PortableRunner sends every option, defaults included; the server rebuilds them.
    client = PipelineOptions(["--runner=PortableRunner", "--job_endpoint=localhost:1",
                              "--environment_type=LOOPBACK", "--sdk_location=container"])
    server = PipelineOptions.from_dictionary(
        {k: v for k, v in client.get_all_options().items() if v is not None})
    assert map_dataflow_options(server).mappings == ()
