"""A pipeline written for Dataflow, run on SparkRunner by test_dataflow_options.py
and test_runner_cluster.py: its DoFn lives in the user's own package, and a
function of ``__main__`` reads a global (which needs --save_main_session under
--pickle_library=dill, as on Dataflow). The same pipeline counts words through
a shuffle into ``OUT.counts-*`` as ``word,count`` lines.

Usage: dataflow_job.py OUT SYS_PATH MODULES PIPELINE_ARGS...
SYS_PATH: directories the driver imports the user's packages from (os.pathsep
separated); MODULES: comma-separated modules whose files each element reports.
"""
import json
import os
import re
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

PREFIX = "main:"


def in_main(line: str) -> str:
    return PREFIX + re.sub("^", "", line)


def main(argv: list[str]) -> None:
    out, paths, modules, pipeline_args = argv[0], argv[1], argv[2].split(","), argv[3:]
    sys.path[:0] = [p for p in paths.split(os.pathsep) if p]
    import userpkg

    with beam.Pipeline(options=PipelineOptions(pipeline_args)) as p:
        (p | beam.Create(["a", "b", "c"]) | beam.ParDo(userpkg.Where(modules))
           | beam.Map(in_main) | beam.io.WriteToText(out))
        (p | "Lines" >> beam.Create([f"w{i % 7} w{i % 3}" for i in range(100)])
           | beam.FlatMap(str.split) | beam.combiners.Count.PerElement()
           | beam.MapTuple(lambda w, n: f"{w},{n}") | "WriteCounts" >> beam.io.WriteToText(out + ".counts"))
    from pyspark import SparkContext

    conf = dict(SparkContext.getOrCreate().getConf().getAll())  # the one the runner started
    with open(out + ".conf.json", "w") as f:
        json.dump(conf, f)


if __name__ == "__main__":
    main(sys.argv[1:])
