"""The integer-microsecond window assignment against Beam's own ``assign``, and window keys against window equality."""
from __future__ import annotations

import pickle

import pytest
from apache_beam import coders
from apache_beam.transforms import window
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.runner import _window_assign
from beam_ext.runner._window_assign import assigner, keyed_assigner
from beam_ext.runner._window_keys import max_timestamp_micros, window_key

# Microsecond sizes and offsets, so windows not a whole number of seconds are covered.
_SIZES = st.integers(1, 10**9)
_TIMES = st.one_of(st.integers(-10**12, 10**12), st.integers(-10**17, 10**17))


def _beam(windowfn, micros: int) -> tuple:
    return tuple(windowfn.assign(window.WindowFn.AssignContext(Timestamp(micros=micros))))


@settings(max_examples=300, deadline=None)
@given(size=_SIZES, offset=st.integers(-10**10, 10**10), times=st.lists(_TIMES, min_size=1, max_size=20))
def test_fixed_windows_are_beams(size, offset, times):
    windowfn = window.FixedWindows(window.Duration(micros=size), Timestamp(micros=offset))
    windows_at, keyed_at = assigner(windowfn), keyed_assigner(windowfn)
    for micros in times + times:  # again, from the cache
        assert windows_at(micros) == _beam(windowfn, micros)
        assert keyed_at(micros) == tuple((window_key(w), w) for w in _beam(windowfn, micros))


@settings(max_examples=300, deadline=None)
@given(size=_SIZES, period=_SIZES, offset=st.integers(-10**10, 10**10),
       times=st.lists(_TIMES, min_size=1, max_size=20))
def test_sliding_windows_are_beams_in_beams_order(size, period, offset, times):
    # Beam allows a period longer than the size (gaps) and one that does not divide it.
    period = min(max(period, size // 20), size * 3)  # at most 20 windows per element
    windowfn = window.SlidingWindows(window.Duration(micros=size), window.Duration(micros=period),
                                     Timestamp(micros=offset))
    windows_at, keyed_at = assigner(windowfn), keyed_assigner(windowfn)
    for micros in times + [t + 1 for t in times] + times:
        assert windows_at(micros) == _beam(windowfn, micros)
        assert keyed_at(micros) == tuple((window_key(w), w) for w in _beam(windowfn, micros))


@settings(max_examples=100, deadline=None)
@given(gap=_SIZES, times=st.lists(_TIMES, min_size=1, max_size=20))
def test_session_windows_are_beams(gap, times):
    windowfn = window.Sessions(window.Duration(micros=gap))
    for micros in times:
        assert assigner(windowfn)(micros) == _beam(windowfn, micros)


def test_the_global_window_is_beams():
    assert assigner(window.GlobalWindows())(123) == (window.GlobalWindow(),)


class _Shifted(window.FixedWindows):
    def assign(self, context):
        return [window.IntervalWindow(context.timestamp, context.timestamp + 1)]


class _Gaps(window.Sessions):
    pass


def test_other_window_functions_keep_their_own_assign():
    assert assigner(_Shifted(5)) is None
    assert assigner(_Gaps(5)) is None
    # Keyed windows: fixed and sliding only.
    for windowfn in (_Shifted(5), window.Sessions(5), window.GlobalWindows()):
        assert keyed_assigner(windowfn) is None


def test_the_cache_starts_over_when_full(monkeypatch):
    monkeypatch.setattr(_window_assign, "CACHED", 4)
    windowfn = window.FixedWindows(1)
    windows_at = assigner(windowfn)
    for second in range(20):
        assert windows_at(second * 1_000_000 + 5) == _beam(windowfn, second * 1_000_000 + 5)
    cache = windows_at.__closure__[0].cell_contents
    assert 1 <= len(cache) <= 4


@pytest.mark.parametrize("micros", [-1, 0, 59_999_999, 60_000_000, -60_000_001])
def test_fixed_window_edges(micros):
    windowfn = window.FixedWindows(60)
    assert assigner(windowfn)(micros) == _beam(windowfn, micros)


_BOUND = st.one_of(st.integers(-10**12, 10**12), st.sampled_from(
    [MIN_TIMESTAMP.micros - 5, MIN_TIMESTAMP.micros, MAX_TIMESTAMP.micros, MAX_TIMESTAMP.micros + 5]))


def _window(bounds) -> window.IntervalWindow:
    start, end = sorted(bounds)
    return window.IntervalWindow(Timestamp(micros=start), Timestamp(micros=end))


@settings(max_examples=300, deadline=None)
@given(a=st.tuples(_BOUND, _BOUND), b=st.tuples(_BOUND, _BOUND))
def test_window_keys_are_equal_exactly_when_the_windows_are(a, b):
    coder = coders.coders.IntervalWindowCoder()
    for w in (_window(a), coder.decode(coder.encode(_window(a)))):
        v = _window(b)
        assert (window_key(w) == window_key(v)) == (w == v)
        if w == v:
            assert hash(window_key(w)) == hash(window_key(v))
        if w.end < MAX_TIMESTAMP:
            assert max_timestamp_micros(w) == w.max_timestamp().micros
    assert window_key(window.GlobalWindow()) == window.GlobalWindow()


_MICROS = st.one_of(st.integers(MIN_TIMESTAMP.micros, MAX_TIMESTAMP.micros), st.integers(-2**70, 2**70),
                    st.sampled_from([-2**63 - 1, -2**63, 2**63 - 1, 2**63]))


@settings(max_examples=300, deadline=None)
@given(start=_MICROS, end=_MICROS)
def test_a_window_made_from_micros_is_beams(start, end):
    # Made as Beam's coder decodes one; the fast way is this Beam's (a Beam
    # whose window state differs falls back to the constructor; this says so).
    # Bounds beyond 64 bits (a sliding window of an element at the end of
    # time) are clamped as Beam's constructor clamps them.
    assert _window_assign.interval is _window_assign._interval_of_micros
    made = _window_assign.interval(start, end)
    want = window.IntervalWindow(Timestamp(micros=start), Timestamp(micros=end))
    assert type(made) is window.IntervalWindow
    assert made == want and hash(made) == hash(want) and repr(made) == repr(want)
    assert (made.start, made.end, made.max_timestamp()) == (want.start, want.end, want.max_timestamp())
    if MIN_TIMESTAMP.micros <= min(start, end) and max(start, end) <= MAX_TIMESTAMP.micros:
        coder = coders.coders.IntervalWindowCoder()
        assert coder.encode(made) == coder.encode(want)
    assert pickle.loads(pickle.dumps(made)) == want
