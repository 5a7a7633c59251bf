"""Spark-native implementations that SparkRunner substitutes for composites.

A beam_ext composite transform runs everywhere through its Beam expansion.
On SparkRunner it may also name a faster Spark implementation: the composite
adds :func:`native_annotations` to its ``annotations()``, and a function
registered with :func:`register_native` under the same URN receives the
composite's input as an RDD of ``WindowedValue`` and returns its output the
same way. The runner decodes and encodes with the PCollections' coders, so the
native function never sees bytes.

Example::

    class MyComposite(beam.PTransform):
        def annotations(self):
            return {**super().annotations(),
                    **native_annotations("beam_ext:my_composite:v1",
                                         pickle.dumps(self._config))}

    @register_native("beam_ext:my_composite:v1")
    def _my_composite_on_spark(payload, rdd, ctx):
        config = pickle.loads(payload)
        return rdd.map(...)

Both paths must give the same results; tests compare them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

NATIVE_URN_ANNOTATION = "beam_ext:native_urn"
NATIVE_PAYLOAD_ANNOTATION = "beam_ext:native_payload"


class NativeCounter(Protocol):
    def inc(self, n: int = 1) -> None: ...


@dataclasses.dataclass
class NativeContext:
    """What a native implementation may use besides its input.

    ``parallelism`` is the number of partitions the runner uses for shuffles.
    ``counter(namespace, name)`` returns a picklable counter usable inside
    Spark tasks; its total shows up in ``result.metrics()`` under the
    composite's step name.
    """

    spark: Any
    parallelism: int
    step_name: str
    counter: Callable[[str, str], NativeCounter]


NativeFn = Callable[[bytes, Any, NativeContext], Any]

_REGISTRY: dict[str, NativeFn] = {}


def native_annotations(urn: str, payload: bytes) -> dict[str, bytes]:
    """Annotations that make SparkRunner run ``urn``'s native implementation."""
    return {NATIVE_URN_ANNOTATION: urn.encode("utf-8"), NATIVE_PAYLOAD_ANNOTATION: payload}


def register_native(urn: str) -> Callable[[NativeFn], NativeFn]:
    """Register ``fn(payload, rdd_of_windowed_values, ctx) -> rdd`` for ``urn``."""

    def decorate(fn: NativeFn) -> NativeFn:
        if urn in _REGISTRY and _REGISTRY[urn] is not fn:
            raise ValueError(f"native implementation for {urn!r} registered twice")
        _REGISTRY[urn] = fn
        return fn

    return decorate


def lookup_native(urn: str) -> NativeFn | None:
    """The registered implementation of ``urn``, or None."""
    return _REGISTRY.get(urn)
