"""Merging the metrics of many Spark tasks into one queryable result.

Beam's ``monitoring_infos.consolidate`` sums counters and distributions but
keeps one value per task for gauges, string sets and bounded tries. Here
each task's value is decoded into Beam's cell data and combined with that
data type's own ``combine`` (latest gauge, union of sets, merged tries).
"""
from __future__ import annotations

from typing import Iterable, Mapping

from apache_beam.metrics import metric
from apache_beam.metrics.execution import MetricResult
from apache_beam.runners.portability import portable_metrics

_KINDS = (metric.MetricResults.COUNTERS, metric.MetricResults.DISTRIBUTIONS,
          metric.MetricResults.GAUGES, metric.MetricResults.STRINGSETS,
          metric.MetricResults.BOUNDED_TRIES)


def _combine(old, new):
    if isinstance(old, int):
        return old + new
    if isinstance(old, (set, frozenset)):  # string sets arrive as plain sets
        return old | new
    if hasattr(old, "combine"):  # StringSetData, BoundedTrieData
        return old.combine(new)
    # DistributionResult and GaugeResult wrap the data that knows how to combine.
    return type(old)(old.data.combine(new.data))


class SparkMetrics(metric.MetricResults):
    """User (or all) metrics of a pipeline run, merged over stages and tasks."""

    def __init__(self, infos_by_stage: Mapping[str, Iterable], user_metrics_only: bool = True):
        self._infos = infos_by_stage
        self._tables: dict[str, dict] = {kind: {} for kind in _KINDS}
        for infos in infos_by_stage.values():
            for info in infos:
                found = portable_metrics.from_monitoring_infos([info], user_metrics_only)
                for kind, values in zip(_KINDS, found):
                    table = self._tables[kind]
                    for key, value in values.items():
                        table[key] = value if key not in table else _combine(table[key], value)

    def query(self, filter=None):
        return {kind: [MetricResult(key, value, value) for key, value in table.items()
                       if self.matches(filter, key)]
                for kind, table in self._tables.items()}

    def monitoring_infos(self) -> list:
        return [info for infos in self._infos.values() for info in infos]
