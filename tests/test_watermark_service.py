"""TrackerService and LocalAgent over real gRPC on loopback."""
import logging
import random
import threading

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_ext.clock import ManualClock
from beam_ext.watermark import (
    LocalAgent,
    TrackerAuthError,
    TrackerLimitError,
    TrackerService,
    new_token,
)
from beam_ext.watermark import _tracker_pb2 as pb
from beam_ext.watermark._transport import TOKEN_KEY, client_stubs
from beam_ext.watermark.firm import FirmBound

TOKEN = b"job-secret"
DIAMOND = {"src/0": [], "mid/0": ["src/0"], "mid/1": ["src/0"], "sink/0": ["mid/0", "mid/1"]}


@pytest.fixture
def svc():
    s = TrackerService(token=TOKEN).start()
    yield s
    s.stop()


def _agents(svc, graph, **kw):
    kw.setdefault("flush_interval", None)
    return {p: LocalAgent(svc.address, p, TOKEN, **kw) for p in graph}


def _close(agents):
    for a in agents.values():
        a.close()


def test_public_api_example(svc):
    assert svc.address.startswith("127.0.0.1:")
    svc.register_graph(DIAMOND)
    ag = _agents(svc, DIAMOND, flush_interval=0.01)
    seen = []
    ag["sink/0"].on_end_of_substream(seen.append)
    t1, t2 = new_token(), new_token()
    ag["src/0"].sent(b"k1", t1, to="mid/0")
    ag["src/0"].promise(b"k1")
    ag["mid/0"].sent(b"k1", t2, to="sink/0")
    ag["mid/0"].received(b"k1", t1)
    assert ag["mid/1"].wait(b"k1", timeout=30)
    assert ag["mid/0"].wait(b"k1", timeout=30)
    ag["src/0"].flush()
    ag["mid/0"].flush()
    assert not ag["sink/0"].ended(b"k1")  # t2 is still in flight to sink/0
    ag["sink/0"].received(b"k1", t2)
    assert ag["sink/0"].wait(b"k1", timeout=30)
    _close(ag)
    assert seen == [b"k1"]


def test_wrong_or_missing_token_is_refused_and_counted(svc):
    svc.register_graph(DIAMOND)
    with pytest.raises(TrackerAuthError, match="refused the job token"):
        LocalAgent(svc.address, "mid/0", b"not-the-secret")
    channel = grpc.insecure_channel(svc.address)
    stubs = client_stubs(channel)
    batch = pb.ReportBatch(process_id="src/0", seq=1, source_promises=[pb.HostSubstream(substream=pb.Substream(int_id=1), process="src/0")])
    with pytest.raises(grpc.RpcError) as err:
        stubs["Report"](batch, timeout=10)  # no token at all
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError):
        stubs["Report"](batch, metadata=((TOKEN_KEY, b"guess"),), timeout=10)
    channel.close()
    assert svc.stats()["rejected_calls"] == 3
    # The refused promise was never acted on.
    assert svc.waiting_on(1) == {}


def test_duplicate_and_out_of_order_batches(svc):
    svc.register_graph({"src/0": [], "sink/0": ["src/0"]})
    channel = grpc.insecure_channel(svc.address)
    stubs = client_stubs(channel)
    md = ((TOKEN_KEY, TOKEN),)
    inc = stubs["Hello"](pb.HelloRequest(process_id="src/0"), metadata=md, timeout=10).incarnation
    entry = pb.XorEntry(substream=pb.Substream(int_id=3), segment="sink/0", xor=77)
    b1 = pb.ReportBatch(process_id="src/0", seq=1, incarnation=inc, entries=[entry])
    b2 = pb.ReportBatch(process_id="src/0", seq=2, incarnation=inc, source_promises=[pb.HostSubstream(substream=pb.Substream(int_id=3), process="src/0")])
    ack = stubs["Report"](b2, metadata=md, timeout=10)  # arrives first: held
    assert ack.applied_seq == 0
    assert svc.waiting_on(3) == {}
    stubs["Report"](b1, metadata=md, timeout=10)
    assert stubs["Report"](b1, metadata=md, timeout=10).duplicate
    assert svc.stats()["duplicate_reports"] == 1
    # Had the duplicate been applied, 77 ^ 77 would have ended substream 3.
    assert svc.waiting_on(3)["segments_in_flight"] == ["sink/0"]
    channel.close()


def test_bad_report_fails_the_agent_clearly(svc):
    svc.register_graph(DIAMOND)
    a = LocalAgent(svc.address, "mid/0", TOKEN, flush_interval=None)
    a.sent(1, 5, to="mid/1")  # mid/0 has no channel to mid/1
    with pytest.raises(ValueError, match="not upstream of 'mid/1'"):
        a.flush()
    with pytest.raises(ValueError):
        a.sent(1, 6, to="sink/0")
    a.close()
    with pytest.raises(TypeError, match="substream"):
        LocalAgent(svc.address, "src/0", TOKEN, flush_interval=None).sent(1.5, 1, to="mid/0")
    with pytest.raises(ValueError, match="token must be in"):
        LocalAgent(svc.address, "src/0", TOKEN, flush_interval=None).sent(1, -1, to="mid/0")


def test_binds_loopback_by_default_and_checks_arguments():
    with pytest.raises(ValueError, match="token"):
        TrackerService(token=b"")
    with pytest.raises(ValueError, match="port"):
        TrackerService(token=TOKEN, port=70000)
    s = TrackerService(token=TOKEN)
    with pytest.raises(RuntimeError, match="not started"):
        _ = s.address
    s.start()
    assert s.address.startswith("127.0.0.1:")
    s.stop()


def test_consistent_order_under_coarse_time_ties(svc):
    """Substreams ending in reverse order are released in (label, id) order."""
    svc.register_graph({"src/0": [], "src/1": [], "sink/0": ["src/0", "src/1"]})
    ag = _agents(svc, ["src/0", "src/1", "sink/0"])
    got = []
    ag["sink/0"].on_end_of_substream(got.append)
    rng = random.Random(3)
    subs = list(range(8))
    toks = {s: new_token() for s in subs}
    for s in subs:
        # Labels tie in pairs (coarse time): 0,1 -> 10; 2,3 -> 11; ...
        ag["src/0"].sent(s, toks[s], to="sink/0", label=10 + s // 2)
        ag["src/0"].promise(s, label=10 + s // 2)
        ag["src/1"].promise(s, label=10 + s // 2)
    ag["src/0"].flush()
    ag["src/1"].flush()
    order = subs[:]
    rng.shuffle(order)
    for s in order:
        ag["sink/0"].received(s, toks[s])
        ag["sink/0"].flush()
    assert ag["sink/0"].wait(7, timeout=30)
    _close(ag)
    assert got == subs


def test_labels_follow_the_injected_clock(svc):
    clock = ManualClock(1.0)
    svc.register_graph({"src/0": [], "sink/0": ["src/0"]})
    a = LocalAgent(svc.address, "src/0", TOKEN, flush_interval=None, clock=clock, time_slack=0.01)
    assert a.label_now() == 100
    clock.advance(0.015)
    assert a.label_now() == 102  # ceil(101.5)
    a.close()


def test_firm_bound_holds_back_the_next_epoch(svc):
    svc.register_graph({"src/0": [], "op/0": ["src/0"]})
    src = LocalAgent(svc.address, "src/0", TOKEN, flush_interval=0.005)
    op = LocalAgent(svc.address, "op/0", TOKEN, flush_interval=0.005)
    log = []
    done = threading.Event()
    gate = FirmBound(op, first=0, on_end=lambda e: (log.append(("end", e)), e == 2 and done.set()))
    mailbox = []
    for epoch in range(3):
        for _ in range(4):
            tok = new_token()
            src.sent(epoch, tok, to="op/0")
            mailbox.append((epoch, tok))
        src.promise(epoch)
    random.Random(5).shuffle(mailbox)  # epochs interleave in the mailbox
    for epoch, tok in mailbox:
        gate.push((epoch, tok), epoch)
    while not done.is_set():
        for epoch, tok in gate.ready():
            log.append(("element", epoch))
            op.received(epoch, tok)
        done.wait(0.01)
    src.close()
    op.close()
    expected = []
    for e in range(3):
        expected += [("element", e)] * 4 + [("end", e)]
    assert log == expected


def test_lost_process_is_reported(caplog):
    clock = ManualClock(0.0)
    lost = []
    s = TrackerService(token=TOKEN, clock=clock, heartbeat_timeout=5.0,
                       on_process_lost=lambda p, silent: lost.append((p, silent))).start()
    s.register_graph(DIAMOND)
    a = LocalAgent(s.address, "mid/0", TOKEN, flush_interval=None)
    b = LocalAgent(s.address, "mid/1", TOKEN, flush_interval=None)
    clock.advance(3.0)
    b.sent(1, 3, to="sink/0")
    b.flush()  # mid/1 reports at t=3; mid/0 has been silent since t=0
    a.sent(1, 2, to="sink/0")  # buffered, not flushed: still silent
    clock.advance(3.0)
    with caplog.at_level(logging.WARNING):
        assert s.check_liveness() == ["mid/0"]
    assert lost == [("mid/0", 6.0)]
    assert "'mid/0' stopped reporting" in caplog.text
    assert s.check_liveness() == []  # reported once
    b.close()  # a closing agent is not lost
    clock.advance(10.0)
    assert s.check_liveness() == []
    assert "mid/1" not in s.lost_processes() and "mid/0" in s.lost_processes()
    a.close()
    s.stop()


def test_restart_from_snapshot_loses_no_open_substream():
    s1 = TrackerService(token=TOKEN).start()
    port = int(s1.address.rsplit(":", 1)[1])
    s1.register_graph(DIAMOND)
    ag = _agents(s1, DIAMOND, flush_interval=0.01)
    toks = {}
    for k in range(6):
        toks[k] = (new_token(), new_token())
        ag["src/0"].sent(k, toks[k][0], to="mid/0")
        ag["src/0"].promise(k)
    ag["src/0"].flush()
    for k in range(3):
        ag["mid/0"].sent(k, toks[k][1], to="sink/0")
        ag["mid/0"].received(k, toks[k][0])
    ag["mid/0"].flush()
    assert ag["mid/0"].wait(2, timeout=30)
    snap = s1.snapshot()
    # Reports after the snapshot are lost with the service...
    for k in range(3, 6):
        ag["mid/0"].sent(k, toks[k][1], to="sink/0")
        ag["mid/0"].received(k, toks[k][0])
    ag["mid/0"].flush()
    s1.stop()
    # ...and some are made while it is down.
    for k in range(3):
        ag["sink/0"].received(k, toks[k][1])
    s2 = TrackerService(token=TOKEN, port=port, restore_from=snap).start()
    for k in range(3, 6):
        ag["sink/0"].received(k, toks[k][1])
    for k in range(6):
        # Generous timeouts: agents find the new incarnation on their own schedule.
        assert ag["sink/0"].wait(k, timeout=60), (k, s2.waiting_on(k))
        assert ag["mid/0"].wait(k, timeout=60), (k, s2.waiting_on(k))
        assert ag["mid/1"].wait(k, timeout=60), (k, s2.waiting_on(k))
    assert s2.stats()["resyncs"] >= 1
    _close(ag)
    s2.stop()


# -- property: no NEOSS while an element is in flight upstream --------------------------

RR = {"src/0": [], "src/1": [], "a/0": ["src/0", "src/1"], "a/1": ["src/0", "src/1"],
      "b/0": ["a/0", "a/1"], "b/1": ["a/0", "a/1"]}
DOWN = {p: [q for q, u in RR.items() if p in u] for p in RR}
UP_CLOSURE = {"a/0": {"src/0", "src/1", "a/0"}, "a/1": {"src/0", "src/1", "a/1"},
              "b/0": set(RR) - {"b/1"}, "b/1": set(RR) - {"b/0"}}


@pytest.fixture(scope="module")
def rr_service():
    s = TrackerService(token=TOKEN, consistent_order=False).start()
    s.register_graph(RR)
    yield s
    s.stop()


_counter = [0]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n_elements=st.integers(1, 14))
def test_no_neoss_while_in_flight_upstream(rr_service, seed, n_elements):
    rng = random.Random(seed)
    _counter[0] += 1
    base = _counter[0] * 1000  # fresh substream ids per example on a shared service
    subs = [base + i for i in range(3)]
    ag = _agents(rr_service, RR)
    in_flight = []  # (substream, dest, token)
    unpromised = {(src, s) for src in ("src/0", "src/1") for s in subs}
    violations = []

    def check():
        for p in UP_CLOSURE:
            for s in subs:
                if ag[p].ended(s):
                    # Ended for p: nothing of s in flight to p or upstream of p, all promised.
                    bad = [x for x in in_flight if x[0] == s and x[1] in UP_CLOSURE[p]]
                    if bad or any(u[1] == s for u in unpromised):
                        violations.append((p, s, bad))

    emitted = 0
    while in_flight or unpromised:  # emitting stops once every (source, substream) is promised
        r = rng.random()
        if r < 0.3 and emitted < n_elements:
            src = rng.choice(["src/0", "src/1"])
            s = rng.choice(subs)
            if (src, s) in unpromised:
                tok = new_token()
                d = rng.choice(DOWN[src])
                ag[src].sent(s, tok, to=d)
                in_flight.append((s, d, tok))
                emitted += 1
        elif r < 0.6 and in_flight:
            s, q, tok = in_flight.pop(rng.randrange(len(in_flight)))
            for d in DOWN[q][: rng.choice([0, 1, 2])]:
                t2 = new_token()
                ag[q].sent(s, t2, to=d)
                in_flight.append((s, d, t2))
            ag[q].received(s, tok)
        elif r < 0.7 and unpromised and (emitted >= n_elements or rng.random() < 0.3):
            # Once everything is promised no more elements can be emitted: the loop ends.
            src, s = rng.choice(sorted(unpromised, key=str))
            unpromised.discard((src, s))
            ag[src].promise(s)
        else:
            # Flushes happen in random order, so reports of different processes reorder.
            ag[rng.choice(list(RR))].flush()
        check()
    for p in rng.sample(list(RR), len(RR)):
        ag[p].flush()
    for p in UP_CLOSURE:
        for s in subs:
            assert ag[p].wait(s, timeout=30), (p, s)
    check()
    _close(ag)
    assert violations == []


def test_executor_agent_reports_for_its_processes(svc):
    """One local agent per executor: one flush and one notification serve all its processes."""
    graph = {"src/0": [], "src/1": [], "a/0": ["src/0", "src/1"], "a/1": ["src/0", "src/1"],
             "b/0": ["a/0", "a/1"], "b/1": ["a/0", "a/1"]}
    svc.register_graph(graph)
    ex = {j: LocalAgent(svc.address, f"exec/{j}", TOKEN, flush_interval=None,
                        hosts=[f"src/{j}", f"a/{j}", f"b/{j}"]) for j in (0, 1)}
    view = {p: ex[int(p[-1])].for_process(p) for p in graph}
    with pytest.raises(ValueError, match="pass at="):
        ex[0].sent(1, 5, to="a/1")
    with pytest.raises(ValueError, match="not a process hosted"):
        ex[0].for_process("a/1")
    t1, t2 = new_token(), new_token()
    view["src/0"].sent(1, t1, to="a/1")
    view["src/0"].promise(1)
    view["src/1"].promise(1)
    view["a/1"].sent(1, t2, to="b/0")
    view["a/1"].received(1, t1)
    ex[0].flush()
    before = svc.stats()["report_batches"]
    ex[1].flush()
    assert svc.stats()["report_batches"] == before + 1  # three reports, one batch
    for p in ("a/0", "a/1", "b/1"):
        assert view[p].wait(1, timeout=30), p
    assert not view["b/0"].ended(1)
    view["b/0"].received(1, t2)
    ex[0].flush()
    assert view["b/0"].wait(1, timeout=30)
    for a in ex.values():
        a.close()
    with pytest.raises(ValueError, match="not in the registered graph"):
        LocalAgent(svc.address, "exec/9", TOKEN, hosts=["ghost/0"])


def test_public_names_are_re_exported():
    import beam_ext
    import beam_ext.watermark as wm

    for name in ("TrackerService", "LocalAgent", "FirmBound", "PunctuationTracker", "new_token"):
        assert getattr(beam_ext, name) is getattr(wm, name)


# -- bounded open substreams, lost processes ------------------------------------------

def test_open_substream_bound_refuses_the_reporter_clearly():
    s = TrackerService(token=TOKEN, max_open_substreams=3).start()
    s.register_graph(DIAMOND)
    a = LocalAgent(s.address, "src/0", TOKEN, flush_interval=None)
    for k in range(3):
        a.sent(k, new_token(), to="mid/0")  # never promised
    a.flush()
    a.sent(3, new_token(), to="mid/0")
    with pytest.raises(TrackerLimitError, match=r"refused the reports of 'src/0'.*max_open_substreams=3"):
        a.flush()
    # Its reports can be neither applied nor dropped: the agent stays failed.
    with pytest.raises(TrackerLimitError):
        a.sent(0, new_token(), to="mid/0")
    stats = s.stats()
    assert stats["open_limit_refusals"] == 1
    assert stats["open_substreams"] == 3
    assert stats["invalid_reports"] == 0
    a.close()
    with pytest.raises(ValueError, match="max_open_substreams"):
        TrackerService(token=TOKEN, max_open_substreams=0)
    s.stop()


@pytest.mark.parametrize("retire_lost", [True, False])
def test_substreams_a_lost_source_never_promised_are_retired(caplog, retire_lost):
    caplog.set_level(logging.WARNING)
    clock = ManualClock(0.0)
    s = TrackerService(token=TOKEN, clock=clock, heartbeat_timeout=5.0, retire_lost=retire_lost).start()
    s.register_graph({"src/0": [], "src/1": [], "sink/0": ["src/0", "src/1"]})
    ag = _agents(s, ["src/0", "src/1", "sink/0"])
    ag["src/0"].promise(0)
    ag["src/0"].flush()  # src/0 promises substream 0 only, then falls silent
    clock.advance(3.0)
    toks = {k: new_token() for k in range(4)}
    for k in range(4):
        ag["src/1"].sent(k, toks[k], to="sink/0")
        ag["src/1"].promise(k)
        ag["sink/0"].received(k, toks[k])
    ag["src/1"].flush()
    ag["sink/0"].flush()
    assert ag["sink/0"].wait(0, timeout=30)
    ag["sink/0"].flush()  # acknowledges 0, which retires
    assert s.stats()["open_substreams"] == 3
    clock.advance(3.0)  # src/0 silent for 6 s, the others for 3 s
    s.check_liveness()  # (the service's own monitor may have run it first)
    assert list(s.lost_processes()) == ["src/0"]
    stats = s.stats()
    if not retire_lost:
        assert stats["open_substreams"] == 3 and stats["abandoned_substreams"] == 0
        assert s.waiting_on(1)["missing_promises"] == ["src/0"]
    else:
        assert stats["open_substreams"] == 0 and stats["abandoned_substreams"] == 3
        assert "abandoned 3 substream(s) that cannot end everywhere while process(es) ['src/0']" in caplog.text
        assert s.waiting_on(1) == {} and s.notified(1) == set()
        # src/0 comes back: its report on a retired substream is counted late, not applied.
        ag["src/0"].sent(1, new_token(), to="sink/0")
        ag["src/0"].flush()
        assert s.stats()["late_reports"] == 1 and s.stats()["open_substreams"] == 0
    assert not ag["sink/0"].ended(1)
    _close(ag)
    s.stop()


def test_a_lost_target_that_reports_again_is_awaited_at_once():
    # A long timeout: the service's own monitor must not run check_liveness here.
    clock = ManualClock(0.0)
    s = TrackerService(token=TOKEN, clock=clock, heartbeat_timeout=60.0).start()
    s.register_graph({"src/0": [], "sink/0": ["src/0"]})
    ag = _agents(s, ["src/0", "sink/0"])
    ag["src/0"].promise(9)
    ag["src/0"].flush()
    assert ag["sink/0"].wait(9, timeout=10)  # so sink/0 subscribed at t=0
    clock.advance(61.0)
    ag["src/0"].sent(0, new_token(), to="sink/0")
    ag["src/0"].flush()  # only sink/0 is silent
    assert s.check_liveness() == ["sink/0"]
    assert s.stats()["abandoned_substreams"] == 1  # 0 was in flight to it
    dead = ag["sink/0"]
    ag["sink/0"] = LocalAgent(s.address, "sink/0", TOKEN, flush_interval=None)  # restarted
    token = new_token()
    ag["src/0"].sent(5, token, to="sink/0")
    ag["src/0"].promise(5)
    ag["src/0"].flush()
    # The element is in flight to a live process: the substream must wait for it.
    assert s.stats()["abandoned_substreams"] == 1 and s.stats()["open_substreams"] == 1
    ag["sink/0"].received(5, token)
    ag["sink/0"].flush()
    assert ag["sink/0"].wait(5, timeout=10)
    assert s.lost_processes() == {}
    _close(ag)
    dead.close()
    s.stop()


def test_report_only_agents_leave_notifications_to_the_listening_agent(svc):
    svc.register_graph(DIAMOND)
    procs = sorted(DIAMOND)
    driver = LocalAgent(svc.address, "driver", TOKEN, flush_interval=None, hosts=procs)
    assert driver.wait(b"warm-up", timeout=0.2, process="sink/0") is False  # subscribed by now
    executor = LocalAgent(svc.address, "exec-1", TOKEN, flush_interval=None, hosts=procs, listen=False)
    with pytest.raises(RuntimeError, match="reports only"):
        executor.wait(b"k", timeout=0.1)
    tok = new_token()
    executor.sent(b"k", tok, to="mid/0", at="src/0")
    executor.received(b"k", tok, at="mid/0")
    executor.flush()
    driver.promise(b"k", at="src/0")
    driver.flush()
    assert driver.wait(b"k", timeout=30, process="sink/0")
    executor.close()
    driver.close()

