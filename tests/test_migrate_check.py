"""``python -m beam_ext.migrate check``: verdicts on Beam's examples and on pipelines SparkRunner cannot run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import apache_beam as beam
import apache_beam.examples
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_ext.migrate import check_script
from beam_ext.migrate.rules import option_verdicts

EXAMPLES = os.path.dirname(apache_beam.examples.__file__)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Reads BigQuery and Pub/Sub, writes text (the example docs/migrating.md shows).
GCP_PIPELINE = os.path.join(REPO, "examples", "dataflow_shop_totals.py")


def _write(tmp_path, name: str, code: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


@pytest.fixture
def text_input(tmp_path) -> str:
    path = tmp_path / "in.txt"
    path.write_text("the cat\nthe dog and the cat\n")
    return str(path)


def _verdicts(report) -> dict[str, str]:
    return {row.transform: row.verdict for row in report.rows}


@pytest.mark.parametrize("example", [
    "wordcount.py", "wordcount_minimal.py", "wordcount_with_metrics.py", "cookbook/custom_ptransform.py",
    "cookbook/multiple_output_pardo.py", "cookbook/group_with_coder.py",
])
def test_beams_examples_run(example, text_input, tmp_path):
    report = check_script(os.path.join(EXAMPLES, example),
                          ["--input", text_input, "--output", str(tmp_path / "out")])
    assert report.build_error is None
    assert report.rows and all(row.verdict == "runs" for row in report.rows), report.to_text()
    assert report.exit_status == 0


def test_wordcount_default_input_on_cloud_storage(tmp_path):
    # Its --input defaults to gs://dataflow-samples/...: nothing is contacted to find that out.
    report = check_script(os.path.join(EXAMPLES, "wordcount.py"), ["--output", str(tmp_path / "out")])
    assert report.exit_status == 1
    assert _verdicts(report)["Read"] == "cannot"
    [read] = [r for r in report.rows if r.transform == "Read"]
    assert "Google Cloud credentials and network" in read.reason and "gs://dataflow-samples" in read.reason
    assert {v for t, v in _verdicts(report).items() if t != "Read"} == {"runs"}


def test_bigquery_and_pubsub_cannot_run_json_cli(tmp_path):
    script = GCP_PIPELINE
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "beam_ext.migrate", "check", "--format=json", script,
         "--output", str(tmp_path / "out"), "--runner=DataflowRunner", "--project=my-project",
         "--temp_location=gs://my-bucket/tmp"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    rows = {row["transform"]: row for row in report["transforms"]}
    assert {name for name, row in rows.items() if row["verdict"] == "cannot"} == {"ReadOrders", "ReadClicks"}
    assert "Google Cloud BigQuery" in rows["ReadOrders"]["reason"]
    assert "Google Cloud credentials and network" in rows["ReadOrders"]["reason"]
    assert "Pub/Sub" in rows["ReadClicks"]["reason"] and "pubsub_read" in rows["ReadClicks"]["reason"]
    assert {rows[n]["verdict"] for n in ("Amounts", "Total", "Decode", "Format", "Write")} == {"runs"}
    assert rows["Total"]["urn"] == "beam:transform:combine_per_key:v1"
    assert report["can_run"] is False and report["summary"]["cannot"] == 2
    options = {o["option"]: o["verdict"] for o in report["options"]}
    assert options == {"--project": "caveat", "--temp_location": "caveat"}


def test_gcp_access_turns_gcp_ios_into_caveats_but_pubsub_source_stays(tmp_path):
    script = GCP_PIPELINE
    report = check_script(script, ["--output", str(tmp_path / "out")], gcp_access=True)
    assert _verdicts(report)["ReadOrders"] == "caveat"
    # Pub/Sub's source has no implementation outside Dataflow and the DirectRunner.
    assert _verdicts(report)["ReadClicks"] == "cannot"
    assert report.exit_status == 1


def test_pubsub_verdict_holds_on_sparkrunner(spark):
    """What the checker calls "cannot run" SparkRunner refuses, before doing any work."""
    p = beam.Pipeline(runner="beam_ext.runner.SparkRunner", options=PipelineOptions([]))
    _ = p | "ReadClicks" >> beam.io.ReadFromPubSub(topic="projects/my-project/topics/clicks")
    with pytest.raises(NotImplementedError, match="pubsub_read"):
        p.run()


def test_cross_language_transform_is_refused_without_an_expansion_service(tmp_path):
    script = _write(tmp_path, "kafka_pipeline.py", '''
        import sys
        import apache_beam as beam
        from apache_beam.io.kafka import ReadFromKafka
        from apache_beam.options.pipeline_options import PipelineOptions

        with beam.Pipeline(options=PipelineOptions(sys.argv[1:])) as p:
            (p | "ReadEvents" >> ReadFromKafka(consumer_config={"bootstrap.servers": "localhost:9"},
                                               topics=["events"])
               | "Values" >> beam.Map(lambda kv: kv[1]))
        ''')
    report = check_script(script, [])
    [read] = [r for r in report.rows if r.transform == "ReadEvents"]
    assert read.verdict == "cannot"
    assert "cross-language transform" in read.reason and "Java expansion service" in read.reason
    assert "kafka" in read.reason
    assert _verdicts(report)["Values"] == "runs"
    assert report.exit_status == 1


def test_beams_sql_example_is_cross_language(text_input, tmp_path):
    report = check_script(os.path.join(EXAMPLES, "wordcount_xlang_sql.py"),
                          ["--input", text_input, "--output", str(tmp_path / "out")])
    assert {t for t, v in _verdicts(report).items() if v != "runs"} == {"Sql!!"}
    assert "beam:external:java:sql:v1" in report.rows[3].reason


def test_unbounded_side_input_cannot_run(tmp_path):
    script = _write(tmp_path, "side.py", '''
        import sys
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
        from apache_beam.transforms.periodicsequence import PeriodicImpulse

        with beam.Pipeline(options=PipelineOptions(sys.argv[1:])) as p:
            ticks = p | "Ticks" >> PeriodicImpulse(fire_interval=1, apply_windowing=True)
            (p | "Create" >> beam.Create([1, 2])
               | "WithTicks" >> beam.Map(lambda x, t: (x, t), t=beam.pvalue.AsList(ticks)))
        ''')
    report = check_script(script, ["--streaming"])
    assert _verdicts(report) == {"Ticks": "runs", "Create": "runs", "WithTicks": "cannot"}
    assert "unbounded" in report.rows[2].reason


def test_update_and_template_location_cannot_run_other_dataflow_options_are_caveats():
    options = PipelineOptions(["--update", "--template_location=/tmp/t", "--job_name=j",
                               "--num_workers=3", "--streaming"])
    verdicts = {v.option: v.verdict for v in option_verdicts(options)}
    assert verdicts == {"--update": "cannot", "--template_location": "cannot", "--job_name": "caveat",
                        "--num_workers": "caveat"}


def test_update_fails_the_check(text_input, tmp_path):
    report = check_script(os.path.join(EXAMPLES, "wordcount_minimal.py"),
                          ["--input", text_input, "--output", str(tmp_path / "out"), "--update",
                           "--job_name=wordcount"])
    assert all(row.verdict == "runs" for row in report.rows)
    assert report.exit_status == 1
    assert "--update" in report.to_text()


def test_script_that_fails_to_build_exits_2_with_its_error(tmp_path):
    script = _write(tmp_path, "broken.py", '''
        import apache_beam as beam

        def parse(argv):
            raise ValueError("no such table: orders")

        with beam.Pipeline() as p:
            p | beam.Create([1]) | beam.Map(parse)
            parse([])
        ''')
    report = check_script(script, [])
    assert report.exit_status == 2
    assert "ValueError: no such table: orders" in report.build_error
    assert "broken.py" in report.build_error  # the script's frame, to find the line


def test_text_report_names_verdicts_and_summary(tmp_path):
    script = GCP_PIPELINE
    text = check_script(script, ["--output", str(tmp_path / "out")]).to_text()
    lines = text.splitlines()
    assert any(line.startswith("ReadOrders") and " cannot " in line for line in lines)
    assert any(line.startswith("Amounts") and line.split()[1] == "runs" for line in lines)
    assert lines[-1].startswith("7 transforms: 5 run, 0 run with a caveat, 2 cannot run")
