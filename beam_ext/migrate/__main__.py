"""``python -m beam_ext.migrate check PIPELINE.py [pipeline args]``."""
from __future__ import annotations

import argparse
import contextlib
import sys

from beam_ext.migrate.check import check_script, report_json


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status (0 runs, 1 cannot run, 2 usage or build error)."""
    parser = argparse.ArgumentParser(
        prog="python -m beam_ext.migrate",
        description="Tools for moving Beam pipelines to SparkRunner.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check", help="build a pipeline without running it and say what SparkRunner can run",
        description="Builds PIPELINE (a script, or a module name) with its arguments, --runner "
        "replaced, without running it, and prints each transform with its verdict: runs, "
        "caveat (runs, with a named difference) or cannot (with the reason). Exit status: 0 if "
        "everything can run, 1 if something cannot, 2 on usage errors or a script that fails to build.")
    check.add_argument("--format", choices=("text", "json"), default="text")
    check.add_argument("--all-steps", action="store_true",
                       help="list every transform at every level, not only the top-level ones")
    check.add_argument("--gcp-access", action="store_true",
                       help="the Spark cluster has Google Cloud credentials and network: Google Cloud "
                       "IOs are caveats instead of 'cannot'")
    check.add_argument("pipeline", help="the pipeline script (PIPELINE.py) or module")
    check.add_argument("args", nargs=argparse.REMAINDER, help="the pipeline's own arguments")
    ns = parser.parse_args(argv)
    # The script's prints go to stderr: stdout carries the report (JSON for CI).
    with contextlib.redirect_stdout(sys.stderr):
        report = check_script(ns.pipeline, ns.args, gcp_access=ns.gcp_access, all_steps=ns.all_steps)
    print(report_json(report) if ns.format == "json" else report.to_text())
    return report.exit_status


if __name__ == "__main__":
    sys.exit(main())
