"""A Beam job server running Python pipelines on Spark through SparkRunner.

Start it with ``python -m beam_ext.job_server --port 8099`` and submit
unchanged pipelines with ``--runner=PortableRunner
--job_endpoint=localhost:8099``, where Beam's Spark job server jar was.

Example (in process, on an existing SparkSession or SparkContext)::

    from beam_ext.job_server import SparkJobServicer

    servicer = SparkJobServicer(spark)
    port = servicer.start_grpc_server(0)
"""
from beam_ext.job_server._job import SparkBeamJob
from beam_ext.job_server._sdks import UnsupportedPipelineError, check_python_pipeline
from beam_ext.job_server._service import SparkJobServicer, parse_server_args

__all__ = ["SparkBeamJob", "SparkJobServicer", "UnsupportedPipelineError", "check_python_pipeline",
           "parse_server_args"]
