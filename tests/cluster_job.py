"""A word count test_runner_cluster.py submits to a Spark master that is not there."""
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def main(argv: list[str]) -> None:
    out, pipeline_args = argv[0], argv[1:]
    options = PipelineOptions(pipeline_args)
    with beam.Pipeline(options=options) as p:
        (p | beam.Create([f"w{i % 7} w{i % 3}" for i in range(100)])
           | beam.FlatMap(str.split)
           | beam.combiners.Count.PerElement()
           | beam.MapTuple(lambda w, n: f"{w},{n}")
           | beam.io.WriteToText(out))


if __name__ == "__main__":
    main(sys.argv[1:])
