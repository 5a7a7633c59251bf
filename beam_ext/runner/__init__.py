"""SparkRunner: Beam pipelines on Apache Spark.

Example::

    with beam.Pipeline(runner=SparkRunner()) as p: ...
"""
from beam_ext.runner._errors import CheckpointUnwritable, PipelineError
from beam_ext.runner.dataflow_options import DataflowOptionError
from beam_ext.runner.executors._commit_log import CheckpointMismatch
from beam_ext.runner.options import SparkRunnerOptions
from beam_ext.runner.session import SparkUnavailableError, recommended_spark_conf
from beam_ext.runner.spark_runner import SparkPipelineResult, SparkRunner

__all__ = ["CheckpointMismatch", "CheckpointUnwritable", "DataflowOptionError", "PipelineError",
           "SparkPipelineResult", "SparkRunner", "SparkRunnerOptions", "SparkUnavailableError",
           "recommended_spark_conf"]
