"""The runner benchmark's pipelines compute the same answers on every engine."""
import apache_beam as beam
import pytest
import runner_throughput as bench
from apache_beam.testing.util import assert_that, equal_to

from beam_ext.runner import SparkRunner


@pytest.mark.parametrize("case", ["wordcount", "side_mean", "combine", "gbk", "cogbk", "side_join", "windowed", "sessions",
                                  "rows", "rows_grouped"])
def test_benchmark_pipelines_agree_with_hand_written_pyspark(spark, tmp_path, case):
    sc = spark.sparkContext
    text = str(tmp_path / "words.txt")
    bench.make_text(text, 3000)  # words
    args = {"wordcount": (text,), "side_mean": (text,), "combine": (3200, 10), "gbk": (3200, 1000), "cogbk": (3200, 100),
            "side_join": (3200, 100), "windowed": (3200, 10), "sessions": (3200, 10),
            "rows": (3200, 10), "rows_grouped": (3200, 10)}[case]
    expected = getattr(bench, f"rdd_{case}")(sc, *args)
    with beam.Pipeline(runner=SparkRunner()) as p:
        assert_that(getattr(bench, f"beam_{case}")(p, *args), equal_to([expected]))
