"""The TestStream tests of Beam's ``apache_beam/transforms/trigger_test.py`` on ``SparkRunner --streaming``.

``TriggerPipelineTest`` runs triggers over TestStreams (processing-time,
count and watermark triggers, accumulating firings, watermark holds of
panes). ``TestStreamTranscriptTest`` and ``WeakTestStreamTranscriptTest``
replay Beam's ``testing/data/trigger_transcripts.yaml`` through one
TestStream per transcript, grouping (``GroupByKey`` and ``CombinePerKey``)
under the transcript's windowing and checking every expected pane in a
stateful DoFn; the weak variant lets a pane arrive after the TestStream
event that expects it. Transcripts whose ``broken_on`` names a runner skip
themselves on that runner only (none names SparkRunner).

Beam's ``TestPipeline(options=...)`` calls run on SparkRunner through the
conftest's ``test_pipelines_on_spark``; ``TestPipeline('FnApiRunner')``
stays pinned as Beam wrote it. Skips and the default subset are in the
conftest (``SKIPPED_ON_SPARK``, ``SLOW_STREAMING``), each with its reason.
"""
import pytest
from apache_beam.transforms import trigger_test
from apache_beam.transforms.trigger_test import TestStreamTranscriptTest, WeakTestStreamTranscriptTest  # noqa: F401

pytestmark = pytest.mark.usefixtures("test_pipelines_on_spark")


class TriggerPipelineStreamingTest(trigger_test.TriggerPipelineTest):
    """Beam's ``TriggerPipelineTest`` without its three batch cases (Create, no TestStream)."""

    test_after_count = test_always = test_never = None  # not callables: not collected
