"""Event sources and generators carrying event time and arrival time."""
from beam_ext.io._simulation import (
    DELAY_SETTINGS,
    EventBatch,
    StreamSpec,
    generate,
    generate_chunk,
    iter_events,
)
from beam_ext.io._simulation_source import ReadSimulatedEvents

__all__ = [
    "DELAY_SETTINGS",
    "EventBatch",
    "ReadSimulatedEvents",
    "StreamSpec",
    "generate",
    "generate_chunk",
    "iter_events",
]
