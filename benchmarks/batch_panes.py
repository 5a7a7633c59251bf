"""A batch GroupByKey's panes in fixed windows and sessions: Beam's general trigger driver against beam_ext's.

In one process, no Spark: one key's values (one every 15 s, so four per
one-minute window; in sessions of a 10-s gap, one value each) grouped into
panes by Beam's ``GeneralTriggerDriver`` (what
``create_trigger_driver(windowing, is_batch=True)`` gives any windowing but
the default) and by ``beam_ext.runner._batch_panes``' drivers
(``OnTimePanes``, ``MergedOnTimePanes``), for a growing number of windows. A
secondary, in-process figure: what a grouping task spends per value; the
end-to-end figures are ``runner_ab.py windowed sessions``.

    python benchmarks/batch_panes.py
"""
from __future__ import annotations

import argparse
import time

from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_ext.runner._batch_panes import pane_driver

WINDOWINGS = {"fixed, 1 minute": Windowing(window.FixedWindows(60)), "sessions, 10-s gap": Windowing(window.Sessions(10))}


def _values(fn, windows: int) -> list:
    out = []
    for i in range(windows * 4):
        ts = Timestamp(i * 15)
        out.append(WindowedValue(i, ts, tuple(fn.assign(window.WindowFn.AssignContext(ts, i)))))
    return out


def _best(driver_of, values, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        driver = driver_of()
        start = time.perf_counter()
        for _ in driver.process_entire_key("k", values):
            pass
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[50, 200, 800],
                        help="one-minute spans of values (four values each)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print("In-process, secondary: one key, a value every 15 s; best of", args.repeat)
    print("| windowing | panes | values | Beam's driver us/value | beam_ext's us/value | ratio |\n"
          "|---|---:|---:|---:|---:|---:|")
    for name, windowing in WINDOWINGS.items():
        for windows in args.windows:
            values = _values(windowing.windowfn, windows)
            beams = _best(lambda: trigger.GeneralTriggerDriver(windowing, None), values, args.repeat)
            ours = _best(lambda: pane_driver(windowing), values, args.repeat)
            n = len(values)
            panes = sum(1 for _ in pane_driver(windowing).process_entire_key("k", values))
            print(f"| {name} | {panes} | {n} | {beams / n * 1e6:.1f} | {ours / n * 1e6:.2f} | {beams / ours:.0f}x |")


if __name__ == "__main__":
    main()
