"""beam_ext: Apache Beam Python pipelines on Apache Spark, with exact windowing.

The public API is re-exported here; everything else is private.
"""

__version__ = "0.1.0"

__all__: list[str] = []

# Watermark service: trAcker tracking agent, local agents (beam_ext.watermark).
from beam_ext.watermark import (  # noqa: E402
    FirmBound,
    LocalAgent,
    PunctuationTracker,
    TrackerAuthError,
    TrackerService,
    new_token,
)

__all__ += ["FirmBound", "LocalAgent", "PunctuationTracker", "TrackerAuthError", "TrackerService", "new_token"]
