"""Merging the metrics of many Spark tasks into one queryable result.

Beam's ``monitoring_infos.consolidate`` sums counters and distributions but
keeps one value per task for gauges, string sets and bounded tries. Here
each task's value is decoded into Beam's cell data and combined with that
data type's own ``combine`` (latest gauge, union of sets, merged tries).
"""
from __future__ import annotations

from typing import Iterable, Mapping

from apache_beam.metrics import metric, monitoring_infos
from apache_beam.metrics.execution import MetricResult
from apache_beam.runners.portability import portable_metrics

RUNNER_NAMESPACE = "beam_ext.runner"  # metrics the runner reports about itself

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
        self._user_only = user_metrics_only
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

    def merged_user_monitoring_infos(self) -> list:
        """One MonitoringInfo per user metric and step, merged over tasks.

        What a job service returns from ``GetJobMetrics``: Beam's portable
        client (``PortableMetrics``) keeps the last info of each key, so
        per-task infos would lose all but one task's value.
        """
        if not self._user_only:
            raise ValueError("merged_user_monitoring_infos needs user metrics only (result.metrics())")
        encoders = {
            metric.MetricResults.COUNTERS: lambda ns, name, v, step: monitoring_infos.int64_user_counter(
                ns, name, v, ptransform=step),
            metric.MetricResults.DISTRIBUTIONS: lambda ns, name, v, step: monitoring_infos.int64_user_distribution(
                ns, name, v.data, ptransform=step),
            metric.MetricResults.GAUGES: lambda ns, name, v, step: monitoring_infos.int64_user_gauge(
                ns, name, v.data, ptransform=step),
            metric.MetricResults.STRINGSETS: lambda ns, name, v, step: monitoring_infos.user_set_string(
                ns, name, set(v), ptransform=step),
            metric.MetricResults.BOUNDED_TRIES: lambda ns, name, v, step: monitoring_infos.user_bounded_trie(
                ns, name, v, ptransform=step),
        }
        return [encoders[kind](key.metric.namespace, key.metric.name, value, key.step)
                for kind, table in self._tables.items() if kind in encoders
                for key, value in table.items()]
