"""Memory the tracker's table holds for substreams nobody ever promises.

Usage: python scripts/tracker_open_substreams.py [REPORTS] [MAX_OPEN]

Reports REPORTS substreams that no source will promise (so none can end)
into a 2-source, 4-middle, 2-sink graph, with the table's bound on open
substreams set to MAX_OPEN (default: none, the bare table; TrackerService
bounds it at 10,000 unless told otherwise), and prints how
much the table grew.
"""
from __future__ import annotations

import sys
import tracemalloc

from beam_ext.watermark._table import Batch, TableFull, TrackerTable


def main(reports: int, max_open: int | None) -> None:
    graph: dict[str, list[str]] = {f"src/{i}": [] for i in range(2)}
    graph.update({f"mid/{i}": [f"src/{j}" for j in range(2)] for i in range(4)})
    graph.update({f"sink/{i}": [f"mid/{j}" for j in range(4)] for i in range(2)})
    table = TrackerTable(max_open_substreams=max_open) if max_open else TrackerTable()
    table.register_graph(graph)
    tracemalloc.start()
    refused = 0
    for k in range(reports):
        try:
            table.apply(Batch("src/0", k + 1, entries=[(k, "mid/0", 2 * k + 1)], labels=[(k, k)]))
        except TableFull:
            refused += 1
            table.apply(Batch("src/0", k + 1))  # the agent's next batch keeps the numbering
    grown = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"{reports} never-promised substreams, bound {table.max_open_substreams}: "
          f"{table.open_count} open, {refused} refused, table grew {grown / 1e6:.1f} MB")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000,
         int(sys.argv[2]) if len(sys.argv) > 2 else None)
