"""SparkRunner: a portable Beam runner written in Python on PySpark."""
from __future__ import annotations

import dataclasses
import logging
import time

from apache_beam.options import pipeline_options
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import runner
from apache_beam.runners.pipeline_utils import (
    merge_common_environments,
    merge_superset_dep_environments,
    validate_pipeline_graph,
)
from apache_beam.transforms import core, environments

from beam_ext.runner import _dependencies
from beam_ext.runner._metrics import SparkMetrics
from beam_ext.runner._pipeline_proto import pipeline_proto
from beam_ext.runner._streaming_result import SparkStreamingResult
from beam_ext.runner.dataflow_options import map_dataflow_options
from beam_ext.runner.executors import BatchExecutor, StreamingExecutor
from beam_ext.runner.executors._commit_log import CommitLog
from beam_ext.runner.executors._streaming import fingerprint
from beam_ext.runner.options import SparkRunnerOptions, check_options
from beam_ext.runner.planning import TestStreamAsBoundedSource, plan_pipeline, swap_native_io
from beam_ext.runner.planning._create_type import expand_create
from beam_ext.runner.session import active_context, get_or_create_context, start_context_early, starting

_LOG = logging.getLogger("beam_ext.runner")


class SparkPipelineResult(runner.PipelineResult):
    """The result of a finished batch pipeline: state and metrics.

    ``metrics().query()`` returns the user counters, distributions and gauges
    of every stage, merged over all Spark tasks.
    """

    def __init__(self, state, monitoring_infos_by_stage) -> None:
        super().__init__(state)
        self._monitoring = monitoring_infos_by_stage

    def wait_until_finish(self, duration=None):
        return self._state

    def cancel(self):
        raise NotImplementedError("batch pipelines run to completion in run()")

    def metrics(self) -> SparkMetrics:
        return SparkMetrics(self._monitoring, user_metrics_only=True)

    def monitoring_metrics(self) -> SparkMetrics:
        return SparkMetrics(self._monitoring, user_metrics_only=False)


class SparkRunner(runner.PipelineRunner):
    """Runs Beam pipelines on Apache Spark through PySpark.

    Beam's own translation phases plan the pipeline; each fused stage runs
    inside Spark tasks through Beam's bundle processor; GroupByKey is a Spark
    shuffle on encoded keys. A running SparkContext (a SparkSession's under
    spark-submit, in notebooks, tests) is used as is; otherwise a
    SparkContext is started from :class:`SparkRunnerOptions` (``local[*,4]``
    by default).

    Example::

        import apache_beam as beam
        from beam_ext.runner import SparkRunner

        with beam.Pipeline(runner=SparkRunner()) as p:
            (p | beam.Create(["a b", "b"]) | beam.FlatMap(str.split)
               | beam.combiners.Count.PerElement() | beam.Map(print))

    Or unchanged code: ``--runner=beam_ext.runner.SparkRunner``.
    """

    def __init__(self, is_drain: bool = False) -> None:
        """``is_drain``: truncate SDF restrictions as when draining a streaming
        job (Beam's FnApiRunner offers the same switch, used by Beam's tests)."""
        super().__init__()
        self._is_drain = is_drain
        self._options_seen = None

    def apply_PTransform(self, transform, input, options):  # noqa: N802, A002 - Beam's names
        if options is not self._options_seen:
            # A pipeline's first transform: its options are known, so Spark
            # can start while Beam builds and encodes the rest.
            self._options_seen = options
            _start_spark_early(options)
        # A Create's values are typed once more when it is applied; here once per shape of value.
        if type(transform) is core.Create:
            return expand_create(transform, input)
        return super().apply_PTransform(transform, input, options)

    def run_pipeline(self, pipeline, options: pipeline_options.PipelineOptions):
        if not _is_streaming(pipeline, options):
            pipeline.replace_all([TestStreamAsBoundedSource()])
            swap_native_io(pipeline)
        elif options.view_as(SparkRunnerOptions).watermarks == "min":
            # The tracker's watermarks follow each source's records, which a native read does not report.
            swap_native_io(pipeline, reads_only=True)
        return self.run_proto(pipeline_proto(pipeline, options), options)

    def run_proto(self, proto, options: pipeline_options.PipelineOptions):
        """Runs a Runner API pipeline proto (the portable entry point)."""
        spark_options = options.view_as(SparkRunnerOptions)
        check_options(spark_options)
        # Dataflow's options: fail before Spark starts on one that cannot be
        # honoured; report the others once.
        dataflow = map_dataflow_options(options)
        dataflow.raise_unsupported()
        dataflow.log(_LOG, session_started=starting() or active_context() is None)
        validate_pipeline_graph(proto)
        proto = merge_common_environments(merge_superset_dep_environments(proto))
        for env_id, env in proto.components.environments.items():
            proto.components.environments[env_id].CopyFrom(environments.resolve_anyof_environment(
                env, python_urns.EMBEDDED_PYTHON, common_urns.environments.EXTERNAL.urn,
                common_urns.environments.DOCKER.urn))
        job_name = _job_name(options)
        streaming = _proto_is_streaming(proto, options)
        sc = get_or_create_context(spark_options, job_name, dataflow.spark_conf)
        _dependencies.ship(sc, options)
        worker_setup = _dependencies.worker_setup(options)
        parallelism = spark_options.spark_parallelism or sc.defaultParallelism
        resumable = streaming and spark_options.checkpoint_dir
        if resumable:
            unplanned = _copy(proto)

        def plan_it(pipeline_proto, **layout):
            # The tracker reads each element's timestamp from the shuffle,
            # follows a splittable DoFn's records, and hears from every
            # producer of a source's output (a native Create sends nothing):
            # with it, none of those.
            untracked = spark_options.watermarks != "tracker"
            return plan_pipeline(pipeline_proto, spark_options.spark_bundle_size, parallelism,
                                 spark_options.spark_state_backend, spark_options.spark_state_memory,
                                 is_drain=self._is_drain, streaming=streaming,
                                 group_memory_bytes=spark_options.spark_group_memory,
                                 **{"gather_by_window": untracked, "reads_whole": untracked,
                                    "native_creates": untracked, **layout})

        plan = plan_it(proto)
        if resumable:
            plan = _plan_of_checkpoint(spark_options.checkpoint_dir, parallelism, plan,
                                       lambda layout: plan_it(_copy(unplanned), **layout))
        for stage in plan.stages:
            if stage.spec is not None:
                stage.spec = dataclasses.replace(stage.spec, worker_setup=worker_setup)
            if stage.native is not None:
                stage.native = dataclasses.replace(stage.native, worker_setup=worker_setup)
        _LOG.info("Running %d stages on Spark (%s, parallelism %d%s)", len(plan.stages),
                  sc.master, parallelism, ", streaming" if streaming else "")
        if streaming:
            executor = StreamingExecutor(
                sc, plan, parallelism, spark_options.checkpoint_dir, spark_options.spark_batch_interval,
                watermarks=spark_options.watermarks, tracker_options={
                    "address": spark_options.tracker_address, "bucket": spark_options.tracker_bucket,
                    "timeout": spark_options.tracker_timeout,
                    "allow_plaintext": spark_options.tracker_allow_plaintext})
            return SparkStreamingResult(executor)
        start = time.monotonic()
        execution = BatchExecutor(sc, plan, parallelism)
        execution.run()
        _LOG.info("Pipeline done in %.2fs", time.monotonic() - start)
        return SparkPipelineResult(runner.PipelineState.DONE, execution.monitoring)


# How earlier releases planned a streaming pipeline, newest first: the
# planning options that give their stages, and what differs.
_EARLIER_LAYOUTS = (
    (dict(native_creates=False),
     "its Creates run Beam's expansion, with a Reshuffle, and keep the Reshuffles right after them"),
    (dict(native_creates=False, native_reads=False, reads_whole=False),
     "its bounded reads run Beam's splittable DoFn, keeping their restrictions, the steps after them apart"),
    (dict(native_creates=False, native_reads=False, reads_whole=False, flattens_in_stage=False),
     "a stage reads back a Flatten of one stage's outputs, with steps before its GroupByKey"),
    (dict(native_creates=False, native_reads=False, reads_whole=False, flattens_write_groupings=False),
     "a stage reads a Flatten back into a GroupByKey's shuffle"),
    (dict(native_creates=False, native_reads=False, reads_whole=False, flattens_write_groupings=False,
          split_after_splittable=False),
     "a stage reads a Flatten back into a GroupByKey's shuffle; the steps after a splittable DoFn share its stage"),
)


def _copy(proto: beam_runner_api_pb2.Pipeline) -> beam_runner_api_pb2.Pipeline:
    copy = beam_runner_api_pb2.Pipeline()
    copy.CopyFrom(proto)  # planning changes the proto it plans
    return copy


def _plan_of_checkpoint(checkpoint_dir: str, parallelism: int, plan, plan_as):
    """``plan``, or the plan a checkpoint was written with by an earlier
    release (:data:`_EARLIER_LAYOUTS`; ``plan_as(layout)`` plans with a
    layout's options): resuming it needs its stages. Any other checkpoint is
    the commit log's to accept or refuse."""
    stored = CommitLog.stored_fingerprint(checkpoint_dir)
    if stored is None or stored == fingerprint(plan, parallelism):
        return plan
    for layout, differs in _EARLIER_LAYOUTS:
        earlier = plan_as(layout)
        if stored == fingerprint(earlier, parallelism):
            _LOG.info("Resuming %s with its stages as they were planned when it was written: %s",
                      checkpoint_dir, differs)
            return earlier
    return plan


def _job_name(options: pipeline_options.PipelineOptions) -> str:
    return options.view_as(pipeline_options.GoogleCloudOptions).job_name or "beam_ext"


def _start_spark_early(options: pipeline_options.PipelineOptions) -> None:
    """Starts the session ``run_proto`` will ask for, unless the options
    are ones ``run_proto`` rejects before Spark starts."""
    if active_context() is not None or starting():
        return  # the common case after a process's first pipeline: nothing to parse
    spark_options = options.view_as(SparkRunnerOptions)
    try:
        check_options(spark_options)
        dataflow = map_dataflow_options(options)
    except Exception:  # noqa: BLE001 - run_proto raises it, naming the option
        return
    if not dataflow.unsupported:
        start_context_early(spark_options, _job_name(options), dataflow.spark_conf)


def _is_streaming(pipeline, options: pipeline_options.PipelineOptions) -> bool:
    """``--streaming``, an unbounded source, or a TestStream that batch cannot replay."""
    if options.view_as(pipeline_options.StandardOptions).streaming:
        return True
    from apache_beam.pipeline import PipelineVisitor
    from apache_beam.testing.test_stream import TestStream

    from beam_ext.runner.planning._test_stream import _batch_elements

    found = []

    class _Unbounded(PipelineVisitor):
        def visit_transform(self, node):
            if isinstance(node.transform, TestStream):
                try:
                    _batch_elements(node.transform)
                except NotImplementedError as e:
                    found.append(str(e))
            elif (any(getattr(out, "is_bounded", True) is False for out in node.outputs.values())
                  and all(getattr(i, "is_bounded", True) is not False for i in node.inputs)):
                # Only where unboundedness starts: PCollections downstream of a
                # TestStream say unbounded even when batch replays it.
                found.append(f"{node.full_label} is unbounded")

    pipeline.visit(_Unbounded())
    if found:
        _LOG.info("running in streaming mode: %s", found[0])
    return bool(found)


def _proto_is_streaming(proto, options: pipeline_options.PipelineOptions) -> bool:
    """For a Runner API proto: ``--streaming``, or a TestStream or unbounded PCollection left in it."""
    if options.view_as(pipeline_options.StandardOptions).streaming:
        return True
    pcolls = proto.components.pcollections
    unbounded = beam_runner_api_pb2.IsBounded.UNBOUNDED
    for transform in proto.components.transforms.values():
        if transform.spec.urn == common_urns.primitives.TEST_STREAM.urn:
            return True
        # Where unboundedness starts (a source), not PCollections downstream of
        # a TestStream that batch replaced by a bounded source.
        if (any(pcolls[o].is_bounded == unbounded for o in transform.outputs.values())
                and not any(pcolls[i].is_bounded == unbounded for i in transform.inputs.values())):
            return True
    return False
