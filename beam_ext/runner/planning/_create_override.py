"""Beam's Create, declaring its Spark-native implementation.

Before the pipeline becomes a proto, batch SparkRunner swaps each
``beam.Create`` for a subclass that expands exactly as Beam's and only adds
the native annotations (:mod:`beam_ext.runner.native._create`); planning
then runs it as one Spark step.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.internal import pickler
from apache_beam.pipeline import PTransformOverride

from beam_ext.runner.native._create import CREATE_URN, CreateConfig
from beam_ext.transforms._native import native_annotations


class _NativeCreate(beam.Create):
    """Beam's Create, same expansion, naming SparkRunner's native step."""

    def __init__(self, original: beam.Create) -> None:  # copies, not re-initialises: keeps label and coder
        self.__dict__.update(original.__dict__)

    def annotations(self):
        config = CreateConfig(encoded=[self._coder.encode(v) for v in self.values], coder=self._coder,
                              reshuffle=self.reshuffle)
        return {**super().annotations(), "python_type": "apache_beam.transforms.core.Create",
                **native_annotations(CREATE_URN, pickler.dumps(config))}


class CreateOverride(PTransformOverride):
    """Gives batch SparkRunner's ``beam.Create`` its native step.

    >>> CreateOverride().get_replacement_transform(beam.Create([1])).values
    (1,)
    """

    def matches(self, applied_ptransform) -> bool:
        return type(applied_ptransform.transform) is beam.Create

    def get_replacement_transform_for_applied_ptransform(self, applied_ptransform):
        return _NativeCreate(applied_ptransform.transform)

    def get_replacement_transform(self, ptransform):
        return _NativeCreate(ptransform)
