"""``--checkpoint_dir`` on a read-only, a full and a filling filesystem, run by test_streaming_faults.py.

The test mounts the filesystems (tmpfs, in a mount namespace of this
process's own) and runs this script inside it::

    python checkpoint_dir_job.py READ_ONLY FULL FILLS OUT_DIR

It runs :mod:`streaming_fault_job`'s pipeline four times in one Spark
session: on ``READ_ONLY``, on ``FULL``, on ``FILLS`` (a step of the
pipeline fills that filesystem mid-stream, once), then on ``FILLS`` again
after the filler is deleted. Prints one JSON line: each failed run's error
type and message, the committed batches the failed run left, and whether
the last run completed.
"""
from __future__ import annotations

import json
import os
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def _run(checkpoint: str, out_dir: str, fill: str | None = None) -> dict:
    import streaming_fault_job as job

    options = PipelineOptions(["--streaming", "--runner=beam_ext.runner.SparkRunner", "--spark_master=local[2]",
                               "--spark_conf=spark.ui.enabled=false", f"--checkpoint_dir={checkpoint}"])
    try:
        with beam.Pipeline(options=options) as p:
            job.build(p, out_dir, fault_marker=out_dir + ".filled" if fill else None, fill=fill)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def main(read_only: str, full: str, fills: str, out_dir: str) -> None:
    report = {"read_only": _run(os.path.join(read_only, "ckpt"), out_dir),
              "full": _run(os.path.join(full, "ckpt"), out_dir)}
    checkpoint = os.path.join(fills, "ckpt")
    report["fills"] = _run(checkpoint, out_dir, fill=os.path.join(fills, "filler"))
    report["fills"]["commits"] = sorted(os.listdir(os.path.join(checkpoint, "commits")))
    os.remove(os.path.join(fills, "filler"))
    report["after_freeing"] = _run(checkpoint, out_dir, fill=os.path.join(fills, "filler"))
    print(json.dumps(report))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(*sys.argv[1:5])
