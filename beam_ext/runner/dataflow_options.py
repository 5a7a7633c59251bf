"""What Dataflow's pipeline options mean on SparkRunner.

A pipeline written for Dataflow carries ``GoogleCloudOptions``,
``WorkerOptions``, ``SetupOptions`` and ``DebugOptions``. On SparkRunner each
option the user set either becomes Spark configuration (``--num_workers`` ->
``spark.executor.instances``), keeps the meaning Beam's SDK gives it
(``--temp_location`` for Beam's IOs), ships the user's code to the executors
(``--setup_file``), or has no meaning on Spark and is reported once, with the
reason. An option whose absence would change what the job does
(``--update``, ``--template_location``) is an error: running something else
instead would be worse.

Example::

    from apache_beam.options.pipeline_options import PipelineOptions
    from beam_ext.runner.dataflow_options import map_dataflow_options

    report = map_dataflow_options(PipelineOptions(
        ["--project=p", "--num_workers=3", "--worker_machine_type=n1-standard-4"]))
    report.spark_conf      # {'spark.executor.instances': '3', 'spark.executor.cores': '4', ...}
    [m.option for m in report.ignored]   # ['--project']

The cost is one argparse pass over the options, at job start.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import re
from typing import Any, Callable, Literal

from apache_beam.options import pipeline_options as po

from beam_ext.errors import BeamExtError
from beam_ext.runner.options import SparkRunnerOptions, parse_spark_conf

__all__ = ["DataflowOptionError", "DataflowOptionsReport", "OptionMapping", "machine_resources",
           "map_dataflow_options"]

Kind = Literal["spark", "beam", "dependency", "ignored", "unsupported"]

# The classes whose options Dataflow defines; StandardOptions (--streaming,
# --runner) are SparkRunner's own.
DATAFLOW_OPTION_CLASSES = (po.GoogleCloudOptions, po.WorkerOptions, po.SetupOptions,
                           po.DebugOptions)


class DataflowOptionError(BeamExtError, ValueError):
    """A Dataflow option that SparkRunner cannot honour without changing what the job does."""


@dataclasses.dataclass(frozen=True)
class OptionMapping:
    """One Dataflow option the user set and what it became on Spark.

    ``kind``: ``"spark"`` (Spark configuration, in ``spark_conf``), ``"beam"``
    (read by Beam's SDK as on Dataflow), ``"dependency"`` (shipped to the
    executors), ``"ignored"`` (no meaning on Spark; ``meaning`` says why) or
    ``"unsupported"`` (the job cannot run as asked).
    """

    option: str
    value: Any
    kind: Kind
    meaning: str
    spark_conf: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DataflowOptionsReport:
    """Every Dataflow option the user set, mapped; see :func:`map_dataflow_options`."""

    mappings: tuple[OptionMapping, ...]
    user_spark_conf: dict[str, str]
    app_name: str | None

    @property
    def ignored(self) -> tuple[OptionMapping, ...]:
        return tuple(m for m in self.mappings if m.kind == "ignored")

    @property
    def unsupported(self) -> tuple[OptionMapping, ...]:
        return tuple(m for m in self.mappings if m.kind == "unsupported")

    @property
    def derived_conf(self) -> dict[str, str]:
        """Spark configuration derived from Dataflow options, before ``--spark_conf``."""
        conf: dict[str, str] = {}
        for mapping in self.mappings:
            conf.update(mapping.spark_conf)
        return conf

    @property
    def spark_conf(self) -> dict[str, str]:
        """The derived configuration that ``--spark_conf`` does not override."""
        return {k: v for k, v in self.derived_conf.items() if k not in self.user_spark_conf}

    @property
    def overridden(self) -> dict[str, tuple[str, str]]:
        """key -> (derived value, the ``--spark_conf`` value that wins)."""
        return {k: (v, self.user_spark_conf[k]) for k, v in self.derived_conf.items()
                if k in self.user_spark_conf and self.user_spark_conf[k] != v}

    def raise_unsupported(self) -> None:
        """Raises :class:`DataflowOptionError` naming every option that cannot be honoured."""
        if self.unsupported:
            raise DataflowOptionError("SparkRunner cannot honour " + "; ".join(
                f"{m.option}: {m.meaning}" for m in self.unsupported))

    def log(self, logger: logging.Logger, session_started: bool = True) -> None:
        """One WARNING listing the ignored options with their reasons, one INFO
        listing what the others became. ``session_started=False``: Spark was
        already running, so the derived configuration could not be applied."""
        if self.ignored:
            logger.warning("Dataflow options with no meaning on Spark, ignored: %s", "; ".join(
                f"{m.option} ({m.meaning})" for m in self.ignored))
        applied = [m for m in self.mappings if m.kind in ("spark", "beam", "dependency")]
        if applied:
            logger.info("Dataflow options on Spark: %s", "; ".join(
                f"{m.option} -> {m.meaning}" for m in applied))
        if self.overridden:
            logger.info("--spark_conf wins over Dataflow options for: %s", ", ".join(
                f"{k}={user!r} (not {derived!r})" for k, (derived, user) in self.overridden.items()))
        if not session_started and self.spark_conf:
            names = [m.option for m in self.mappings if m.spark_conf]
            logger.warning("Spark was already running: %s could not be applied (%s)",
                           ", ".join(names), ", ".join(f"{k}={v}" for k, v in self.spark_conf.items()))


# GCE machine families: GB of memory per vCPU
# (https://cloud.google.com/compute/docs/machine-resource).
_GB_PER_VCPU: dict[str, float] = {
    "n1-standard": 3.75, "n1-highmem": 6.5, "n1-highcpu": 0.9,
    "n2-standard": 4, "n2-highmem": 8, "n2-highcpu": 1,
    "n2d-standard": 4, "n2d-highmem": 8, "n2d-highcpu": 1,
    "e2-standard": 4, "e2-highmem": 8, "e2-highcpu": 1,
    "n4-standard": 4, "n4-highmem": 8, "n4-highcpu": 2,
    "c2-standard": 4, "c2d-standard": 4, "c2d-highmem": 8, "c2d-highcpu": 2,
    "c3-standard": 4, "c3-highmem": 8, "c3-highcpu": 2,
    "c3d-standard": 4, "c3d-highmem": 8, "c3d-highcpu": 2,
    "t2d-standard": 4, "t2a-standard": 4, "m1-megamem": 14.9, "m1-ultramem": 24.025,
}
_CUSTOM = re.compile(r"^(?:(n1|n2|n2d|e2)-)?custom-(\d+)-(\d+)(?:-ext)?$")
# Share of a worker's memory given to the executor's JVM heap and to its
# off-heap overhead (Python workers run there); the rest is the OS's.
_HEAP_SHARE, _OVERHEAD_SHARE = 0.5, 0.4


def machine_resources(machine_type: str) -> tuple[int, int] | None:
    """``(vCPUs, memory in MiB)`` of a GCE machine type, or None if not derivable.

    >>> machine_resources("n1-standard-4")
    (4, 15360)
    >>> machine_resources("e2-highmem-8")
    (8, 65536)
    >>> machine_resources("custom-2-6144")
    (2, 6144)
    >>> machine_resources("e2-medium") is None   # shared-core: fractional vCPUs
    True
    """
    name = machine_type.strip().lower()
    custom = _CUSTOM.match(name)
    if custom:
        return int(custom.group(2)), int(custom.group(3))
    family, _, cpus = name.rpartition("-")
    if family not in _GB_PER_VCPU or not cpus.isdigit() or int(cpus) < 1:
        return None
    return int(cpus), int(round(int(cpus) * _GB_PER_VCPU[family] * 1024))


_NO_GCP = "no Google Cloud service is involved on Spark"
_NO_VM = "Spark does not create worker VMs: the cluster's executors are what they are"
_NO_CONTAINER = "executors run the Python environment of the Spark cluster, not a container"
_DATAFLOW_ONLY = "a Dataflow service feature"

# Options with no meaning on Spark -> why. One table, checked against Beam's
# option classes by tests/test_dataflow_options.py.
IGNORED: dict[str, str] = {
    "dataflow_endpoint": _NO_GCP, "project": _NO_GCP, "region": _NO_GCP,
    "service_account_email": "executors run as the Spark cluster's user",
    "impersonate_service_account": "executors run as the Spark cluster's user",
    "no_auth": _NO_GCP, "gcp_oauth_scopes": _NO_GCP,
    "labels": "Spark jobs carry no GCP labels",
    "enable_streaming_engine": "streaming state lives in the executors and --checkpoint_dir",
    "dataflow_kms_key": "Spark's shuffle and state files are not encrypted with Cloud KMS",
    "flexrs_goal": _DATAFLOW_ONLY, "dataflow_service_options": _DATAFLOW_ONLY,
    "enable_hot_key_logging": _DATAFLOW_ONLY, "enable_artifact_caching": _DATAFLOW_ONLY,
    "transform_name_mapping": "meaningful only with --update, which Spark cannot do",
    "disk_size_gb": _NO_VM, "disk_type": _NO_VM, "disk_provisioned_iops": _NO_VM,
    "disk_provisioned_throughput_mibps": _NO_VM, "worker_region": _NO_VM, "worker_zone": _NO_VM,
    "zone": _NO_VM, "network": _NO_VM, "subnetwork": _NO_VM, "use_public_ips": _NO_VM,
    "min_cpu_platform": _NO_VM,
    "worker_harness_container_image": _NO_CONTAINER, "sdk_container_image": _NO_CONTAINER,
    "sdk_harness_container_image_overrides": _NO_CONTAINER,
    "prebuild_sdk_container_engine": _NO_CONTAINER,
    "prebuild_sdk_container_base_image": _NO_CONTAINER,
    "cloud_build_machine_type": _NO_CONTAINER, "docker_registry_push_url": _NO_CONTAINER,
    "sdk_location": "executors use the apache-beam installed on the cluster",
    "default_sdk_harness_log_level": "executor logging is configured by Spark's log4j",
    "sdk_harness_log_level_overrides": "executor logging is configured by Spark's log4j",
    "max_cache_memory_usage_mb": "SparkRunner keeps state in the task, not in an SDK harness cache",
    "element_processing_timeout_minutes": "Spark has no per-element timeout; a stuck task "
                                          "is Spark's to speculate or kill",
    "experiments": "Dataflow experiments select Dataflow service behaviour",
    "requirements_cache": "requirements are built once per content under the staging location",
    "requirements_cache_only_sources": "requirements are built as wheels",
}

# Options that Beam's SDK itself reads on the driver, as it does for Dataflow.
BEAM: dict[str, str] = {
    "temp_location": "temporary files of Beam's IOs (BigQuery loads, ...), read by Beam as on "
                     "Dataflow; any filesystem Beam can write",
    "enable_bucket_read_metric_counter": "Beam's GCS client", "enable_bucket_write_metric_counter":
    "Beam's GCS client", "no_gcsio_throttling_counter": "Beam's GCS client",
    "enable_gcsio_blob_generation": "Beam's GCS client", "gcs_custom_audit_entries": "Beam's GCS client",
    "gbek": "GroupByKey encrypted by Beam's SDK (EncryptedGroupByKey)",
    "user_agent": "sent by Beam's IOs",
    "maven_repository_url": "cross-language expansion on the driver",
}

# Options whose running would be something other than what the user asked for.
UNSUPPORTED: dict[str, str] = {
    "update": "a Dataflow job cannot be updated in place on Spark; stop the job and start it "
              "again with the same --checkpoint_dir to resume a streaming pipeline",
    "template_location": "it asks for a Dataflow template to be written instead of running the "
                         "job; SparkRunner would run it",
    "dataflow_job_file": "it asks for the Dataflow job description to be written; SparkRunner "
                         "has no Dataflow job",
    "create_from_snapshot": "a Dataflow snapshot cannot be restored on Spark",
}

DEPENDENCIES: dict[str, str] = {
    "requirements_file": "installed into a dependency zip shipped with the job",
    "setup_file": "the package built and shipped with the job",
    "extra_packages": "installed into a dependency zip shipped with the job",
    "files_to_stage": "shipped with the job (SparkContext.addFile)",
    "save_main_session": "the main session's registries loaded on each executor, as Beam's SDK "
                         "worker does",
    "pickle_library": "the pickler executors unpickle DoFns with",
    "beam_plugins": "imported on each executor before user code",
}

# Experiments beam.Pipeline adds itself for every portable runner.
_ADDED_BY_BEAM = frozenset({"beam_fn_api"})

# Options mapped by _worker_conf / _app_name below.
SPARK: tuple[str, ...] = ("job_name", "staging_location", "num_workers", "max_num_workers",
                          "autoscaling_algorithm", "machine_type", "number_of_worker_harness_threads")


# Values that mean "nothing asked for": Beam's PortableRunner sends every
# option, defaults included, and the SDK's container stages itself.
_NOT_ASKED_FOR = {"sdk_location": ("default", "container")}


def _is_default(dest: str, value: Any) -> bool:
    """Whether ``value`` is what the option holds when nobody set it. A job
    server rebuilds options from every value the client had, so an append
    option (``--gcp_oauth_scopes``) arrives as its default list appended to
    itself."""
    if value in _NOT_ASKED_FOR.get(dest, ()):
        return True
    default = _defaults().get(dest)
    if isinstance(default, list) and isinstance(value, list):
        return set(map(str, value)) <= set(map(str, default))
    return False


@functools.lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for cls in DATAFLOW_OPTION_CLASSES:
        parser = po._BeamArgumentParser(allow_abbrev=False)
        cls._add_argparse_args(parser)
        defaults.update({a.dest: a.default for a in parser._actions if a.dest != "help"})
    return defaults


@functools.lru_cache(maxsize=1)
def _dataflow_flags() -> dict[str, tuple[str, ...]]:
    """dest -> the ``--flags`` of every option of Dataflow's option classes
    (built once: the parsers took 2 ms of every pipeline's run)."""
    flags: dict[str, tuple[str, ...]] = {}
    for cls in DATAFLOW_OPTION_CLASSES:
        parser = po._BeamArgumentParser(allow_abbrev=False)
        cls._add_argparse_args(parser)
        for action in parser._actions:
            if action.dest != "help":
                flags[action.dest] = flags.get(action.dest, ()) + tuple(
                    s for s in action.option_strings if s.startswith("--"))
    return flags


def _flag_names(options: po.PipelineOptions, flags: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """dest -> the flag as the user spelled it (``--extra_package`` or
    ``--extra_packages``); the longest spelling for options set in code."""
    used = {str(arg).split("=", 1)[0] for arg in options._flags or ()}
    names = {}
    for dest, spellings in flags.items():
        given = [s for s in spellings if s in used]
        names[dest] = given[-1] if given else max(spellings, key=len)
    return names


def _worker_conf(values: dict[str, Any], names: dict[str, str]) -> list[OptionMapping]:
    workers, most = values.get("num_workers"), values.get("max_num_workers")
    algorithm = values.get("autoscaling_algorithm")
    if algorithm == "THROUGHPUT_BASED" or (algorithm is None and most is not None):
        base = {"spark.dynamicAllocation.enabled": "true",
                # No external shuffle service is assumed: executors holding shuffle
                # output stay while it is needed.
                "spark.dynamicAllocation.shuffleTracking.enabled": "true",
                # Dataflow scales a batch job down to one worker, never to none.
                "spark.dynamicAllocation.minExecutors": "1"}
        per_option = {
            "num_workers": ("spark.dynamicAllocation.initialExecutors", workers),
            "max_num_workers": ("spark.dynamicAllocation.maxExecutors", most),
            "autoscaling_algorithm": ("spark.dynamicAllocation.enabled", "true")}
        out = []
        for dest, (key, value) in per_option.items():
            if dest in values:
                conf = {**base, key: str(value)}
                meaning = ", ".join(f"{k}={v}" for k, v in conf.items())
                out.append(OptionMapping(names[dest], values[dest], "spark",
                                         f"{key}={value}" if dest != "autoscaling_algorithm"
                                         else f"dynamic allocation ({meaning})", conf))
        return out
    out = []
    if workers is not None:
        out.append(OptionMapping(names["num_workers"], workers, "spark",
                                 f"spark.executor.instances={workers}, no dynamic allocation",
                                 {"spark.executor.instances": str(workers),
                                  "spark.dynamicAllocation.enabled": "false"}))
    if algorithm == "NONE":
        out.append(OptionMapping(names["autoscaling_algorithm"], algorithm, "spark",
                                 "spark.dynamicAllocation.enabled=false",
                                 {"spark.dynamicAllocation.enabled": "false"}))
    return out


def _resources_conf(values: dict[str, Any], names: dict[str, str]) -> list[OptionMapping]:
    out: list[OptionMapping] = []
    threads = values.get("number_of_worker_harness_threads")
    machine = values.get("machine_type")
    if machine is not None:
        resources = machine_resources(str(machine))
        if resources is None:
            out.append(OptionMapping(names["machine_type"], machine, "ignored",
                                     "not a GCE machine type whose vCPUs and memory are known; "
                                     "set spark.executor.cores and spark.executor.memory instead"))
        else:
            cpus, mib = resources
            conf = {"spark.executor.memory": f"{int(mib * _HEAP_SHARE)}m",
                    "spark.executor.memoryOverhead": f"{int(mib * _OVERHEAD_SHARE)}m"}
            if threads is None:
                conf["spark.executor.cores"] = str(cpus)
            out.append(OptionMapping(names["machine_type"], machine, "spark", ", ".join(
                f"{k}={v}" for k, v in conf.items()) + f" (of {cpus} vCPUs, {mib} MiB)", conf))
    if threads is not None:
        out.append(OptionMapping(names["number_of_worker_harness_threads"], threads, "spark",
                                 f"spark.executor.cores={threads} (concurrent tasks per executor)",
                                 {"spark.executor.cores": str(threads)}))
    return out


def map_dataflow_options(options: po.PipelineOptions) -> DataflowOptionsReport:
    """Maps each Dataflow option set in ``options`` (compared with its default)
    to its Spark meaning; see the module docstring and docs/migrating.md.

    >>> report = map_dataflow_options(po.PipelineOptions(["--job_name=j", "--region=r"]))
    >>> report.app_name, [m.option for m in report.ignored]
    ('j', ['--region'])
    """
    flags = _dataflow_flags()
    names = _flag_names(options, flags)
    # retain_unknown_options: the script's own arguments are no reason to warn.
    given = options.get_all_options(drop_default=True, retain_unknown_options=True)
    set_values = {k: v for k, v in given.items()
                  if k in flags and v is not None and not _is_default(k, v)}
    experiments = [e for e in set_values.pop("experiments", None) or [] if e not in _ADDED_BY_BEAM]
    if experiments:
        set_values["experiments"] = experiments
    spark_options = options.view_as(SparkRunnerOptions)
    mappings: list[OptionMapping] = []
    handled: set[str] = set()
    app_name = set_values.get("job_name")
    if app_name is not None:
        handled.add("job_name")
        meaning = (f"Spark application name {app_name!r}" if not spark_options.spark_app_name else
                   f"nothing: --spark_app_name={spark_options.spark_app_name!r} names the application")
        mappings.append(OptionMapping(names["job_name"], app_name, "spark", meaning))
    if "staging_location" in set_values:
        handled.add("staging_location")
        mappings.append(OptionMapping(names["staging_location"], set_values["staging_location"], "spark",
                                      "where built dependencies are cached, by content hash"))
    workers = _worker_conf(set_values, names)
    resources = _resources_conf(set_values, names)
    handled.update(("num_workers", "max_num_workers", "autoscaling_algorithm", "machine_type",
                    "number_of_worker_harness_threads"))
    mappings.extend(workers + resources)
    tables: list[tuple[dict[str, str], Kind]] = [
        (UNSUPPORTED, "unsupported"), (DEPENDENCIES, "dependency"), (BEAM, "beam"), (IGNORED, "ignored")]
    for dest, value in set_values.items():
        if dest in handled:
            continue
        if dest == "save_main_session" and value is False:
            continue  # --no_save_main_session: what SparkRunner does anyway
        for table, kind in tables:
            if dest in table:
                mappings.append(OptionMapping(names[dest], value, kind, table[dest]))
                break
        else:
            mappings.append(OptionMapping(names[dest], value, "ignored",
                                          "a Dataflow option this version of beam_ext does not know"))
    return DataflowOptionsReport(tuple(mappings), parse_spark_conf(spark_options.spark_conf),
                                 app_name if not spark_options.spark_app_name else None)


# For tests: every option of Dataflow's classes has a place in one table.
def _unmapped() -> set[str]:
    tables: list[Callable[[str], bool]] = [IGNORED.__contains__, BEAM.__contains__,
                                           UNSUPPORTED.__contains__, DEPENDENCIES.__contains__,
                                           SPARK.__contains__]
    return {d for d in _dataflow_flags() if not any(t(d) for t in tables)}
