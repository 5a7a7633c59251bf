"""Spark-native implementations of beam_ext's transforms: one explicit table.

A beam_ext composite declares a URN in its annotations
(:mod:`beam_ext.transforms._native`). When that URN is a key of
:data:`TRANSLATIONS`, planning turns the composite into one runner-executed
leaf and the batch executor calls the implementation with the composite's
input as an RDD of ``WindowedValue``; it returns the output the same way.
The runner decodes and encodes with the PCollections' coders, so the
implementation never sees bytes. A composite whose URN is not here runs its
Beam expansion, and planning logs that, with the reason.

Both paths must give the same results; tests compare them. Adding one:
write ``fn(payload, rdd, ctx) -> rdd`` in a module of this package and add
its line to :data:`TRANSLATIONS`. The streaming executor runs the reads of
:data:`STREAMING_READS` the same way, in the first micro-batch.

An implementation may also return :class:`ArrowRows` (row dicts held as
Arrow tables). The executor hands them unchanged to native readers listed
in :data:`READS_ARROW_ROWS`, which then get either an RDD or ``ArrowRows``,
and makes the row dicts for every other reader. It may return
:class:`ElementBatches` (an RDD of batches of elements), which steps on
element objects next to it take without a ``WindowedValue`` per element;
readers listed in :data:`READS_BATCHES` get them too.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

from beam_ext.runner._element_batches import ElementBatches
from beam_ext.runner.native._arrow_rows import ArrowRows
from beam_ext.runner.native._create import CREATE_URN, create_on_spark, create_values
from beam_ext.runner.native._lateness import late_panes_on_spark
from beam_ext.runner.native._parquetio import (
    READ_PARQUET_BATCHED_URN,
    READ_PARQUET_URN,
    WRITE_PARQUET_BATCHED_URN,
    WRITE_PARQUET_URN,
    read_parquet_batched_on_spark,
    read_parquet_on_spark,
    write_parquet_on_spark,
)
from beam_ext.runner.native._reshuffle import RESHUFFLE_URN, reshuffle_on_spark
from beam_ext.runner.native._sliding import sliding_on_spark
from beam_ext.runner.native._textio import READ_TEXT_URN, WRITE_TEXT_URN, read_text_on_spark, write_text_on_spark
from beam_ext.transforms._native import NATIVE_PAYLOAD_ANNOTATION, NATIVE_URN_ANNOTATION
from beam_ext.transforms.lateness._gbk import NATIVE_URN as LATE_WINDOWED_GBK_URN
from beam_ext.transforms.sliding._plan import NATIVE_URN as SLIDING_URN

__all__ = ["CREATE_URN", "DONE_ON_RETURN", "DRIVER_VALUES", "NATIVE_PAYLOAD_ANNOTATION", "NATIVE_URN_ANNOTATION",
           "ONE_WINDOW_PER_ELEMENT", "READS_ARROW_ROWS", "READS_BATCHES", "RESHUFFLE_URN", "STREAMING_READS",
           "STREAMING_SOURCES", "TRANSLATIONS", "ArrowRows", "ElementBatches", "NativeContext", "NativeFn",
           "lookup_native"]


class NativeCounter(Protocol):
    def inc(self, n: int = 1) -> None: ...


@dataclasses.dataclass
class NativeContext:
    """What a native implementation may use besides its input.

    ``sc`` is the pipeline's SparkContext. ``parallelism`` is the number of
    partitions the runner uses for shuffles.
    ``counter(namespace, name)`` returns a picklable counter usable inside
    Spark tasks; its total shows up in ``result.metrics()`` under the
    composite's step name. ``run_job(rdd, then)`` runs ``rdd`` as a Spark
    job and returns ``then`` of its collected elements; for an
    implementation in :data:`DONE_ON_RETURN` whose output nobody reads, the
    runner may instead run it in the pipeline's last job, beside others,
    call ``then`` after it, and return None here.
    """

    sc: Any
    parallelism: int
    step_name: str
    counter: Callable[[str, str], NativeCounter]
    run_job: Callable[[Any, Callable[[list], Any]], Any] = lambda rdd, then: then(rdd.collect())


NativeFn = Callable[[bytes, Any, NativeContext], Any]

#: URN declared by a transform -> its Spark-native implementation.
TRANSLATIONS: dict[str, NativeFn] = {
    SLIDING_URN: sliding_on_spark,
    LATE_WINDOWED_GBK_URN: late_panes_on_spark,
    READ_TEXT_URN: read_text_on_spark,
    WRITE_TEXT_URN: write_text_on_spark,
    CREATE_URN: create_on_spark,
    READ_PARQUET_URN: read_parquet_on_spark,
    READ_PARQUET_BATCHED_URN: read_parquet_batched_on_spark,
    WRITE_PARQUET_URN: write_parquet_on_spark,
    WRITE_PARQUET_BATCHED_URN: write_parquet_on_spark,
    RESHUFFLE_URN: reshuffle_on_spark,
}

#: Implementations that group each element by its own windows. That equals
#: GroupByKey only where each element is in one window no merge changes
#: (global or fixed windows); on other input planning keeps the Beam expansion.
ONE_WINDOW_PER_ELEMENT: frozenset[str] = frozenset({SLIDING_URN})


#: Implementations that take :class:`ArrowRows` as their input, as well as an RDD.
READS_ARROW_ROWS: frozenset[str] = frozenset({SLIDING_URN})


#: Implementations that take :class:`ElementBatches` as their input, as well as an RDD.
READS_BATCHES: frozenset[str] = frozenset({WRITE_TEXT_URN, WRITE_PARQUET_URN, WRITE_PARQUET_BATCHED_URN,
                                          RESHUFFLE_URN, SLIDING_URN})


#: Implementations whose work is done when they return: a write's shards are
#: written and finalized by its own Spark job (``NativeContext.run_job``), and
#: its output (the files' names) is listed on the driver. Nobody reading it,
#: no job computes it again, and its own job may be the pipeline's last one.
DONE_ON_RETURN: frozenset[str] = frozenset({WRITE_TEXT_URN, WRITE_PARQUET_URN, WRITE_PARQUET_BATCHED_URN})


#: Bounded reads a streaming plan runs natively: a source whose elements all
#: come out in the first micro-batch, which the stage's output watermark
#: (then +inf, as its input is the impulse) lets downstream stages see as
#: on time. Writes keep Beam's expansion in streaming.
STREAMING_READS: frozenset[str] = frozenset({READ_TEXT_URN, READ_PARQUET_URN, READ_PARQUET_BATCHED_URN})

#: Every source a streaming plan runs natively in the first micro-batch: the
#: reads, and ``beam.Create``, whose values are fixed by the pipeline.
STREAMING_SOURCES: frozenset[str] = STREAMING_READS | {CREATE_URN}


#: Implementations whose elements the driver can list from the payload alone
#: (a Create's values): a side input read from one needs no Spark job.
DRIVER_VALUES: dict[str, Callable[[bytes], list]] = {CREATE_URN: create_values}


def lookup_native(urn: str) -> NativeFn | None:
    """The implementation of ``urn`` in :data:`TRANSLATIONS`, or None."""
    return TRANSLATIONS.get(urn)
