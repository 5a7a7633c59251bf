"""The runner benchmark's pipelines compute the same answers on every engine."""
import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

import runner_throughput as bench
from beam_ext.runner import SparkRunner


def test_benchmark_pipelines_agree_with_hand_written_pyspark(spark, tmp_path):
    sc = spark.sparkContext
    text = str(tmp_path / "words.txt")
    bench.make_text(text, 0.02)
    with beam.Pipeline(runner=SparkRunner()) as p:
        assert_that(bench.beam_wordcount(p, text),
                    equal_to([bench.rdd_wordcount(sc, text)]), label="wordcount")
        assert_that(bench.beam_combine(p, 3200, 10),
                    equal_to([bench.rdd_combine(sc, 3200, 10)]), label="combine")
        assert_that(bench.beam_gbk(p, 3200, 1000),
                    equal_to([bench.rdd_gbk(sc, 3200, 1000)]), label="gbk")
        assert_that(bench.beam_side_join(p, 3200, 100),
                    equal_to([bench.rdd_side_join(sc, 3200, 100)]), label="side join")
