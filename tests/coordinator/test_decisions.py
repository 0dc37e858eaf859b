"""The coordinator's pure decisions, driven by a fake clock."""

from rcswarm.coordinator.decisions import (
    MembershipOptions,
    RoundOptions,
    RoundView,
    WorkerView,
    decide_admission,
    decide_evictions,
    decide_round_close,
)

MEMBERSHIP = MembershipOptions(lease_s=10.0, max_workers=2)
ROUNDS = RoundOptions(round_deadline_s=30.0)


def worker(wid: str, last_seen: float, base: int = 0, active: bool = True) -> WorkerView:
    return WorkerView(wid, last_seen, base, active)


def test_admission_admits_until_full_and_counts_only_live_leases():
    assert decide_admission(100.0, [], False, MEMBERSHIP).ok
    assert decide_admission(100.0, [worker("a", 95.0)], False, MEMBERSHIP).ok
    full = decide_admission(100.0, [worker("a", 95.0), worker("b", 99.0)], False, MEMBERSHIP)
    assert not full.ok and "full" in full.reason and "max_workers=2" in full.reason
    # b's lease expired at 99 + 10 = 109: at 109.5 its slot counts as free, and left workers never count.
    assert decide_admission(109.5, [worker("a", 105.0), worker("b", 99.0)], False, MEMBERSHIP).ok
    assert decide_admission(100.0, [worker("a", 99.0), worker("b", 99.0, active=False)], False, MEMBERSHIP).ok


def test_admission_refused_after_the_run_finished():
    decision = decide_admission(0.0, [], True, MEMBERSHIP)
    assert not decision.ok and "finished" in decision.reason


def test_eviction_exactly_after_the_lease():
    workers = [worker("a", 0.0), worker("b", 5.0), worker("c", 0.0, active=False)]
    assert decide_evictions(10.0, workers, MEMBERSHIP) == []
    evicted = decide_evictions(10.5, workers, MEMBERSHIP)
    assert [wid for wid, _ in evicted] == ["a"]
    assert "lease expired" in evicted[0][1] and "10.5s" in evicted[0][1]
    assert [wid for wid, _ in decide_evictions(15.01, workers, MEMBERSHIP)] == ["a", "b"]


def test_round_waits_for_every_active_worker_of_its_version():
    workers = [worker("a", 0.0, base=3), worker("b", 0.0, base=3)]
    no_reports = decide_round_close(100.0, RoundView(3, 0.0, frozenset()), workers, ROUNDS)
    assert not no_reports.ok and "no reports" in no_reports.reason
    half = decide_round_close(1.0, RoundView(3, 0.0, frozenset({"a"})), workers, ROUNDS)
    assert not half.ok and "waiting for 1 of 2" in half.reason
    done = decide_round_close(1.0, RoundView(3, 0.0, frozenset({"a", "b"})), workers, ROUNDS)
    assert done.ok and "all 2 active workers reported" in done.reason


def test_round_closes_at_the_deadline_with_the_reports_it_has():
    workers = [worker("a", 0.0, base=3), worker("b", 0.0, base=3)]
    round_ = RoundView(3, 100.0, frozenset({"a"}))
    assert not decide_round_close(129.9, round_, workers, ROUNDS).ok
    closed = decide_round_close(130.0, round_, workers, ROUNDS)
    assert closed.ok and "deadline" in closed.reason and "1 worker still training" in closed.reason


def test_departed_and_other_version_workers_are_not_waited_for():
    round_ = RoundView(3, 0.0, frozenset({"a"}))
    left = [worker("a", 0.0, base=4), worker("b", 0.0, base=3, active=False)]
    assert decide_round_close(1.0, round_, left, ROUNDS).ok
    # c still trains from version 2: its update will be stale, so round 3 does not wait for it.
    stale = [worker("a", 0.0, base=4), worker("c", 0.0, base=2)]
    assert decide_round_close(1.0, round_, stale, ROUNDS).ok


def test_min_reports_holds_a_round_until_the_deadline():
    options = RoundOptions(round_deadline_s=30.0, min_reports=2)
    round_ = RoundView(0, 0.0, frozenset({"a"}))
    alone = [worker("a", 0.0, base=1)]
    held = decide_round_close(10.0, round_, alone, options)
    assert not held.ok and "min_reports=2" in held.reason
    assert decide_round_close(30.0, round_, alone, options).ok
    both = decide_round_close(10.0, RoundView(0, 0.0, frozenset({"a", "b"})), alone, options)
    assert both.ok
