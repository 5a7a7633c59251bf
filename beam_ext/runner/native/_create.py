"""``beam.Create`` on Spark: the encoded values parallelized straight into the next stage.

Beam expands Create into ``Impulse -> FlatMap(encoded values) -> Reshuffle ->
Map(decode)``: on Spark a one-task stage and a shuffle before any work. The
native step parallelizes the values Create encoded, across the runner's
partitions, and decodes them with Create's coder, so elements are exactly
Beam's: the values after their coder's round trip, in the global window at
the minimum timestamp. ``Create(..., reshuffle=False)`` keeps Beam's single
bundle in input order (one partition): code such as ``BatchElements``
relies on it.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator

from apache_beam.utils.windowed_value import WindowedValue

from beam_ext.runner._element_batches import ElementBatches, bounded_batches
from beam_ext.runner.native._arrow_rows import bounded_values

CREATE_URN = "beam_ext:create:v1"


@dataclasses.dataclass(frozen=True)
class CreateConfig:
    """What the native Create needs: its values as Create encodes them, and the coder."""

    encoded: list[bytes]
    coder: Any
    reshuffle: bool = True


def _decoded(coder: Any, encoded: Iterator[bytes]) -> Iterator[WindowedValue]:
    return bounded_values(map(coder.decode, encoded))


def create_values(payload: bytes) -> list[WindowedValue]:
    """The elements of the native Create, listed on the driver (no Spark job)."""
    from apache_beam.internal import pickler

    config: CreateConfig = pickler.loads(payload)
    return list(_decoded(config.coder, iter(config.encoded)))


def _decoded_batches(coder: Any, encoded: Iterator[bytes]) -> Iterator[Any]:
    return bounded_batches(map(coder.decode, encoded))


def create_on_spark(payload: bytes, rdd: Any, ctx: Any) -> ElementBatches:
    """SparkRunner's ``beam.Create``: the decoded values."""
    from apache_beam.internal import pickler

    config: CreateConfig = pickler.loads(payload)
    slices = max(1, min(ctx.parallelism, len(config.encoded))) if config.reshuffle else 1
    return ElementBatches(ctx.sc.parallelize(config.encoded, slices).mapPartitions(
        functools.partial(_decoded_batches, config.coder)))
