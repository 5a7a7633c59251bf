"""Frames exploded into rows a column at a time (``beam_ext/runner/worker/_frame_rows.py``)
give exactly the rows of Beam's own ``explode_batch``: the same values, of the same types."""
from __future__ import annotations

import typing

import apache_beam as beam
import numpy as np
import pandas as pd
from apache_beam.dataframe.convert import to_dataframe, to_pcollection
from apache_beam.typehints.batch import BatchConverter
from apache_beam.typehints.pandas_type_compatibility import INDEX_OPTION_NAME
from apache_beam.typehints.row_type import RowTypeConstraint
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_outputs import planned_on_objects, spark_equals_direct

from beam_ext.runner.worker._frame_rows import exploder

# Column kinds: (field type, values (None a null) -> column), each taking another path.
_OPTIONAL_STR = typing.Optional[str]  # noqa: UP045 - a Beam typehint, as Beam documents them
_OPTIONAL_INT = typing.Optional[int]  # noqa: UP045
_KINDS = {
    "int": (int, lambda vs: pd.array([v if v is not None else 0 for v in vs], dtype="int64")),
    "float": (float, lambda vs: np.array([np.nan if v is None else v / 3 for v in vs], dtype="float64")),
    "bool": (bool, lambda vs: np.array([bool(v and v % 2) for v in vs], dtype=bool)),
    "string": (_OPTIONAL_STR, lambda vs: pd.array([None if v is None else f"s{v}" for v in vs], dtype="string")),
    "object": (typing.Any, lambda vs: np.array([None if v is None else (f"o{v}" if v % 2 else v) for v in vs],
                                               dtype=object)),
    "nullable_int": (_OPTIONAL_INT, lambda vs: pd.array(vs, dtype="Int64")),
    "datetime": (typing.Any, lambda vs: pd.to_datetime([None if v is None else v * 10**9 for v in vs])),
}


def _typed(rows) -> list:
    return [[(type(v).__name__, v) for v in row] for row in rows]


@settings(max_examples=200, deadline=None)
@given(kinds=st.lists(st.sampled_from(sorted(_KINDS)), min_size=1, max_size=4),
       values=st.lists(st.one_of(st.none(), st.integers(-50, 50)), max_size=12),
       index=st.booleans())
def test_rows_equal_beams_explode_batch(kinds, values, index):
    names = [f"c{i}" for i in range(len(kinds))]
    frame = pd.DataFrame({name: _KINDS[kind][1](values) for name, kind in zip(names, kinds)})
    fields = [(name, _KINDS[kind][0]) for name, kind in zip(names, kinds)]
    options = None
    if index:
        # A kept index: its level comes first, as Beam's to_pcollection(include_indexes=True) lays it out.
        frame.index = pd.Index(range(100, 100 + len(values)), name="at")
        fields = [("at", int)] + fields
        options = {"at": [(INDEX_OPTION_NAME, None)]}
    converter = BatchConverter.from_typehints(element_type=RowTypeConstraint.from_fields(fields, field_options=options),
                                              batch_type=pd.DataFrame)
    beams = list(converter.explode_batch(frame))
    ours = list(exploder(converter)(frame))
    assert _typed(ours) == _typed(beams)
    assert [type(row) for row in ours] == [type(row) for row in beams]


class _Sale(typing.NamedTuple):
    key: int
    amount: float
    name: str


class _Reordered:
    """A row type whose parameters are not in the columns' order: called with keywords."""

    def __init__(self, name, key, amount):
        self.values = (key, amount, name)

    def __eq__(self, other):
        return self.values == other.values


def test_a_row_type_taking_other_parameters_gets_keywords():
    frame = pd.DataFrame({"key": [1, 2], "amount": [0.5, np.nan], "name": pd.array(["a", None], dtype="string")})
    fields = [("key", int), ("amount", float), ("name", str)]
    for user_type in (_Sale, _Reordered):
        row_type = RowTypeConstraint(fields, user_type=user_type)
        converter = BatchConverter.from_typehints(element_type=row_type, batch_type=pd.DataFrame)
        assert list(exploder(converter)(frame)) == list(converter.explode_batch(frame))
    assert [r.values for r in exploder(converter)(frame)] == [(1, 0.5, "a"), (2, None, None)]


def test_a_dataframe_api_pipeline_runs_on_objects_as_beam(tmp_path):
    def build(p):
        sales = p | beam.Create([_Sale(i % 3, i * 0.5, f"n{i % 4}") for i in range(200)])
        frame = to_dataframe(sales)
        frame["double"] = frame.amount * 2
        return to_pcollection(frame) | beam.Map(lambda r: [r.key, r.amount, r.name, r.double])

    got = spark_equals_direct(build, tmp_path)
    assert sorted(map(tuple, got)) == sorted((i % 3, i * 0.5, f"n{i % 4}", i * 1.0) for i in range(200))
    # Rows to frames (a process_batch yielding elements), the frame's steps and frames to rows: on objects.
    assert planned_on_objects(build, "Unbatch") == [True]
