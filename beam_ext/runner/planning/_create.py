"""Beam's Create, found in the pipeline proto and given its Spark-native step.

Beam writes a ``beam.Create`` into the proto as a composite (``Impulse ->
FlatMap -> Reshuffle -> Map(decode)``) whose payload is the pickled
transform: its values encoded, its coder, its ``reshuffle`` flag. In batch,
the planner reads them from there and annotates the composite with the
native implementation (:mod:`beam_ext.runner.native._create`), which
:func:`~beam_ext.runner.planning._phases.substitute_natives` then runs as
one Spark step. Read from the proto, Create is never expanded again: an
override swapping the transform before the proto is made would apply
Beam's expansion (and its type checks) once more per Create. Pipelines
from the job server get the same step.
"""
from __future__ import annotations

import logging

from apache_beam.internal import pickler
from apache_beam.portability import python_urns
from apache_beam.portability.api import beam_runner_api_pb2

from beam_ext.runner.native._create import CREATE_URN, CreateConfig
from beam_ext.transforms._native import NATIVE_URN_ANNOTATION, native_annotations

_LOG = logging.getLogger("beam_ext.runner")
_CREATE_TYPE = b"apache_beam.transforms.core.Create"


def declare_native_creates(proto: beam_runner_api_pb2.Pipeline) -> None:
    """Annotates each ``beam.Create`` (exactly Beam's class, not a subclass) with its native step."""
    import apache_beam as beam

    for transform in proto.components.transforms.values():
        if (transform.spec.urn != python_urns.PICKLED_TRANSFORM or not transform.subtransforms
                or transform.annotations.get("python_type") != _CREATE_TYPE
                or NATIVE_URN_ANNOTATION in transform.annotations):
            continue
        try:
            create = pickler.loads(transform.spec.payload)
        except Exception as exc:  # noqa: BLE001 - another SDK version's pickle: Beam's expansion runs it
            _LOG.info("step %r: its Create does not load here (%s); running its Beam expansion",
                      transform.unique_name, exc)
            continue
        if type(create) is not beam.Create:
            continue
        config = CreateConfig(encoded=[create._coder.encode(v) for v in create.values], coder=create._coder,
                              reshuffle=create.reshuffle)
        for key, value in native_annotations(CREATE_URN, pickler.dumps(config)).items():
            transform.annotations[key] = value
