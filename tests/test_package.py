import beam_ext


def test_version_is_set():
    assert beam_ext.__version__.count(".") == 2


def test_sampling_api_is_exported():
    from beam_ext import transforms

    for name in ("ApproximateResult", "ApproximateWindowAggregate", "OnlineSampler",
                 "SamplerConfig"):
        assert name in beam_ext.__all__ and getattr(beam_ext, name) is getattr(transforms, name)
