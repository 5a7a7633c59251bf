"""A pipeline's Runner API proto, as SparkRunner encodes it.

Beam gives every grouping key and stateful ``DoFn`` key a deterministic coder
when it encodes a pipeline (``PipelineContext.deterministic_coder`` calls the
key coder's ``as_deterministic_coder``). Beam's ``ShardedKeyCoder`` does not
implement that method, so a ``ShardedKey`` of a key without a type hint
(whose ``FastPrimitivesCoder`` has a deterministic form) raises: a
``GroupIntoBatches.WithShardedKey`` after an untyped ``Map`` fails on Beam's
``FnApiRunner``, while the DirectRunner, which never encodes it, runs it.
Here such a key is coded by the ``ShardedKeyCoder`` of its key coder's
deterministic form: its bytes are the key's as any other grouping encodes it,
and a key that has none still raises, naming the step.
"""
from __future__ import annotations

from typing import Any

from apache_beam import coders
from apache_beam.options import pipeline_options
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.transforms import environments


class _ShardedKeysContext(pipeline_context.PipelineContext):
    def deterministic_coder(self, coder: coders.Coder, msg: str) -> coders.Coder:
        if type(coder) is coders.ShardedKeyCoder and coder not in self.deterministic_coder_map:
            key_coder, = coder._get_component_coders()
            self.deterministic_coder_map[coder] = coders.ShardedKeyCoder(self.deterministic_coder(key_coder, msg))
        return super().deterministic_coder(coder, msg)


def pipeline_proto(pipeline: Any, options: pipeline_options.PipelineOptions) -> beam_runner_api_pb2.Pipeline:
    """``pipeline`` encoded as ``SparkRunner.run_pipeline`` runs it: the inputs
    of its groupings typed as key-value pairs (``group_by_key_input_visitor``,
    as Beam's runners do), deterministic key coders unless the options allow
    others, the embedded Python environment.

    >>> import apache_beam as beam
    >>> p = beam.Pipeline()
    >>> _ = p | beam.Create([1]) | beam.Map(lambda x: (x, x)) | beam.GroupIntoBatches.WithShardedKey(10)
    >>> proto = pipeline_proto(p, pipeline_options.PipelineOptions())
    >>> any(c.spec.urn == "beam:coder:sharded_key:v1" for c in proto.components.coders.values())
    True
    """
    deterministic = not options.view_as(pipeline_options.TypeOptions).allow_non_deterministic_key_coders
    pipeline.visit(group_by_key_input_visitor(deterministic))
    context = _ShardedKeysContext(component_id_map=pipeline.component_id_map,
                                  default_environment=environments.EmbeddedPythonEnvironment.default())
    return pipeline.to_runner_api(context=context)
