"""beam_ext: Apache Beam Python pipelines on Apache Spark, with exact windowing.

The public API is re-exported here; everything else is private.
"""

__version__ = "0.1.0"

__all__: list[str] = []

# Approximate sampled windows that do not wait for stragglers.
from beam_ext.transforms.sampling import (  # noqa: E402
    ApproximateResult,
    ApproximateWindowAggregate,
    OnlineSampler,
    SamplerConfig,
)

__all__ += ["ApproximateResult", "ApproximateWindowAggregate", "OnlineSampler", "SamplerConfig"]
