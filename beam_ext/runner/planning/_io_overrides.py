"""Beam's text and Parquet IO, declaring their Spark-native implementations.

Before the pipeline becomes a proto, batch SparkRunner swaps each
``ReadFromText`` / ``WriteToText`` / ``ReadFromParquet`` /
``ReadFromParquetBatched`` / ``WriteToParquet`` / ``WriteToParquetBatched``
whose options the native implementations (:mod:`beam_ext.runner.native._textio`,
:mod:`beam_ext.runner.native._parquetio`) reproduce exactly for a subclass
that expands exactly as Beam's and only adds the native annotations
(:mod:`beam_ext.transforms._native`); planning then runs it as one Spark
step, or its Beam expansion if it cannot. A transform with other options (a
custom delimiter, ``max_records_per_shard``, ``as_rows=True``, a subclass
such as ReadFromTextWithFilename) is left as it is, and the reason is logged.
Streaming SparkRunner swaps the three reads alone (under ``--watermarks=min``).
"""
from __future__ import annotations

import logging
from typing import Any

from apache_beam.internal import pickler
from apache_beam.io import parquetio, textio
from apache_beam.options.value_provider import StaticValueProvider
from apache_beam.pipeline import AppliedPTransform, Pipeline, PipelineVisitor, PTransformOverride, encode_annotations

from beam_ext.runner.native._parquetio import (
    READ_PARQUET_BATCHED_URN,
    READ_PARQUET_URN,
    WRITE_PARQUET_BATCHED_URN,
    WRITE_PARQUET_URN,
    ParquetReadConfig,
    ParquetWriteConfig,
)
from beam_ext.runner.native._textio import READ_TEXT_URN, WRITE_TEXT_URN, ReadConfig
from beam_ext.transforms._native import native_annotations

_LOG = logging.getLogger(__name__)


def _read_unsupported(transform: textio.ReadFromText) -> str | None:
    """Why the native read would not give Beam's output, or None."""
    if type(transform) is not textio.ReadFromText:
        return f"{type(transform).__name__} is not ReadFromText itself"
    source = transform._source
    checks = [
        (type(source) is not textio._TextSource, "its source is not Beam's text source"),
        (not isinstance(source._pattern, StaticValueProvider), "its file pattern is a runtime value"),
        (source._delimiter is not None, "it has a custom delimiter"),
        (source._escapechar is not None, "it has an escape character"),
        (not source._strip_trailing_newlines, "it keeps trailing newlines"),
        (source._header_matcher is not None, "it has a header matcher"),
    ]
    return next((reason for failed, reason in checks if failed), None)


def _sink_unsupported(sink, sink_class: type) -> str | None:
    checks = [
        (type(sink) is not sink_class, f"its sink is not Beam's {sink_class.__name__}"),
        (not isinstance(sink.file_path_prefix, StaticValueProvider)
         or not isinstance(sink.file_name_suffix, StaticValueProvider), "its path is a runtime value"),
        (getattr(sink, "max_records_per_shard", None) is not None, "it sets max_records_per_shard"),
        (getattr(sink, "max_bytes_per_shard", None) is not None, "it sets max_bytes_per_shard"),
    ]
    return next((reason for failed, reason in checks if failed), None)


def _write_unsupported(transform: textio.WriteToText) -> str | None:
    if type(transform) is not textio.WriteToText:
        return f"{type(transform).__name__} is not WriteToText itself"
    return _sink_unsupported(transform._sink, textio._TextSink)


def _read_parquet_unsupported(transform) -> str | None:
    beam_class = (parquetio.ReadFromParquetBatched if isinstance(transform, parquetio.ReadFromParquetBatched)
                  else parquetio.ReadFromParquet)
    if type(transform) is not beam_class:
        return f"{type(transform).__name__} is not {beam_class.__name__} itself"
    source = transform._source
    checks = [
        (type(source) is not parquetio._ParquetSource, "its source is not Beam's Parquet source"),
        (not isinstance(source._pattern, StaticValueProvider), "its file pattern is a runtime value"),
        (getattr(transform, "_schema", None) is not None, "it reads Beam rows (as_rows=True)"),
    ]
    return next((reason for failed, reason in checks if failed), None)


def _write_parquet_unsupported(transform) -> str | None:
    beam_class = (parquetio.WriteToParquetBatched if isinstance(transform, parquetio.WriteToParquetBatched)
                  else parquetio.WriteToParquet)
    if type(transform) is not beam_class:
        return f"{type(transform).__name__} is not {beam_class.__name__} itself"
    if beam_class is parquetio.WriteToParquet and transform._schema is None:
        return "it writes Beam rows (no schema given)"
    return _sink_unsupported(transform._sink, parquetio._ParquetSink)


class NativeSubclass:
    """Mixin: a copy of a Beam transform, expanding as Beam's, whose annotations name its native step.

    A subclass lists it before Beam's class, sets ``_native_urn`` and
    ``_beam_type`` (Beam's class path, kept as the ``python_type``
    annotation) and defines ``_native_config()``, what the native step gets.
    """

    _native_urn: str
    _beam_type: str

    def __init__(self, original: Any) -> None:  # copies, not re-initialises: keeps label and options
        self.__dict__.update(original.__dict__)

    def _native_config(self) -> Any:
        raise NotImplementedError

    def annotations(self):
        return {**super().annotations(), "python_type": self._beam_type,  # type: ignore[misc]
                **native_annotations(self._native_urn, pickler.dumps(self._native_config()))}


class _NativeReadFromText(NativeSubclass, textio.ReadFromText):
    _native_urn, _beam_type = READ_TEXT_URN, "apache_beam.io.textio.ReadFromText"

    def _native_config(self) -> ReadConfig:
        source = self._source
        return ReadConfig(pattern=source._pattern.get(), compression_type=source._compression_type,
                          coder=source._coder, skip_header_lines=source._skip_header_lines)


class _NativeWriteToText(NativeSubclass, textio.WriteToText):
    _native_urn, _beam_type = WRITE_TEXT_URN, "apache_beam.io.textio.WriteToText"

    def _native_config(self) -> Any:
        return self._sink


class _ReadsParquet(NativeSubclass):
    def _native_config(self) -> ParquetReadConfig:
        source = self._source
        columns = source._columns
        return ParquetReadConfig(pattern=source._pattern.get(), columns=None if columns is None else tuple(columns),
                                 compression_type=source._compression_type)


class _NativeReadFromParquet(_ReadsParquet, parquetio.ReadFromParquet):
    _native_urn, _beam_type = READ_PARQUET_URN, "apache_beam.io.parquetio.ReadFromParquet"


class _NativeReadFromParquetBatched(_ReadsParquet, parquetio.ReadFromParquetBatched):
    _native_urn, _beam_type = READ_PARQUET_BATCHED_URN, "apache_beam.io.parquetio.ReadFromParquetBatched"


class _NativeWriteToParquet(NativeSubclass, parquetio.WriteToParquet):
    _native_urn, _beam_type = WRITE_PARQUET_URN, "apache_beam.io.parquetio.WriteToParquet"

    def _native_config(self) -> ParquetWriteConfig:
        return ParquetWriteConfig(sink=self._sink, row_group_buffer_size=self._row_group_buffer_size,
                                  record_batch_size=self._record_batch_size)


class _NativeWriteToParquetBatched(NativeSubclass, parquetio.WriteToParquetBatched):
    _native_urn, _beam_type = WRITE_PARQUET_BATCHED_URN, "apache_beam.io.parquetio.WriteToParquetBatched"

    def _native_config(self) -> ParquetWriteConfig:
        return ParquetWriteConfig(sink=self._sink)


class _IOOverride(PTransformOverride):
    def __init__(self, beam_class: type, native_class: type, unsupported) -> None:
        self._beam_class = beam_class
        self._native_class = native_class
        self._unsupported = unsupported

    def matches(self, applied_ptransform) -> bool:
        transform = applied_ptransform.transform
        if not isinstance(transform, self._beam_class) or isinstance(transform, self._native_class):
            return False
        reason = self._unsupported(transform)
        if reason is not None:  # swap_native_io asks once per step and run
            _LOG.info("step %r: %s; running Beam's %s", applied_ptransform.full_label, reason,
                      self._beam_class.__name__)
        return reason is None

    def get_replacement_transform_for_applied_ptransform(self, applied_ptransform):
        return self._native_class(applied_ptransform.transform)


def io_overrides(reads_only: bool = False) -> list[PTransformOverride]:
    """Overrides giving SparkRunner's text and Parquet IO their native paths:
    all six in batch; the three reads (``reads_only``) in streaming, where a
    bounded read is a source like any other but a write's shards depend on
    its windows and panes.

    >>> len(io_overrides()), len(io_overrides(reads_only=True))
    (6, 3)
    """
    reads = [_IOOverride(textio.ReadFromText, _NativeReadFromText, _read_unsupported),
             _IOOverride(parquetio.ReadFromParquetBatched, _NativeReadFromParquetBatched, _read_parquet_unsupported),
             _IOOverride(parquetio.ReadFromParquet, _NativeReadFromParquet, _read_parquet_unsupported)]
    if reads_only:
        return reads
    return reads + [
        _IOOverride(textio.WriteToText, _NativeWriteToText, _write_unsupported),
        _IOOverride(parquetio.WriteToParquetBatched, _NativeWriteToParquetBatched, _write_parquet_unsupported),
        _IOOverride(parquetio.WriteToParquet, _NativeWriteToParquet, _write_parquet_unsupported)]


def swap_native_io(pipeline: Pipeline, reads_only: bool = False) -> None:
    """Gives each step :func:`io_overrides` matches its native subclass, in place.

    The subclass expands exactly as Beam's class, so the step's expansion,
    applied already, stays: the node gets the subclass and its annotations.
    The proto is the one Beam's ``replace_all(io_overrides())`` gives, which
    applies the whole expansion again (0.16-0.21 s of the demo's 1.6-2.0 s
    on a warm session); ``tests/test_native_textio.py`` compares the two.

    ``reads_only``: the reads alone, for a streaming pipeline.

    Example::

        swap_native_io(pipeline)   # before pipeline.to_runner_api()
    """
    overrides = io_overrides(reads_only)

    class _Swap(PipelineVisitor):
        def enter_composite_transform(self, node: AppliedPTransform) -> None:
            self.visit_transform(node)

        def visit_transform(self, node: AppliedPTransform) -> None:
            for override in overrides:
                if override.matches(node):
                    node.transform = override.get_replacement_transform_for_applied_ptransform(node)
                    node.annotations = {**(node.annotations or {}),
                                        **encode_annotations(node.transform.annotations())}
                    return

    pipeline.visit(_Swap())
