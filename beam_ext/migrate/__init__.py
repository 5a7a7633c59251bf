"""Moving Beam pipelines to SparkRunner: the checker.

``python -m beam_ext.migrate check my_pipeline.py [pipeline args]`` builds the
pipeline without running it and says, transform by transform, whether
SparkRunner runs it, runs it with a caveat, or cannot run it (and why).

Example::

    from beam_ext.migrate import check_script

    report = check_script("my_pipeline.py", ["--input", "in.txt"])
    print(report.to_text())
"""
from beam_ext.migrate.check import Report, Row, check_script

__all__ = ["Report", "Row", "check_script"]
