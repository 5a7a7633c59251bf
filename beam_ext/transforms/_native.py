"""How a transform declares a Spark-native implementation: annotations only.

A beam_ext composite runs everywhere through its Beam expansion. It may also
name a URN for which SparkRunner has a faster Spark implementation (the
runner's table, ``beam_ext.runner.native.TRANSLATIONS``), by adding
:func:`native_annotations` to its ``annotations()``. The transform never
imports the runner: a runner without that URN in its table runs the
expansion, and SparkRunner logs at planning time which one it chose.

Example::

    class MyComposite(beam.PTransform):
        def annotations(self):
            return {**super().annotations(),
                    **native_annotations("beam_ext:my_composite:v1",
                                         pickle.dumps(self._config))}
"""
from __future__ import annotations

NATIVE_URN_ANNOTATION = "beam_ext:native_urn"
NATIVE_PAYLOAD_ANNOTATION = "beam_ext:native_payload"


def native_annotations(urn: str, payload: bytes) -> dict[str, bytes]:
    """Annotations naming ``urn``'s Spark-native implementation and its ``payload``.

    >>> sorted(native_annotations("beam_ext:x:v1", b"cfg"))
    ['beam_ext:native_payload', 'beam_ext:native_urn']
    """
    return {NATIVE_URN_ANNOTATION: urn.encode("utf-8"), NATIVE_PAYLOAD_ANNOTATION: payload}
