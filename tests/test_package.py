import pytest

import beam_ext


def test_version_is_set():
    assert beam_ext.__version__.count(".") == 2


def test_sampling_api_is_exported():
    from beam_ext import transforms

    for name in ("ApproximateResult", "ApproximateWindowAggregate", "OnlineSampler",
                 "SamplerConfig"):
        assert name in beam_ext.__all__ and getattr(beam_ext, name) is getattr(transforms, name)


# Public names exported before the transforms were split into subpackages: they stay.
_TOP_LEVEL = {"SlidingAggregate", "SlidingWindow", "agg", "PredictiveCleanup", "StalenessPlanner",
              "StalenessRefire", "StalenessTrigger", "max_staleness", "ApproximateResult",
              "ApproximateWindowAggregate", "OnlineSampler", "SamplerConfig", "FirmBound",
              "LocalAgent", "PunctuationTracker", "TrackerAuthError", "TrackerService",
              "new_token", "SpillStore", "SpillStoreError", "SpillWindow", "AfterLateDelay",
              "CleanupPolicy", "EveryNLateEvents", "FixedLateness", "LateWindowedGroupByKey"}
_TRANSFORMS = {"SlidingAggregate", "SlidingWindow", "agg", "StalenessPlanner", "StalenessRefire",
               "StalenessTrigger", "max_staleness", "ApproximateResult",
               "ApproximateWindowAggregate", "OnlineSampler", "SamplerConfig", "AfterLateDelay",
               "CleanupPolicy", "EveryNLateEvents", "FixedLateness", "LateWindowedGroupByKey"}


def test_public_names_are_kept():
    from beam_ext import transforms

    assert _TOP_LEVEL <= set(beam_ext.__all__)
    assert _TRANSFORMS <= set(transforms.__all__)
    for name in _TRANSFORMS:
        assert getattr(beam_ext, name) is getattr(transforms, name)


def test_subpackages_list_their_public_names():
    from beam_ext.transforms import lateness, staleness

    assert set(lateness.__all__) == {"AfterLateDelay", "CleanupPolicy", "EveryNLateEvents",
                                     "FixedLateness", "LateWindowedGroupByKey",
                                     "PredictiveCleanup"}
    assert set(staleness.__all__) == {"StalenessPlanner", "StalenessRefire", "StalenessTrigger",
                                      "max_staleness"}
    for package in (lateness, staleness):
        for name in package.__all__:
            assert getattr(beam_ext, name) is getattr(package, name)


def test_moved_public_names_stay_importable_from_their_old_modules():
    from beam_ext import state
    from beam_ext.state import cleanup
    from beam_ext.transforms import late_triggers, lateness

    assert state.PredictiveCleanup is cleanup.PredictiveCleanup is lateness.PredictiveCleanup
    assert "PredictiveCleanup" in state.__all__
    for name in late_triggers.__all__:
        assert getattr(late_triggers, name) is getattr(lateness, name)
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        state.Missing  # noqa: B018
