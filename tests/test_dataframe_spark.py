"""Beam's DataFrame API on SparkRunner: read_csv, groupby/agg, to_pcollection; DirectRunner is the oracle."""
from __future__ import annotations

import apache_beam as beam
import pandas as pd
import pytest
from apache_beam.dataframe.convert import to_pcollection
from apache_beam.dataframe.io import read_csv
from apache_beam.runners.direct.direct_runner import DirectRunner
from pipeline_outputs import run_and_collect

from beam_ext.runner import SparkRunner

pytestmark = pytest.mark.usefixtures("spark")

_FILES = {
    "sales-1.csv": "shop,item,qty,price\nnorth,apple,3,0.5\nsouth,pear,1,0.75\nnorth,pear,2,0.75\n",
    "sales-2.csv": "shop,item,qty,price\nsouth,apple,5,0.5\neast,plum,7,0.25\nnorth,apple,1,0.5\nsouth,plum,2,0.25\n",
}

# Associative (sum), lifted through a sum (mean) and unliftable (nunique) aggregations.
_AGGREGATES = {"qty": ("qty", "sum"), "revenue": ("revenue", "sum"), "mean_price": ("price", "mean"),
               "n_items": ("item", "nunique")}


# A DataFrame pipeline costs some 30 Spark jobs: the splittable read runs with the slow_dataframe tests only.
@pytest.mark.parametrize("splittable", [
    pytest.param(False, id="whole-files"),
    pytest.param(True, id="splittable", marks=pytest.mark.slow_dataframe),
])
def test_read_csv_groupby_agg_equals_direct_runner(tmp_path, splittable):
    for name, text in _FILES.items():
        (tmp_path / name).write_text(text)
    pattern = str(tmp_path / "sales-*.csv")

    def build(p):
        df = p | read_csv(pattern, splittable=splittable)
        df["revenue"] = df.qty * df.price
        per_shop = df.groupby("shop").agg(**_AGGREGATES)
        rows = to_pcollection(per_shop, include_indexes=True)
        # Plain Python values: numpy scalars would compare by their repr.
        return rows | beam.Map(lambda r: [r.shop, int(r.qty), float(r.revenue), float(r.mean_price), int(r.n_items)])

    direct = run_and_collect(DirectRunner(), build, str(tmp_path / "direct"))
    spark = run_and_collect(SparkRunner(), build, str(tmp_path / "spark"))

    assert spark == direct
    frame = pd.concat(pd.read_csv(tmp_path / name) for name in _FILES)
    frame["revenue"] = frame.qty * frame.price
    expected = frame.groupby("shop").agg(**_AGGREGATES)
    assert spark == [[shop, int(r.qty), float(r.revenue), float(r.mean_price), int(r.n_items)]
                     for shop, r in expected.iterrows()]
