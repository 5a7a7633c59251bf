"""A user's script whose values are instances of classes it defines itself,
run as ``__main__`` by tests/test_main_classes.py: a frozen dataclass, an
``Enum`` (the grouping key), a ``namedtuple`` and a class with neither
equality nor a ``__reduce__``, all crossing groupings."""
from __future__ import annotations

import collections
import dataclasses
import enum
import sys

import apache_beam as beam


@dataclasses.dataclass(frozen=True)
class Purchase:
    user: str
    cents: int


class Tier(enum.Enum):
    BRONZE = 0
    SILVER = 1
    GOLD = 2


Pair = collections.namedtuple("Pair", "index purchase")


class Basket:
    def __init__(self, items: list) -> None:
        self.items = items


def build(p: beam.Pipeline) -> beam.PCollection:
    purchases = (p | beam.Create(range(300))
                 | beam.Map(lambda i: (Tier(i % 3), Pair(i, Purchase(f"u{i % 7}", i)))))
    by_tier = (purchases | "ByTier" >> beam.GroupByKey()
               | beam.MapTuple(lambda t, ps: (t.name, sum(p.purchase.cents for p in ps), len(ps))))
    by_user = (purchases | beam.Map(lambda kv: (kv[1].purchase.user, Basket([kv[1].purchase])))
               | "ByUser" >> beam.GroupByKey()
               | beam.MapTuple(lambda u, bs: (u, sorted(p.cents for b in bs for p in b.items))))
    # Through a Reshuffle, the values are still of the classes the DoFns know.
    kinds = (purchases | beam.Values() | beam.Reshuffle()
             | beam.Map(lambda pair: isinstance(pair, Pair) and isinstance(pair.purchase, Purchase))
             | beam.combiners.Count.PerElement())
    return (by_tier, by_user, kinds) | beam.Flatten()


if __name__ == "__main__":
    from pipeline_outputs import run_and_collect

    RESULT = run_and_collect(sys.argv[1], build, sys.argv[2], sys.argv[3:])
