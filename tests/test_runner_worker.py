"""The task worker on its own: a fused stage run under a given watermark, no Spark job."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import TimerSpec, on_timer
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_ext.runner.planning import plan_pipeline
from beam_ext.runner.worker import METRICS_OUTPUT, run_stage_partition


class _FireAt(beam.DoFn):
    """Sets an event-time timer at the element's value; emits when it fires."""

    TIMER = TimerSpec("t", TimeDomain.WATERMARK)

    def process(self, kv, timer=beam.DoFn.TimerParam(TIMER)):
        timer.set(Timestamp(kv[1]))

    @on_timer(TIMER)
    def fired(self, key=beam.DoFn.KeyParam):
        yield f"fired:{key}"


def _stateful_stage():
    p = beam.Pipeline()
    _ = (p | beam.Create([("a", 10), ("b", 30)]) | beam.ParDo(_FireAt()) | beam.Map(print))
    plan = plan_pipeline(p.to_runner_api(), bundle_bytes=1 << 20, partitions=1)
    return next(s for s in plan.stages if s.keyed)


def _fired_keys(stage, watermark, capsys) -> list[str]:
    impl = stage.input_coders[0].get_impl()
    out = create_OutputStream()
    for key, at in [("a", 10), ("b", 30)]:
        impl.encode_to_stream(WindowedValue((key, at), 0, [window.GlobalWindow()]), out, True)
    records = list(run_stage_partition(stage.spec, None, [(0, out.get())], watermark))
    assert records[-1][0] == METRICS_OUTPUT
    # The stage ends in Map(print): what fired is what it printed.
    return sorted(line.split(":")[1] for line in capsys.readouterr().out.split())


def test_event_time_timers_fire_only_when_due_under_the_task_watermark(capsys):
    stage = _stateful_stage()
    assert _fired_keys(stage, Timestamp(5), capsys) == []
    assert _fired_keys(stage, Timestamp(10), capsys) == ["a"]
    assert _fired_keys(stage, Timestamp(29), capsys) == ["a"]
    assert _fired_keys(stage, MAX_TIMESTAMP, capsys) == ["a", "b"]
