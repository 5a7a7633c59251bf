"""State cost per micro-batch of one streaming partition: memory backend vs spill backend.

What a streaming task does with its bag state around the user code, for
``--keys`` bags that each get one ``--value-bytes`` value per batch (state
grows every batch, nothing is cleared, as for windows kept open for late
data), over ``--batches`` batches:

* ``memory``: restore the previous version (unpickle every bag), append,
  save the new version (pickle every bag, fsync, rename) -- what
  ``--spark_state_backend=memory`` does in streaming;
* ``spill``: restore the previous version's manifest, open the partition's
  SpillStore (lock, index, collect unreferenced segments), append, seal
  (flush, sync), save the manifest with the version.

No Spark: this is the per-partition cost a task adds to its batch.

    python benchmarks/streaming_spill_state.py --keys 10000 --batches 5   # ~1 min
    python benchmarks/streaming_spill_state.py --keys 1000 --batches 5
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from apache_beam.portability.api import beam_fn_api_pb2

from beam_ext.runner.state import _versioned as versioned
from beam_ext.runner.state._versioned_spill import open_partition_state


def _keys(n: int) -> list[beam_fn_api_pb2.StateKey]:
    return [beam_fn_api_pb2.StateKey(bag_user_state=beam_fn_api_pb2.StateKey.BagUserState(
        transform_id="ref_AppliedPTransform_Panes_7", user_state_id="values",
        key=f"user-{i}".encode(), window=b"\x00" * 16)) for i in range(n)]


def _memory(root: str, keys, batches: int, value: bytes) -> list[float]:
    times = []
    encoded = [k.SerializeToString() for k in keys]
    for batch in range(batches):
        start = time.perf_counter()
        saved = versioned.read(root, "stage1", 0, batch - 1) if batch else None
        versioned._CACHE.clear()  # another worker may run the next batch: count the file read
        state = saved["state"] if saved else {}
        for key in encoded:
            state.setdefault(key, []).append(value)
        versioned.write(root, "stage1", 0, batch, {"state": state, "timers": {}, "deferred": []})
        versioned.prune(root, "stage1", {batch})
        times.append(time.perf_counter() - start)
    return times


def _spill(root: str, keys, batches: int, value: bytes, memory_bytes: int) -> list[float]:
    times = []
    for batch in range(batches):
        start = time.perf_counter()
        saved = versioned.read(root, "stage1", 0, batch - 1) if batch else None
        versioned._CACHE.clear()
        state = open_partition_state({}, root, "stage1", 0, batch, memory_bytes,
                                     saved["spill"] if saved else {})
        try:
            for key in keys:
                state.append_raw(key, value)
            chains = state.seal()
        finally:
            state.close()
        versioned.write(root, "stage1", 0, batch, {"state": {}, "timers": {}, "deferred": [], "spill": chains})
        versioned.prune(root, "stage1", {batch})
        times.append(time.perf_counter() - start)
    return times


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--memory", type=int, default=64 << 20, help="spill store budget, bytes")
    args = parser.parse_args()
    keys = _keys(args.keys)
    value = b"v" * args.value_bytes
    print(f"{args.keys} keys, {args.batches} batches, one {args.value_bytes}-byte value per key and batch")
    print(f"{'backend':8} {'first ms':>9} {'last ms':>9} {'mean ms':>9} {'on disk MiB':>12}")
    for name in ("memory", "spill"):
        root = tempfile.mkdtemp(prefix=f"beam_ext-bench-{name}-")
        try:
            if name == "memory":
                times = _memory(root, keys, args.batches, value)
            else:
                times = _spill(root, keys, args.batches, value, args.memory)
            print(f"{name:8} {times[0] * 1e3:9.1f} {times[-1] * 1e3:9.1f} "
                  f"{sum(times) / len(times) * 1e3:9.1f} {_du(root) / 2**20:12.1f}")
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
