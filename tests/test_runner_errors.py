"""Bad input, wrong options and user failures give errors naming the culprit."""
from __future__ import annotations

import socket

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream

from beam_ext.runner import PipelineError, SparkRunner, SparkUnavailableError
from beam_ext.runner.options import parse_spark_conf
from beam_ext.runner.session import _check_master_reachable


def test_spark_conf_entries_are_parsed_and_bad_ones_named():
    assert parse_spark_conf(["spark.a=1", "spark.b=x=y"]) == {"spark.a": "1", "spark.b": "x=y"}
    with pytest.raises(ValueError, match="--spark_conf expects KEY=VALUE, got 'oops'"):
        parse_spark_conf(["oops"])


@pytest.mark.parametrize("flag", [
    "--spark_parallelism=0", "--spark_parallelism=-3", "--spark_bundle_size=0",
    "--spark_bundle_size=-1", "--spark_state_memory=0", "--spark_state_memory=-5"])
def test_out_of_range_options_are_rejected_naming_the_flag(spark, flag):
    name, value = flag.split("=")
    with pytest.raises(ValueError, match=f"^{name} must be a positive integer, got {value}$"):
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([flag])) as p:
            _ = p | beam.Create([1, 2, 3]) | beam.Reshuffle()


def test_unreachable_master_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SparkUnavailableError, match=f"spark://127.0.0.1:{port}.*unreachable"):
        _check_master_reachable(f"spark://127.0.0.1:{port}")


def _boom(x):
    if x == 3:
        raise ValueError(f"bad element {x}")
    return x


def test_user_error_names_stage_and_shows_traceback(spark):
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create([1, 2, 3]) | "ExplodeOnThree" >> beam.Map(_boom)
    message = str(info.value)
    assert "ExplodeOnThree" in message          # the stage
    assert "ValueError: bad element 3" in message  # the user's error
    assert "_boom" in message                   # and where it came from


def test_streaming_is_refused_clearly():
    options = PipelineOptions(["--streaming"])
    with pytest.raises(NotImplementedError, match="--streaming is not supported yet"):
        with beam.Pipeline(runner=SparkRunner(), options=options) as p:
            _ = p | beam.Create([1])


def test_test_stream_with_late_data_is_refused(spark):
    stream = (TestStream().advance_watermark_to(10).add_elements(
        [beam.window.TimestampedValue("late", 5)]))
    with pytest.raises(NotImplementedError, match="behind the watermark"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | stream | beam.Map(lambda x: x)


def test_runner_by_dotted_path_uses_the_active_session(spark, tmp_path):
    before = spark.sparkContext.applicationId
    options = PipelineOptions(["--runner=beam_ext.runner.SparkRunner"])
    out = tmp_path / "out"
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create(["x"]) | beam.io.WriteToText(str(out))
    assert type(p.runner).__name__ == "SparkRunner"
    assert spark.sparkContext.applicationId == before
    assert (tmp_path / "out-00000-of-00001").read_text() == "x\n"


def test_non_deterministic_key_coder_is_rejected(spark):
    class Unordered:
        pass

    with pytest.raises(Exception, match="deterministic"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = (p | beam.Create([1]) | beam.Map(lambda x: (Unordered(), x)).with_output_types(
                beam.typehints.Tuple[Unordered, int]) | beam.GroupByKey())
