"""The threaded dataflow simulator with both mechanisms (real gRPC for trAcker)."""
import pytest

from beam_ext.watermark.simulator import Workload, simulate


@pytest.mark.parametrize("mechanism", ["punctuation", "tracker", "tracker_agent", "tracker_local"])
def test_rr_workload_ends_every_substream_everywhere(mechanism):
    w = Workload(stages=2, parallelism=2, elements=24, granularity=4)
    r = simulate(w, mechanism, seed=7, delay=(0.0, 0.002))
    assert r.completed and not r.stalled
    assert r.violations == 0
    assert r.ends == 4 * w.substreams  # 2 stages x 2 processes
    if mechanism == "punctuation":
        # Every process forwards every watermark rise on each of its output channels.
        assert r.service_messages == w.substreams * w.stages * w.parallelism ** 2
    if mechanism == "tracker":
        # One message per report: per element-hop an SND and an RCV; a promise per
        # source and substream; at most one notification per (process, substream).
        hops = w.elements * w.stages
        assert r.message_breakdown["reports"] == 2 * hops + w.parallelism * w.substreams
        assert 1 <= r.message_breakdown["notifications"] <= 4 * w.substreams


def test_cyclic_graph_stalls_punctuations_but_not_tracker():
    w = Workload(stages=1, parallelism=2, elements=30, granularity=5, cyclic=True, max_passes=3)
    p = simulate(w, "punctuation", seed=3, stall_grace=0.5)
    assert p.stalled and not p.completed
    for mech in ("tracker_agent", "tracker_local"):
        t = simulate(w, mech, seed=3)
        assert t.completed and t.violations == 0
        assert t.ends == 4 * w.substreams  # loop/0, loop/1, sink/0, sink/1


def test_workload_checks_arguments():
    with pytest.raises(ValueError, match="Workload.stages"):
        Workload(stages=0, parallelism=1, elements=1, granularity=1)
    with pytest.raises(ValueError, match="mechanism"):
        simulate(Workload(1, 1, 1, 1), "carrier-pigeon")
