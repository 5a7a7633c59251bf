"""Beam's own example pipelines on SparkRunner, unchanged but for ``--runner``.

Each example's ``run(argv)`` is called twice on the same small inputs: once
on Beam's DirectRunner, once with ``--runner=beam_ext.runner.SparkRunner``
and the flags a Dataflow job would carry. The written files must hold the
same lines. Inputs come from Beam's own tests of the examples where they
have sample data. The migration checker calls these examples runnable
(tests/test_migrate_check.py); here they run.
"""
from __future__ import annotations

import glob
import json

import apache_beam as beam
import pytest
from apache_beam.examples import wordcount, wordcount_minimal

# Modules, not their TestCase classes: pytest would collect those again here.
from apache_beam.examples.complete.game import hourly_team_score, hourly_team_score_test, user_score, user_score_test
from apache_beam.examples.cookbook import (
    coders,
    coders_test,
    custom_ptransform,
    group_with_coder,
    mergecontacts,
    mergecontacts_test,
    multiple_output_pardo,
)
from apache_beam.options.pipeline_options import PipelineOptions

SPARK = "--runner=beam_ext.runner.SparkRunner"
DIRECT = "--runner=DirectRunner"

_TEXT = """\
It was the best of times, it was the worst of times, it was the age of
wisdom, it was the age of foolishness, it was the epoch of belief, it was
the epoch of incredulity, it was the season of Light, it was the season of
Darkness, it was the spring of hope, it was the winter of despair.
"""


def _dataflow_flags(tmp_path) -> list[str]:
    """What a Dataflow job's command line typically carries besides --runner."""
    return ["--project=my-project", "--region=europe-west1", f"--temp_location={tmp_path}/tmp",
            "--job_name=examples-on-spark", "--num_workers=2", "--max_num_workers=4"]


def _lines(pattern: str) -> list[str]:
    out = []
    for path in glob.glob(pattern):
        with open(path, encoding="utf-8") as f:
            out.extend(f.read().splitlines())
    return sorted(out)


def _both(tmp_path, run, args: list[str], outputs: list[str]) -> None:
    """Runs ``run(args + runner flags)`` on both runners and compares every output."""
    got = {}
    for name, flags in (("direct", [DIRECT]), ("spark", [SPARK, *_dataflow_flags(tmp_path)])):
        out = tmp_path / name
        out.mkdir()
        run([a.replace("{out}", str(out)) for a in args] + flags)
        got[name] = {o: _lines(f"{out}/{o}*") for o in outputs}
    for o in outputs:
        assert got["direct"][o], f"DirectRunner wrote nothing to {o}"
    assert got["spark"] == got["direct"]


def _write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_wordcount(spark, tmp_path):
    text = _write(tmp_path / "in.txt", _TEXT)
    _both(tmp_path, lambda argv: wordcount.run(argv, save_main_session=False),
          [f"--input={text}", "--output={out}/counts"], ["counts"])


def test_wordcount_minimal(spark, tmp_path):
    text = _write(tmp_path / "in.txt", _TEXT)
    _both(tmp_path, wordcount_minimal.main, [f"--input={text}", "--output={out}/counts"], ["counts"])


def test_multiple_output_pardo(spark, tmp_path):
    text = _write(tmp_path / "in.txt", _TEXT)
    _both(tmp_path, lambda argv: multiple_output_pardo.run(argv, save_main_session=False),
          [f"--input={text}", "--output={out}/res"], ["res-chars", "res-short-words", "res-words"])


def test_custom_ptransform(spark, tmp_path):
    text = _write(tmp_path / "in.txt", _TEXT)
    _both(tmp_path, custom_ptransform.run, [f"--input={text}", "--output={out}/res"], ["res"])


def test_group_with_coder(spark, tmp_path):
    players = "\n".join(f"{name},{score}" for name, score in [
        ("joe", 10), ("fred", 3), ("fred", 2), ("mary", 7), ("joe", 1), ("ann", 4)])
    text = _write(tmp_path / "in.txt", players + "\n")
    _both(tmp_path, lambda argv: group_with_coder.run(argv, save_main_session=False),
          [f"--input={text}", "--output={out}/res"], ["res"])


def test_coders(spark, tmp_path):
    records = _write(tmp_path / "in.json",
                     "".join(json.dumps(r) + "\n" for r in coders_test.CodersTest.SAMPLE_RECORDS))
    _both(tmp_path, coders.run, [f"--input={records}", "--output={out}/res"], ["res"])


def test_mergecontacts(spark, tmp_path):
    paths = {kind: _write(tmp_path / f"{kind}.txt", getattr(mergecontacts_test.MergeContactsTest, f"CONTACTS_{kind.upper()}"))
             for kind in ("email", "phone", "snailmail")}
    _both(tmp_path, lambda argv: mergecontacts.run(argv, assert_results=(2, 1, 3), save_main_session=False),
          [f"--input_email={paths['email']}", f"--input_phone={paths['phone']}",
           f"--input_snailmail={paths['snailmail']}", "--output_tsv={out}/res.tsv",
           "--output_stats={out}/res.stats"], ["res.tsv"])


def test_user_score(spark, tmp_path):
    events = _write(tmp_path / "events.csv", "\n".join(user_score_test.UserScoreTest.SAMPLE_DATA) + "\n")
    _both(tmp_path, lambda argv: user_score.run(argv, save_main_session=False),
          [f"--input={events}", "--output={out}/res"], ["res"])


@pytest.mark.parametrize("runner", [DIRECT, SPARK])
def test_hourly_team_score(spark, tmp_path, runner):
    """``hourly_team_score.run`` writes to BigQuery, which needs Google Cloud
    (``python -m beam_ext.migrate check`` says so); its computation, read
    from text, gives Beam's expected sums on both runners."""
    events = _write(tmp_path / "events.csv", "\n".join(hourly_team_score_test.HourlyTeamScoreTest.SAMPLE_DATA) + "\n")
    out = tmp_path / "res"
    with beam.Pipeline(options=PipelineOptions([runner, *_dataflow_flags(tmp_path)])) as p:
        (p
         | beam.io.ReadFromText(events)
         | hourly_team_score.HourlyTeamScore(start_min="2015-11-16-15-20", stop_min="2015-11-16-17-20",
                                             window_duration=60)
         | beam.MapTuple(lambda team, score: f"{team},{score}")
         | beam.io.WriteToText(str(out)))
    assert _lines(f"{out}*") == ["team1,18", "team2,2", "team3,13"]
