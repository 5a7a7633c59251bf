"""Batches of elements between steps on objects: nothing lost, reordered or rewindowed.

Oracle: the elements one by one, as ``WindowedValue`` objects.
"""
from __future__ import annotations

import pickle

from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import given
from hypothesis import strategies as st

from beam_ext.runner._element_batches import (
    BATCH,
    BOUNDED,
    Same,
    as_batch,
    batched,
    bounded_batches,
    values_per_window,
    windowed,
)

_WINDOWS = [(GlobalWindow(),), (IntervalWindow(0, 4),), (IntervalWindow(0, 4), IntervalWindow(2, 6)), ()]
_PANES = [PaneInfo(True, True, PaneInfoTiming.ON_TIME, 0, 0), PaneInfo(True, False, PaneInfoTiming.EARLY, 0, -1)]

_elements = st.lists(st.builds(
    lambda v, t, w, p: WindowedValue(v, t, _WINDOWS[w], _PANES[p]),
    st.one_of(st.integers(), st.none(), st.text(max_size=3)), st.sampled_from([-5, 0, 3]),
    st.integers(0, len(_WINDOWS) - 1), st.integers(0, 1)), max_size=1200)


@given(_elements, st.booleans())
def test_batches_give_back_every_element_in_order(elements, shared):
    if shared and elements:  # all of one windowing, as a bounded read's
        elements = [elements[0].with_value(wv.value) for wv in elements]
    batches = [as_batch(b) for b in batched(elements)]
    assert all(len(windowed(b)) <= BATCH for b in batches)
    assert [wv for b in batches for wv in windowed(b)] == elements
    if shared and elements:
        assert all(type(b) is Same for b in batches)
    # A sink writes each value once per window.
    assert list(values_per_window(batches)) == [wv.value for wv in elements for _ in wv.windows]
    # Batches cross Spark's serializer whole.
    assert [wv for b in pickle.loads(pickle.dumps(batches)) for wv in windowed(b)] == elements


def test_bounded_batches_of_a_list_and_of_a_generator_are_alike():
    values = list(range(2 * BATCH + 3))
    from_list = list(bounded_batches(values))
    from_generator = list(bounded_batches(iter(values)))
    assert [len(b.values) for b in from_list] == [len(b.values) for b in from_generator] == [BATCH, BATCH, 3]
    assert [wv for b in from_list for wv in windowed(b)] == [BOUNDED.with_value(v) for v in values]
