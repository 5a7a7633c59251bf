"""Beam transforms that run on any runner and fastest on SparkRunner."""

# Approximate sampled windows that do not wait for stragglers (issue 4).
from beam_ext.transforms.sampling import (
    ApproximateResult,
    ApproximateWindowAggregate,
    OnlineSampler,
    SamplerConfig,
)

__all__ = ["ApproximateResult", "ApproximateWindowAggregate", "OnlineSampler", "SamplerConfig"]
