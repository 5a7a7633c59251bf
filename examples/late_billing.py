"""Late usage records folded into past billing windows (LateWindowedGroupByKey).

Usage events per customer are billed in 20-second windows. Some events arrive
late (after the watermark passed their window); each late batch re-emits the
window's total as a LATE pane, until the window closes 60 s after its end;
events after that go to the dead-letter output.

    python examples/late_billing.py
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import window

from beam_ext.transforms import EveryNLateEvents, LateWindowedGroupByKey


def _usage(customer: str, cents: int, ts: float) -> window.TimestampedValue:
    return window.TimestampedValue((customer, cents), ts)


def main() -> None:
    stream = (TestStream()
              .add_elements([_usage("acme", 120, 3.0), _usage("acme", 80, 11.0),
                             _usage("zeta", 50, 15.0)])
              .advance_watermark_to(20.0)                       # on-time panes
              .add_elements([_usage("acme", 30, 5.0)])          # late: 15 s behind
              .add_elements([_usage("acme", 10, 7.0)])          # late again
              .advance_watermark_to(90.0)                       # window [0, 20) closed at 80
              .add_elements([_usage("acme", 999, 9.0)])         # too late: dead letter
              .advance_watermark_to_infinity())

    def show(element, pane=beam.DoFn.PaneInfoParam, w=beam.DoFn.WindowParam):
        customer, cents = element
        timing = {0: "EARLY", 1: "ON_TIME", 2: "LATE"}[pane.timing]
        print(f"{customer} [{w.start.micros / 1e6:.0f}, {w.end.micros / 1e6:.0f}) "
              f"total={sum(cents)} pane={pane.index} {timing} last={pane.is_last}")

    with beam.Pipeline(runner="BundleBasedDirectRunner") as p:
        bills, dead = (p | stream
                       | beam.WindowInto(window.FixedWindows(20))
                       | LateWindowedGroupByKey(trigger=EveryNLateEvents(1), cleanup=60.0)
                       .with_dead_letters())
        bills | "Show" >> beam.Map(show)
        dead | "Dead" >> beam.Map(lambda e: print(f"dead letter: {e}"))


if __name__ == "__main__":
    main()
