"""Objects moved between tasks as the standard pickler's bytes (runner/_object_shuffle.py)."""
from __future__ import annotations

import pickle
import sys
import types

from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.runner import _object_shuffle


def test_elements_go_by_the_standard_pickler_and_come_back_equal():
    batch = [WindowedValue((i, str(i)), Timestamp(micros=i), (IntervalWindow(0, 60),)) for i in range(5)]
    data = _object_shuffle.dumps(batch)
    assert data == pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)
    assert pickle.loads(data) == batch


def test_what_the_standard_pickler_refuses_goes_by_cloudpickle():
    data = _object_shuffle.dumps([lambda x: x + 1, 2])
    fn, two = pickle.loads(data)
    assert fn(two) == 3


def test_a_class_of_main_travels_by_value(monkeypatch):
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    event = type("Event", (), {"__module__": "__main__", "__eq__": lambda a, b: vars(a) == vars(b)})
    main.Event = event
    value = event()
    value.amount = 3
    data = _object_shuffle.dumps([value])
    del main.Event  # the reading task's __main__ may not have it
    (back,) = pickle.loads(data)
    assert back.amount == 3 and type(back).__name__ == "Event"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers() | st.text(max_size=5), max_size=6)),
                max_size=20))
def test_each_object_reaches_its_target_task(spark, pairs):
    rdd = spark.sparkContext.parallelize(pairs, 2)
    parts = _object_shuffle.shuffled(rdd, 3).glom().collect()
    assert len(parts) == 3
    for target, objects in enumerate(parts):
        assert sorted(map(repr, objects)) == sorted(repr(obj) for t, obj in pairs if t == target)


def test_global_window_elements_keep_their_windowing(spark):
    batch = [WindowedValue(i, Timestamp(micros=-i), (GlobalWindow(),)) for i in range(1000)]
    rdd = spark.sparkContext.parallelize([(1, batch[:500]), (0, batch[500:])], 2)
    assert _object_shuffle.shuffled(rdd, 2).collect() == [batch[500:], batch[:500]]
