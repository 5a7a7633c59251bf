"""Watermarks without punctuations: the trAcker tracking service.

``TrackerService`` is the tracking agent (a gRPC server); each process of a
dataflow (or each executor) holds a ``LocalAgent`` that reports what it sent
and received and receives end-of-substream notifications (NEOSS).
``PunctuationTracker`` is the classic baseline; ``simulate`` runs both on a
threaded dataflow. See docs/watermark.md.
"""
from beam_ext.watermark.agent import HostedAgent, LocalAgent, TrackerAuthError, TrackerLimitError, new_token
from beam_ext.watermark.firm import FirmBound
from beam_ext.watermark.punctuation import PunctuationTracker
from beam_ext.watermark.service import TrackerService
from beam_ext.watermark.simulator import SimResult, Workload, simulate

__all__ = [
    "FirmBound",
    "HostedAgent",
    "LocalAgent",
    "PunctuationTracker",
    "SimResult",
    "TrackerAuthError",
    "TrackerLimitError",
    "TrackerService",
    "Workload",
    "new_token",
    "simulate",
]
