"""Small Spark tasks with the Python worker on a TCP loopback socket against a Unix domain socket.

Each setting of ``spark.python.unix.domain.socket.enabled`` runs in a
process of its own (a session's setting is fixed when it starts), local[2]:
the headline is the median wall of a small streaming pipeline on
SparkRunner (``streaming_jobs.build_stream``, 10 elements: 12 one-job
micro-batches); secondary rows, PySpark alone, time trivial two-task jobs
(a ``map``, a ``partitionBy``; ``streaming_jobs.trivial_job_seconds``).
Each on a warm session. SparkRunner sets the Unix domain socket in a
session it starts (``beam_ext.runner.recommended_spark_conf``).

    cd /tmp && python <checkout>/benchmarks/python_worker_socket.py [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

SETTINGS = {"TCP loopback": "false", "Unix domain socket": "true"}


def measure(unix_socket: str, runs: int) -> dict[str, float]:
    """Median seconds per case on a session with the given socket setting."""
    from pyspark.sql import SparkSession
    from streaming_jobs import run_stream, trivial_job_seconds

    # The trivial jobs' functions live in streaming_jobs: the workers import it.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.unix.domain.socket.enabled", unix_socket).getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("FATAL")
    run_stream(10)  # warm
    out = {"streaming pipeline on SparkRunner": statistics.median(run_stream(10) for _ in range(runs))}
    for name, seconds in trivial_job_seconds(sc, runs + 2).items():
        out[f"PySpark alone: trivial {name} job"] = seconds
    spark.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.runs)))
        return
    results = {}
    for label, value in SETTINGS.items():
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--runs", str(args.runs), "--child", value],
                              capture_output=True, text=True, check=True)
        results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    tcp, uds = results["TCP loopback"], results["Unix domain socket"]
    print(f"{'case (median of ' + str(args.runs) + ')':<40}{'TCP loopback':>14}{'Unix socket':>14}{'ratio':>8}")
    for case in tcp:
        print(f"{case:<40}{tcp[case]:>13.3f}s{uds[case]:>13.3f}s{tcp[case] / uds[case]:>7.2f}x")


if __name__ == "__main__":
    main()
