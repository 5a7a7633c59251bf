"""Beam's schema-aware ``GroupBy`` read by field name.

``GroupBy(...).aggregate_field(...)`` goes into a partial combine of plain
accumulators, which must give what Beam's own ``Map`` and
``TupleCombineFn`` give: the same keys (Beam's ``Key`` rows) and
accumulators, to the bit. A ``GroupBy`` without aggregation gets an equal
``Map`` function that builds its key function once, and right before the
shuffle of a grouping that gathers each key's values, none: the shuffle's
writer pairs the elements with their keys.
"""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.internal import pickler
from apache_beam.transforms import combiners, core, window
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_outputs import spark_equals_direct

from beam_ext.runner import _element_batches as element_batches
from beam_ext.runner._shuffle import ShuffleWriter
from beam_ext.runner.worker import _direct
from beam_ext.runner.worker._plain_accumulators import plain_tuple_accumulators
from beam_ext.runner.worker._schema_group_by import (
    AggregatedFields,
    _beams_codes,
    aggregated_fields,
    closure,
    grouped_key,
    grouped_pairs,
)


def _applied(build) -> dict:
    """The applied transforms of the pipeline ``build`` makes, by full label."""
    found: dict = {}

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            found[node.full_label] = node.transform

        enter_composite_transform = visit_transform

    p = beam.Pipeline()
    build(p | beam.Create([beam.Row(k=1, x=1.0)]))
    p.visit(Visitor())
    return found


def _map_dofn(grouping) -> tuple:
    """The pickled ``Map`` DoFn of ``grouping`` and its applied transforms by label, as a worker gets them."""
    found = _applied(lambda rows: rows | "G" >> grouping)
    [pardo] = [t for label, t in found.items() if label.startswith("G/Map(")]
    return pickler.loads(pickler.dumps(pardo.fn)), found


def _map_and_combine(grouping) -> tuple:
    """The pickled ``Map`` DoFn and ``CombineFn`` of ``grouping``, as a worker gets them."""
    dofn, found = _map_dofn(grouping)
    [combine] = [t for t in found.values() if isinstance(t, core.CombinePerKey)]
    return dofn, pickler.loads(pickler.dumps(combine.fn))


def _fields(grouping) -> AggregatedFields | None:
    dofn, _ = _map_and_combine(grouping)
    return aggregated_fields(_direct._map_fn(dofn))


def test_this_beams_lambdas_are_known():
    # If a Beam release changes them, the fast path is lost: this fails first.
    assert _beams_codes() is not None


def test_string_fields_are_read_by_name():
    one = _fields(beam.GroupBy("k").aggregate_field("x", sum, "total"))
    assert (one.key_fields, one.value_fields) == (("k",), ("x",))
    more = _fields(beam.GroupBy("k", "j").aggregate_field("x", sum, "s").aggregate_field("y", max, "m"))
    assert (more.key_fields, more.value_fields) == (("k", "j"), ("x", "y"))


def _double_x(r):
    return r.x * 2


@pytest.mark.parametrize("grouping, keys, values", [
    (beam.GroupBy(lambda r: r.k).aggregate_field("x", sum, "total"), (int,), ("x",)),
    (beam.GroupBy("k").aggregate_field(_double_x, sum, "total"), ("k",), (_double_x,)),
    (beam.GroupBy("k", j=len).aggregate_field("x", sum, "total"), ("k", len), ("x",)),
], ids=["callable key", "callable value", "callable keyword key"])
def test_a_callable_key_or_value_is_called(grouping, keys, values):
    fields = _fields(grouping)
    # A lambda comes back from pickling as another function object: compared by what it gives.
    assert [k if type(k) is str or k is len else k(beam.Row(k=3)) for k in fields.key_fields] == [
        k if type(k) is str or k is len else 3 for k in keys]
    assert [v if type(v) is str else v(beam.Row(x=2.0)) for v in fields.value_fields] == [
        v if type(v) is str else 4.0 for v in values]


def test_other_maps_are_not_taken_for_one():
    assert aggregated_fields(lambda x: (x, x)) is None
    assert aggregated_fields(len) is None
    assert grouped_pairs(lambda x: (x, x)) is None


_ROWS = st.lists(st.builds(
    beam.Row, k=st.integers(0, 3), j=st.sampled_from(["a", "b"]),
    x=st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=False, allow_infinity=False)),
    y=st.floats(allow_nan=False, allow_infinity=False, width=32)), max_size=80)
_COMPONENTS = [sum, min, max, combiners.MeanCombineFn(), combiners.CountCombineFn()]


def _key_k(r):
    return r.k


def _x_squared(r):
    return r.x * r.x


# The expressions a grouping may name: fields by name, or callables of the user's.
_EXPRS = {"k": "k", "j": "j", "x": "x", "y": "y", "k()": _key_k, "x*x": _x_squared}


def _grouping(keys: tuple, parts: list):
    grouping = beam.GroupBy(*(_EXPRS[k] for k in keys))
    for i, (field, fn) in enumerate(parts):
        grouping = grouping.aggregate_field(_EXPRS[field], fn, f"out{i}")
    return grouping


def _run_chain(dofn, fn, rows: list, windowing, assign=None) -> list:
    """``rows`` through a chain of the grouping's ``Map`` (after a
    ``WindowInto`` of ``assign``, if given) and its partial combine, as a
    Spark task runs it; its output elements."""
    steps = []
    if assign is not None:
        steps.append(_direct.DirectStep(
            "W", pickler.dumps((_direct.AssignWindows(assign), (), {}, None, None)), window.GlobalWindows()))
    steps.append(_direct.DirectStep("G/Map", pickler.dumps((dofn, (), {}, None, None)), windowing.windowfn))
    chain = _direct.DirectChain(tuple(steps), None, None,
                                precombine=_direct.DirectCombine("G/Precombine", pickler.dumps((fn, [], {})), windowing))
    values = [window.GlobalWindows.windowed_value(row, timestamp=i * 7) for i, row in enumerate(rows)]
    batches = element_batches.batched(iter(values), 9)
    return [wv for batch in _direct.run_direct_chain(chain, None, batches, [], batches_out=True)
            for wv in element_batches.windowed(batch)]


def _beams(dofn, fn, rows: list, windows_of=lambda i: (None,)) -> dict:
    """Beam's own: each row's pair by the ``Map``, added one at a time per key (and window), compacted."""
    pair = _direct._map_fn(dofn)
    accs: dict = {}
    for i, row in enumerate(rows):
        key, values = pair(row)
        for w in windows_of(i):
            accs[key, w] = fn.add_input(accs.get((key, w), fn.create_accumulator()), values)
    return {kw: fn.compact(acc) for kw, acc in accs.items()}


@settings(max_examples=40, deadline=None)
@given(rows=_ROWS, keys=st.sampled_from([("k",), ("k", "j"), ("k()",), ("k()", "j")]),
       parts=st.lists(st.tuples(st.sampled_from(["x", "y", "x*x"]), st.sampled_from(range(len(_COMPONENTS)))),
                      min_size=1, max_size=4))
def test_the_partial_combine_of_fields_equals_beams_to_the_bit(rows, keys, parts):
    grouping = _grouping(keys, [(field, _COMPONENTS[c]) for field, c in parts])
    dofn, fn = _map_and_combine(grouping)
    windowing = core.Windowing(window.GlobalWindows())
    assert _direct._takes_fields(_direct.DirectCombine("c", pickler.dumps((fn, [], {})), windowing),
                                 aggregated_fields(_direct._map_fn(dofn)))
    out = _run_chain(dofn, fn, rows, windowing)
    got = {(wv.value[0], None): wv.value[1] for wv in out}
    assert len(got) == len(out)  # one accumulator per key: no eviction at this size
    # The keys are Beam's Key rows (their type and fields), the accumulators equal to the bit.
    assert {type(k).__name__ + repr(k) for k, _ in got} == {type(k).__name__ + repr(k) for k, _ in _beams(dofn, fn, rows)}
    assert repr(sorted(got.items(), key=repr)) == repr(sorted(_beams(dofn, fn, rows).items(), key=repr))


@settings(max_examples=25, deadline=None)
@given(rows=_ROWS, size=st.sampled_from([10, 25]), period=st.sampled_from([None, 5]))
def test_fields_in_fixed_and_sliding_windows_folded_in_equal_beams(rows, size, period):
    # A WindowInto before the GroupBy is folded into the partial combine too.
    windowfn = window.FixedWindows(size) if period is None else window.SlidingWindows(size, period)
    dofn, fn = _map_and_combine(beam.GroupBy("k").aggregate_field("x", sum, "s").aggregate_field("y", min, "m"))
    out = _run_chain(dofn, fn, rows, core.Windowing(windowfn), assign=windowfn)
    assert all(len(wv.windows) == 1 and wv.timestamp == wv.windows[0].max_timestamp() for wv in out)
    got = {(wv.value[0], wv.windows[0]): wv.value[1] for wv in out}
    assert len(got) == len(out)

    def windows_of(i):
        return windowfn.assign(window.WindowFn.AssignContext(i * 7))
    assert repr(sorted(got.items(), key=repr)) == repr(sorted(_beams(dofn, fn, rows, windows_of).items(), key=repr))


def test_a_tuple_with_a_combine_fn_of_its_own_keeps_beams_path():
    dofn, fn = _map_and_combine(beam.GroupBy("k").aggregate_field("x", combiners.TopCombineFn(2), "top"))
    assert plain_tuple_accumulators(fn) is None
    assert not _direct._takes_fields(_direct.DirectCombine(
        "c", pickler.dumps((fn, [], {})), core.Windowing(window.GlobalWindows())), aggregated_fields(_direct._map_fn(dofn)))


def test_a_row_without_the_field_fails_naming_the_step():
    dofn, fn = _map_and_combine(beam.GroupBy("k").aggregate_field("x", sum, "s"))
    with pytest.raises(_direct.StepFailed, match=r"(?s)AttributeError.*x.*\[while running 'G/Map'\]"):
        _run_chain(dofn, fn, [beam.Row(k=1, x=1.0), beam.Row(k=2, z=1.0)], core.Windowing(window.GlobalWindows()))


def test_a_failing_callable_names_the_step():
    dofn, fn = _map_and_combine(beam.GroupBy(lambda r: 1 // r.k).aggregate_field("x", sum, "s"))
    assert aggregated_fields(_direct._map_fn(dofn)) is not None
    with pytest.raises(_direct.StepFailed, match=r"(?s)ZeroDivisionError.*\[while running 'G/Map'\]"):
        _run_chain(dofn, fn, [beam.Row(k=1, x=1.0), beam.Row(k=0, x=1.0)], core.Windowing(window.GlobalWindows()))


def _rows(p):
    return (p | beam.Create([(i % 7, i % 3, float(i) / 4, i) for i in range(500)])
            | beam.Map(lambda t: beam.Row(k=t[0], j=t[1], x=t[2], n=t[3])))


@pytest.mark.usefixtures("spark")
def test_grouped_aggregates_of_fields_equal_direct_runners(tmp_path):
    def build(p):
        return (_rows(p)
                | beam.GroupBy("k", "j").aggregate_field("x", sum, "total").aggregate_field("n", max, "most")
                .aggregate_field("x", combiners.MeanCombineFn(), "mean").aggregate_field("n", combiners.CountCombineFn(), "n")
                | beam.Map(tuple))
    got = spark_equals_direct(build, tmp_path)
    assert len(got) == 21 and sum(row[5] for row in got) == 500


@pytest.mark.usefixtures("spark")
def test_grouped_aggregates_of_callables_equal_direct_runners(tmp_path):
    # Plain numbers, grouped and aggregated by lambdas: no field to read.
    def build(p):
        return (p | beam.Create(range(1000))
                | beam.GroupBy(lambda x: x % 7, parity=lambda x: x % 2).aggregate_field(lambda x: x * 2, sum, "s")
                .aggregate_field(lambda x: x, max, "m")
                | beam.Map(lambda r: (type(r).__name__, tuple(r))))
    got = spark_equals_direct(build, tmp_path)
    assert len(got) == 14 and sum(row[1][2] for row in got) == 2 * sum(range(1000))


@pytest.mark.usefixtures("spark")
def test_windowed_grouped_aggregates_of_fields_equal_direct_runners(tmp_path):
    def build(p):
        return (_rows(p)
                | beam.Map(lambda r: window.TimestampedValue(r, r.n))
                | beam.WindowInto(window.FixedWindows(60))
                | beam.GroupBy("k").aggregate_field("x", sum, "total")
                | beam.Map(lambda r, w=beam.DoFn.WindowParam: (r.k, r.total, w.start.micros)))
    got = spark_equals_direct(build, tmp_path)
    assert len(got) == 7 * 9 and sum(row[1] for row in got) == sum(i / 4 for i in range(500))


@pytest.mark.parametrize("grouping", [
    beam.GroupBy("k"), beam.GroupBy("k", "j"), beam.GroupBy(lambda r: r.k % 2), beam.GroupBy("k", j=lambda r: r.j * 2),
    beam.GroupBy(k=lambda r: r.k),
], ids=["a field", "two fields", "a callable", "a field and a callable", "a keyword callable"])
@settings(max_examples=15, deadline=None)
@given(rows=_ROWS)
def test_a_group_bys_pairs_equal_beams(grouping, rows):
    # The Map of a GroupBy without aggregation, its key function built once:
    # the same pairs as Beam's, keys of the same type.
    dofn, _ = _map_dofn(grouping)
    beams = closure(dofn._fn)["fn"]
    ours = _direct._map_fn(dofn)
    assert ours is not beams and grouped_pairs(beams) is not None
    assert [(type(k), k, v) for k, v in map(ours, rows)] == [(type(k), k, v) for k, v in map(beams, rows)]


@pytest.mark.usefixtures("spark")
def test_grouped_rows_equal_direct_runners(tmp_path):
    def build(p):
        return (_rows(p)
                | beam.GroupBy("k", "j")
                | beam.MapTuple(lambda key, rows: (type(key).__name__, key.k, key.j, sorted(r.n for r in rows))))
    got = spark_equals_direct(build, tmp_path)
    assert len(got) == 21 and sorted(n for row in got for n in row[3]) == list(range(500))


def _shuffle_chain(map_dofn) -> _direct.DirectChain:
    """A chain of one ``Map`` into a trivial grouping's shuffle, as a Spark task runs it."""
    pairs = coders.TupleCoder([coders.FastPrimitivesCoder(), coders.FastPrimitivesCoder()])
    pre = coders.WindowedValueCoder(pairs, coders.coders.GlobalWindowCoder())
    step = _direct.DirectStep("G/Map", pickler.dumps((map_dofn, (), {}, None, None)), window.GlobalWindows())
    return _direct.DirectChain((step,), None, None, shuffle=ShuffleWriter(pre, trivial=True), partitions=3)


def _shuffled(chain: _direct.DirectChain, rows: list) -> list:
    values = [window.GlobalWindows.windowed_value(row) for row in rows]
    return list(_direct.run_direct_chain(chain, None, element_batches.batched(iter(values), 7), []))


@pytest.mark.parametrize("grouping", [
    beam.GroupBy("k"), beam.GroupBy("k", "j"), beam.GroupBy(lambda r: r.k % 2), beam.GroupBy(k=lambda r: r.k),
], ids=["a field", "two fields", "a callable", "a keyword callable"])
@settings(max_examples=15, deadline=None)
@given(rows=_ROWS)
def test_a_group_bys_map_before_its_shuffle_writes_what_beams_map_would(grouping, rows):
    # The writer pairs each element with its key itself: the shuffle gets
    # the bytes it gets when the pairs come from Beam's Map run as a step.
    dofn, _ = _map_dofn(grouping)
    beams = closure(dofn._fn)["fn"]
    as_a_step = core.Map(lambda row: beams(row)).fn  # not Beam's code: run as a user's Map
    assert _direct._wrapped_fn(as_a_step) is not None and grouped_key(_direct._wrapped_fn(as_a_step)) is None
    assert _shuffled(_shuffle_chain(dofn), rows) == _shuffled(_shuffle_chain(as_a_step), rows)


def test_a_row_without_the_grouped_field_fails_naming_the_step():
    dofn, _ = _map_dofn(beam.GroupBy("k"))
    with pytest.raises(_direct.StepFailed, match=r"(?s)AttributeError.*k.*\[while running 'G/Map'\]"):
        _shuffled(_shuffle_chain(dofn), [beam.Row(k=1, x=1.0), beam.Row(j=2, x=1.0)])
