"""Watermarks without punctuations: the trAcker tracking service.

``TrackerService`` is the tracking agent (a gRPC server); each process of a
dataflow holds a ``LocalAgent`` that reports what it sent and received and
receives end-of-substream notifications (NEOSS). See docs/watermark.md.
"""
from beam_ext.watermark.agent import LocalAgent, TrackerAuthError, new_token
from beam_ext.watermark.service import TrackerService

__all__ = ["LocalAgent", "TrackerAuthError", "TrackerService", "new_token"]
