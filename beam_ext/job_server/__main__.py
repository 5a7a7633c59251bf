"""``python -m beam_ext.job_server [--port 8099] [--spark_master URL] [--spark_conf K=V ...]``."""
from __future__ import annotations

import logging
import signal
import threading

from apache_beam.options.pipeline_options import PipelineOptions

from beam_ext.job_server._service import SparkJobServicer, parse_server_args
from beam_ext.runner.options import SparkRunnerOptions, check_options
from beam_ext.runner.session import get_or_create_context


def main(argv: list[str] | None = None) -> None:
    args = parse_server_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    flags = [f"--spark_master={args.spark_master}"] + [f"--spark_conf={c}" for c in args.spark_conf or []]
    options = PipelineOptions(flags).view_as(SparkRunnerOptions)
    check_options(options)
    sc = get_or_create_context(options, "beam_ext job server")
    servicer = SparkJobServicer(sc, host=args.host, staging_dir=args.staging_dir)
    port = servicer.start_grpc_server(args.port)
    logging.getLogger("beam_ext.job_server").info(
        "Job server listening on %s:%d (Spark master %s); submit with "
        "--runner=PortableRunner --job_endpoint=%s:%d", args.host, port, sc.master,
        args.host, port)
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    servicer.stop()
    sc.stop()


if __name__ == "__main__":
    main()
