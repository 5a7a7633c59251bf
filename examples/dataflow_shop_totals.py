"""A pipeline written for Dataflow: totals of BigQuery orders, Pub/Sub clicks decoded.

What SparkRunner can run of it (nothing is run or contacted):

    python -m beam_ext.migrate check examples/dataflow_shop_totals.py --output /tmp/totals \
        --runner=DataflowRunner --project=my-project --region=europe-west1 \
        --temp_location=gs://my-bucket/tmp
"""
from __future__ import annotations

import argparse

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def run(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    known, pipeline_args = parser.parse_known_args(argv)
    with beam.Pipeline(options=PipelineOptions(pipeline_args)) as p:
        orders = p | "ReadOrders" >> beam.io.ReadFromBigQuery(
            query="SELECT id, amount FROM shop.orders", use_standard_sql=True)
        clicks = p | "ReadClicks" >> beam.io.ReadFromPubSub(topic="projects/my-project/topics/clicks")
        totals = (orders | "Amounts" >> beam.Map(lambda row: ("orders", row["amount"]))
                  | "Total" >> beam.CombinePerKey(sum))
        _ = clicks | "Decode" >> beam.Map(lambda b: b.decode("utf-8"))
        _ = (totals | "Format" >> beam.MapTuple(lambda k, v: f"{k}: {v}")
             | "Write" >> beam.io.WriteToText(known.output))


if __name__ == "__main__":
    run()
