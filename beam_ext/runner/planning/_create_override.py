"""Beam's Create, declaring its Spark-native implementation.

Before the pipeline becomes a proto, batch SparkRunner swaps each
``beam.Create`` for a subclass that expands exactly as Beam's and only adds
the native annotations (:mod:`beam_ext.runner.native._create`); planning
then runs it as one Spark step.
"""
from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.pipeline import PTransformOverride

from beam_ext.runner.native._create import CREATE_URN, CreateConfig
from beam_ext.runner.planning._io_overrides import NativeSubclass


class _NativeCreate(NativeSubclass, beam.Create):
    """Beam's Create, same expansion, naming SparkRunner's native step."""

    _native_urn, _beam_type = CREATE_URN, "apache_beam.transforms.core.Create"
    # The original's output type: Beam infers a Create's from every value,
    # and the replacement's expansion would infer it twice more.
    _output_type: Any = None

    def infer_output_type(self, input_type: Any) -> Any:
        return self._output_type if self._output_type is not None else super().infer_output_type(input_type)

    def get_output_type(self) -> Any:
        return self._output_type if self._output_type is not None else super().get_output_type()

    def _native_config(self) -> CreateConfig:
        return CreateConfig(encoded=[self._coder.encode(v) for v in self.values], coder=self._coder,
                            reshuffle=self.reshuffle)


class CreateOverride(PTransformOverride):
    """Gives batch SparkRunner's ``beam.Create`` its native step.

    >>> CreateOverride().get_replacement_transform(beam.Create([1])).values
    (1,)
    """

    def matches(self, applied_ptransform) -> bool:
        return type(applied_ptransform.transform) is beam.Create

    def get_replacement_transform_for_applied_ptransform(self, applied_ptransform):
        replacement = _NativeCreate(applied_ptransform.transform)
        output = applied_ptransform.outputs.get(None)
        if output is not None:
            replacement._output_type = output.element_type
        return replacement

    def get_replacement_transform(self, ptransform):
        return _NativeCreate(ptransform)
