"""A GroupByKey's two ends in one process, per element: its shuffle write and its read into an object stage.

Times, over 400,000 ``(int key, int value)`` pairs drawn from 200,000 keys
(the shape of ``runner_throughput.py``'s GroupByKey), in one process:

- write: packing the pairs into shuffle blobs from a batch of values, as a
  generator of encoded pairs into ``Buckets.add`` (the path before
  2026-11-27) and as ``Buckets.add_values``, which encodes in its own loop;
- read: grouping the blobs and handing the groups to an object stage, as
  encoded chunks that the stage decodes (``GroupReader.read`` then
  ``decoded_batches``, the path before 2026-11-27) and as objects
  (``GroupReader.read_batches``);
- both ends together, the values written as pairs (``Buckets.add_values``)
  and gathered by key first (``KeyedValues``, which writes pairs itself
  once it sees keys rarely repeat, as they do at 200,000 keys; ``--keys
  1000`` gives each key 400 values);
- the write gathered by key pair by pair (``KeyedValues.add``) and a batch
  at a time (``KeyedValues.add_batch``, as a stage on objects writes since
  2026-12-01).

Both paths of each end are in the same checkout and run alternately, so
the ratios hold however the machine's speed drifts. Prints the minimum of
7 runs in nanoseconds per pair:

    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/group_read.py [--keys 1000]

This is a secondary, in-process figure: the pipelines users run are timed by
``runner_throughput.py`` and ``runner_ab.py`` (case ``gbk``).
"""
from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any, Callable

from apache_beam import coders
from apache_beam.transforms.core import Windowing
from apache_beam.transforms.window import GlobalWindows

import beam_ext
from beam_ext.runner._element_batches import BATCH
from beam_ext.runner._shuffle import Buckets, GroupReader, KeyedValues, ShuffleWriter
from beam_ext.runner.worker._direct import decoded_batches

PAIRS, KEYS, RUNS, PARTITIONS = 400_000, 200_000, 7, 2
BUNDLE_BYTES = 1 << 20


def _alternating(cases: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Nanoseconds per pair of each case: the minimum of ``RUNS``, the cases taking turns."""
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(RUNS):
        for label, fn in cases.items():
            start = time.perf_counter()
            fn()
            best[label] = min(best[label], time.perf_counter() - start)
    return {label: seconds / PAIRS * 1e9 for label, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=KEYS)
    keys = parser.parse_args().keys
    # Python workers run with this young-generation threshold (runner/worker/_gc.py).
    gc.set_threshold(100_000)
    rng = random.Random(1)
    kvs = [(rng.randrange(keys), i) for i in range(PAIRS)]
    batches = [kvs[i:i + BATCH] for i in range(0, PAIRS, BATCH)]
    any_coder = coders.FastPrimitivesCoder()
    window_coder = coders.coders.GlobalWindowCoder()
    pre = coders.WindowedValueCoder(coders.TupleCoder([any_coder, any_coder]), window_coder)
    post = coders.WindowedValueCoder(coders.TupleCoder([any_coder, coders.IterableCoder(any_coder)]), window_coder)
    writer = ShuffleWriter(pre, trivial=True)
    encoders = writer.value_encoders()

    def write(add: Callable[[Buckets, list], Any]) -> list[bytes]:
        buckets = Buckets(PARTITIONS)
        blobs = [blob for batch in batches for _, blob in add(buckets, batch)]
        return blobs + [blob for _, blob in buckets.flush()]

    def pairs(buckets: Buckets, batch: list) -> Any:
        return buckets.add(writer.value_pairs(batch))

    def in_place(buckets: Buckets, batch: list) -> Any:
        return buckets.add_values(batch, *encoders)

    blobs = write(in_place)
    assert blobs == write(pairs)
    reader = GroupReader(pre, post, Windowing(GlobalWindows()), trivial=True)

    def encoded() -> list:
        return list(decoded_batches(post, BUNDLE_BYTES, reader.read(blobs)))

    def objects() -> list:
        return list(reader.read_batches(blobs, post, BUNDLE_BYTES, BATCH))

    assert [wv for b in encoded() for wv in b] == [wv for b in objects() for wv in b]
    print(f"beam_ext from {beam_ext.__file__}")
    print(f"{PAIRS:,} pairs, {keys:,} keys, minimum of {RUNS} runs, ns per pair")
    times = _alternating({"write, pairs then Buckets.add": lambda: write(pairs),
                          "write, Buckets.add_values": lambda: write(in_place),
                          "read, encoded then decoded": encoded,
                          "read, objects (read_batches)": objects})
    for label, ns in times.items():
        print(f"  {label:32s} {ns:7.0f}")
    print(f"write: {times['write, pairs then Buckets.add'] / times['write, Buckets.add_values']:.2f}x, "
          f"read: {times['read, encoded then decoded'] / times['read, objects (read_batches)']:.2f}x faster")

    def gathered() -> list[bytes]:
        keyed = KeyedValues(PARTITIONS)
        blobs = [blob for batch in batches for _, blob in keyed.add(batch, *encoders)]
        return blobs + [blob for _, blob in keyed.flush()]

    def groups(blobs: list[bytes]) -> dict:
        return {wv.value[0]: sorted(wv.value[1]) for b in reader.read_batches(blobs, post, BUNDLE_BYTES, BATCH)
                for wv in b}

    def gathered_apart() -> list[bytes]:
        keyed = KeyedValues(PARTITIONS)
        blobs = [blob for batch in batches
                 for _, blob in keyed.add_batch(batch, None, *encoders)]
        return blobs + [blob for _, blob in keyed.flush()]

    assert groups(gathered()) == groups(blobs) == groups(gathered_apart())
    both = _alternating({"both ends, pairs": lambda: groups(write(in_place)),
                         "both ends, gathered by key": lambda: groups(gathered())})
    for label, ns in both.items():
        print(f"  {label:32s} {ns:7.0f}")
    print(f"both ends: {both['both ends, pairs'] / both['both ends, gathered by key']:.2f}x faster gathered")
    apart = _alternating({"write, gathered, add": gathered, "write, gathered, add_batch": gathered_apart})
    for label, ns in apart.items():
        print(f"  {label:32s} {ns:7.0f}")
    print(f"gathered write: {apart['write, gathered, add'] / apart['write, gathered, add_batch']:.2f}x faster "
          "a batch at a time")


if __name__ == "__main__":
    main()
