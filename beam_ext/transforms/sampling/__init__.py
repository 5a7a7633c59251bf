"""Approximate sampled windows that do not wait for stragglers (thesis ch. 4)."""
from beam_ext.transforms.sampling._online import OnlineSampler
from beam_ext.transforms.sampling._sampler import ApproximateResult, SamplerConfig
from beam_ext.transforms.sampling._transform import ApproximateWindowAggregate

__all__ = ["ApproximateResult", "ApproximateWindowAggregate", "OnlineSampler", "SamplerConfig"]
