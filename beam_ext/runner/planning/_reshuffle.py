"""Beam's ``Reshuffle``: given its Spark-native step in batch, or dropped after a Spark-native ``Create``.

:func:`declare_native_reshuffles` annotates each ``Reshuffle`` with the
native step of :mod:`beam_ext.runner.native._reshuffle`, which
:func:`~beam_ext.runner.planning._phases.substitute_natives` then runs in
place of Beam's expansion.

``Create(seeds) | Reshuffle() | FlatMap(generate)`` is how Beam pipelines
spread a few seeds over workers. On SparkRunner the native Create already
parallelizes its values over the runner's partitions (as many tasks as the
Reshuffle's Spark shuffle would fill), and its elements are fixed by the
pipeline, so a recomputed task sees the same ones: the Reshuffle would only
add a Spark stage and a shuffle. Its output is exactly its input (the
global window, the minimum timestamp, Create's values), so its readers read
the Create's output instead. A Create with ``reshuffle=False`` (one task, in
order) keeps the Reshuffle that spreads it.
"""
from __future__ import annotations

import logging

from apache_beam.internal import pickler
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from beam_ext.runner.native._create import CREATE_URN
from beam_ext.runner.native._reshuffle import DEFAULT_WINDOWING, RESHUFFLE_URN
from beam_ext.transforms._native import NATIVE_URN_ANNOTATION, native_annotations

_LOG = logging.getLogger("beam_ext.runner")


def declare_native_reshuffles(proto: beam_runner_api_pb2.Pipeline) -> None:
    """Annotates each ``Reshuffle`` composite of one input and one output with its native step."""
    from apache_beam.runners import pipeline_context
    from apache_beam.transforms.core import Windowing

    components = proto.components
    context = pipeline_context.PipelineContext(components)
    for transform in components.transforms.values():
        if (transform.spec.urn != common_urns.composites.RESHUFFLE.urn or not transform.subtransforms
                or len(transform.inputs) != 1 or len(transform.outputs) != 1
                or NATIVE_URN_ANNOTATION in transform.annotations):
            continue
        [source] = transform.inputs.values()
        strategy = components.windowing_strategies[components.pcollections[source].windowing_strategy_id]
        default = Windowing.from_runner_api(strategy, context).is_default()
        for key, value in native_annotations(RESHUFFLE_URN, DEFAULT_WINDOWING if default else b"").items():
            transform.annotations[key] = value


def drop_reshuffles_after_create(proto: beam_runner_api_pb2.Pipeline) -> list[str]:
    """Removes each Reshuffle whose input a native Create spreads (after
    :func:`~beam_ext.runner.planning._phases.substitute_natives`); returns their names."""
    components = proto.components
    transforms = components.transforms
    spread = {pcoll for t in transforms.values()
              if t.spec.urn == CREATE_URN and pickler.loads(t.spec.payload).reshuffle
              for pcoll in t.outputs.values()}
    dropped = []
    reshuffles = [transform_id for transform_id, t in transforms.items()
                  if t.spec.urn in _RESHUFFLE_URNS and len(t.inputs) == len(t.outputs) == 1]
    for transform_id in reshuffles:
        transform = transforms[transform_id]
        [source] = transform.inputs.values()
        [target] = transform.outputs.values()
        if source not in spread or not _same_pcollection(components, source, target):
            continue
        name = transform.unique_name
        for pcoll in _remove(proto, transform_id):
            del components.pcollections[pcoll]
        _replace_pcollection(transforms, target, source)
        _LOG.info("step %r dropped: the Spark-native Create before it already spreads its elements", name)
        dropped.append(name)
    return dropped


_RESHUFFLE_URNS = frozenset({common_urns.composites.RESHUFFLE.urn, RESHUFFLE_URN})


def _same_pcollection(components, a: str, b: str) -> bool:
    """Whether PCollections ``a`` and ``b`` have one coder and one windowing strategy."""
    pa, pb = components.pcollections[a], components.pcollections[b]
    return (pa.coder_id == pb.coder_id and components.windowing_strategies[pa.windowing_strategy_id]
            == components.windowing_strategies[pb.windowing_strategy_id])


def _replace_pcollection(transforms, old: str, new: str) -> None:
    for transform in transforms.values():
        for mapping in (transform.inputs, transform.outputs):
            for tag, pcoll in list(mapping.items()):
                if pcoll == old:
                    mapping[tag] = new


def _remove(proto, transform_id: str) -> set[str]:
    """Removes ``transform_id`` and everything under it from the pipeline;
    returns the PCollections they produced."""
    transforms = proto.components.transforms
    for parent in transforms.values():
        if transform_id in parent.subtransforms:
            parent.subtransforms.remove(transform_id)
    if transform_id in proto.root_transform_ids:
        proto.root_transform_ids.remove(transform_id)
    produced: set[str] = set()
    stack = [transform_id]
    while stack:
        current = stack.pop()
        removed = transforms[current]
        stack.extend(removed.subtransforms)
        produced.update(removed.outputs.values())
        del transforms[current]
    return produced
