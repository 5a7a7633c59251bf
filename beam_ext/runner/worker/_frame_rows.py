"""Beam's ``DataFrameBatchConverter.explode_batch``, a column at a time.

Beam's DataFrame API turns frames into rows with its batch converter
(``ReadFromCsv``, ``ReadFromJson``, ``to_pcollection``): per row, it pairs
every column's value with that column's null check, builds a dict of the
row and calls the row type with it as keywords. A pandas string column is
read a value at a time through the array's ``__getitem__``. That is most of
the time of a read of a file through Beam's DataFrame reader.

:func:`exploder` gives the same rows, made a column at a time: a column
backed by a numpy array (numbers, booleans, objects, but not datetimes,
which iterate as pandas scalars) becomes a list with ``ndarray.tolist()``, which
converts each value with ``ndarray.item``, as iterating the column does; a
pandas ``StringArray`` (strings held in an object array) becomes the list
of the objects it holds, which its ``__getitem__`` returns unchanged; any
other column is iterated as Beam iterates it. Where ``pd.isnull`` finds
nulls, they become None, as in Beam. The row type is called with the
values in order where its parameters are the columns, in order, each
positional or keyword (Beam's generated ``NamedTuple``s), and with
keywords otherwise.
"""
from __future__ import annotations

import functools
import inspect
import itertools
from typing import Any, Callable, Iterable


def exploder(converter: Any) -> Callable[[Any], Iterable[Any]]:
    """``converter.explode_batch``, or the same rows made a column at a time
    where ``converter`` is one of Beam's DataFrame batch converters.

    >>> import pandas as pd
    >>> from typing import NamedTuple
    >>> from apache_beam.typehints.batch import BatchConverter
    >>> class Sale(NamedTuple):
    ...     key: int
    ...     name: str
    >>> converter = BatchConverter.from_typehints(element_type=Sale, batch_type=pd.DataFrame)
    >>> frame = pd.DataFrame({"key": [1, 2], "name": pd.array(["a", None], dtype="string")})
    >>> list(exploder(converter)(frame))
    [Sale(key=1, name='a'), Sale(key=2, name=None)]
    """
    from apache_beam.typehints import pandas_type_compatibility as frames

    if type(converter) not in (frames.DataFrameBatchConverterDropIndex, frames.DataFrameBatchConverterKeepIndex):
        return converter.explode_batch
    user_type = converter._element_type.user_type
    names = list(converter._columns)
    return functools.partial(_rows, converter, user_type, names, _takes_in_order(user_type, names))


def _rows(converter: Any, user_type: Any, names: list[str], in_order: bool, batch: Any) -> Iterable[Any]:
    columns = [_values(series) for series in converter._get_series(batch)]
    if in_order and len(columns) == len(names):
        return itertools.starmap(user_type, zip(*columns))
    # Beam pairs the names with the frame's columns as they come, the shorter deciding.
    return (user_type(**dict(zip(names, values))) for values in zip(*columns))


def _values(series: Any) -> list:
    """A column's (a ``Series``' or an index level's) values as Beam iterates
    them, its nulls as None."""
    import numpy as np
    import pandas as pd

    # Datetimes and timedeltas have numpy dtypes but iterate as pandas scalars.
    if isinstance(series.dtype, np.dtype) and series.dtype.kind in "biufcOSU":
        values = series.to_numpy().tolist()
    elif type(series.array) is pd.arrays.StringArray:
        values = series.array._ndarray.tolist()
    else:
        values = list(series)
    nulls = np.asarray(pd.isnull(series))
    if nulls.any():
        values = [None if null else value for null, value in zip(nulls.tolist(), values)]
    return values


def _takes_in_order(user_type: Any, names: list[str]) -> bool:
    """Whether calling ``user_type`` with values in the order of ``names`` binds
    them as keywords of those names would."""
    try:
        parameters = list(inspect.signature(user_type).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_OR_KEYWORD,)
    return ([p.name for p in parameters[:len(names)]] == names
            and all(p.kind in positional for p in parameters[:len(names)])
            and all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                    for p in parameters[len(names):]))
