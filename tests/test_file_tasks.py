"""Parts of files packed into Spark tasks: every part read once, in order, in few tasks."""
from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from beam_ext.runner.native._file_tasks import OPEN_COST, packed, parts_rdd


@given(sizes=st.lists(st.integers(0, 50 << 20), max_size=60), parallelism=st.integers(1, 16))
def test_runs_are_neighbours_in_order_and_within_a_share(sizes, parallelism):
    parts = [(i, size) for i, size in enumerate(sizes)]
    runs = packed(parts, parallelism)
    assert [part for run in runs for part in run] == list(range(len(sizes)))
    assert all(runs)
    share = -(-sum(size + OPEN_COST for size in sizes) // parallelism)
    for run in runs:
        if len(run) > 1:
            assert sum(sizes[i] + OPEN_COST for i in run) <= share
    # Two neighbouring runs together outweigh a share (else they were one): at most 2 x parallelism runs.
    assert len(runs) <= 2 * parallelism


def test_many_small_parts_take_one_task_per_core_and_large_ones_a_task_each():
    assert len(packed([(i, 100) for i in range(200)], 2)) == 2
    assert packed([("a", 64 << 20), ("b", 1), ("c", 1), ("d", 64 << 20)], 2) == [["a", "b"], ["c", "d"]]
    assert packed([("a", 64 << 20), ("b", 64 << 20)], 2) == [["a"], ["b"]]
    assert packed([], 4) == []


def _numbers(part):
    return range(part * 10, part * 10 + part % 3)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 8 << 20), max_size=25), parallelism=st.integers(1, 4))
def test_each_part_is_read_once_in_order_on_spark(spark, sizes, parallelism):
    rdd = parts_rdd(spark.sparkContext, [(i, size) for i, size in enumerate(sizes)], parallelism, _numbers)
    assert rdd.collect() == [n for i in range(len(sizes)) for n in _numbers(i)]
    assert rdd.getNumPartitions() == max(1, len(packed([(i, s) for i, s in enumerate(sizes)], parallelism)))
