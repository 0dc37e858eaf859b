"""A re-join's `previous_worker_id` counts only with that membership's own worker secret (`previous_worker_secret`).

The name was the joiner's claim: any join token's holder could name another worker's ended membership and take its
place in the open round (the real worker, re-joining, then waited for the round to close), its versions, its
curriculum entry, the update a committed round counted for it (after a coordinator restart), or, in a sweep, drop the
place a moved worker held toward its new run and be sent back to a run it never trained. A join naming a membership
without its secret, or with another, is now admitted as one naming none (one WARNING line with the id) and takes
none of it over; the owner, naming it with its secret, still takes each of them over. On the real coordinator objects
over real SQLite state dirs, and over real gRPC on loopback where a worker's client sends the name.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest

from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.sweep import SweepCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state import store as store_module
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from tests.helpers.coordinator import creds, deltas_of, previous, pull_all, refusal_of
from tests.helpers.coordinator import push as push_to
from tests.helpers.specs import tiny_spec
from tests.helpers.waiting import in_thread
from tests.helpers.wire import Wire, push, pushed_and_left, small_deltas

SPEC = tiny_spec(run={"rounds": 20}, sync={"codec": "fp32", "max_update_norm": 100.0},
                 coordinator={"durable": False})
ADAPTIVE = tiny_spec(run={"rounds": 20}, sync={"codec": "fp32"}, inner={"steps": 5}, data={"batch_size": 4},
                     coordinator={"durable": False}, curriculum={
                         "policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 0.3, "tau": 100.0,
                         "budget_seconds": 1000.0})
# How a join names a membership that is not its own: with no secret, or with another member's (its own).
CLAIMS = ["no secret", "another member's secret"]


def open_run(state_dir: Path, spec=SPEC) -> SwarmCoordinator:
    return SwarmCoordinator(spec, StateStore(state_dir, spec.coordinator.keep_checkpoints, durable=False))


def naming(member: Any, claim: str, other: Any) -> dict[str, Any]:
    """The JoinRequest fields of a join naming `member`'s membership without its secret: none, or `other`'s."""
    secret = b"" if claim == "no secret" else other.worker_secret
    return {"previous_worker_id": member.worker_id, "previous_worker_secret": secret}


def warned(caplog: Any, member: Any, *secrets: bytes) -> None:
    """One WARNING names `member`'s membership as named without its secret; no secret shows in the logs."""
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
             and f"names membership {member.worker_id} without that membership's worker secret" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    for secret in (member.worker_secret, *secrets):
        assert secret.hex() not in caplog.text


@pytest.mark.parametrize("claim", CLAIMS)
def test_a_join_naming_another_workers_ended_membership_takes_not_its_place_in_the_round(start_coordinator, caplog,
                                                                                          claim):
    """Over gRPC, max_workers = 2: a pushed and crashed, its update holds its place; a join token's holder naming a
    without a's secret is refused a place (RESOURCE_EXHAUSTED, as any spare) instead of taking a's; a's worker,
    naming it through its client (which sends the secret), takes it over and its update is not taken twice."""
    caplog.set_level(logging.INFO)
    local = start_coordinator(tiny_spec(sync={"codec": "fp32", "max_update_norm": 100.0},
                                        coordinator={"max_workers": 2, "lease_s": 30.0}))
    client = local.client()
    wire = Wire(local.target)
    try:
        a, b = pushed_and_left(client, local)
        with pytest.raises(grpc.RpcError) as thief:
            wire.call("Join", pb.JoinRequest(worker_name="thief", run_id=a.run_id, **naming(a, claim, b)))
        assert thief.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, thief.value.details()
        warned(caplog, a, b.worker_secret)
        again = client.join("a", "cpu", 1, run_id=a.run_id, previous=a)
        with pytest.raises(grpc.RpcError) as duplicate:
            push(client, again, small_deltas(local))
        assert duplicate.value.code() == grpc.StatusCode.ALREADY_EXISTS
    finally:
        wire.close()
        client.close()


def delivered_then_ended(coordinator: SwarmCoordinator) -> tuple[pb.JoinResponse, pb.JoinResponse]:
    """(a, b): both pulled version 0, a's update for it is in the open round and a's membership ended."""
    a, b = (coordinator.join(pb.JoinRequest(worker_name=name)) for name in ("a", "b"))
    for member in (a, b):
        pull_all(coordinator, member)
    assert push_to(coordinator, a, deltas_of(coordinator, 1e-3), 64).accepted
    coordinator.leave(pb.LeaveRequest(**creds(a), reason="crashed"))
    return a, b


@pytest.mark.parametrize("claim", CLAIMS)
def test_a_join_naming_another_workers_ended_membership_takes_not_its_versions(tmp_path, caplog, claim):
    """With room in the round, the join is admitted as a first join: none of a's delivered and pulled versions (its
    own update from them is its own, not "already delivered"); the owner's re-join takes them over."""
    coordinator = open_run(tmp_path)
    try:
        a, b = delivered_then_ended(coordinator)
        thief = coordinator.join(pb.JoinRequest(worker_name="thief", **naming(a, claim, b)))
        taken = coordinator.workers[thief.worker_id]
        assert (taken.accepted_version, taken.pulled_version) == (-1, -1)
        warned(caplog, a, b.worker_secret)
        again = coordinator.join(pb.JoinRequest(worker_name="a", **previous(a)))
        owner = coordinator.workers[again.worker_id]
        assert (owner.accepted_version, owner.pulled_version) == (0, 0)
        refusal = refusal_of(lambda: push_to(coordinator, again, deltas_of(coordinator, 1e-3), 64, version=0))
        assert refusal.code == grpc.StatusCode.ALREADY_EXISTS, refusal.message
    finally:
        coordinator.close()


def test_a_re_join_that_took_over_a_delivered_update_is_not_waited_for_when_it_pulls_that_version(tmp_path):
    """a pushed for version 0 and its membership ended; its re-join takes over the delivered update and pulls version 0
    again (a process that does not know it delivered). The round then waits only for b: b's push closes it. Before,
    the pull set the new membership's base version back to 0, the round waited for it (its id is not the update's)
    and its push was a duplicate: the round stalled until its deadline."""
    coordinator = open_run(tmp_path)
    try:
        a, b = delivered_then_ended(coordinator)
        again = coordinator.join(pb.JoinRequest(worker_name="a", **previous(a)))
        pull_all(coordinator, again)
        refusal = refusal_of(lambda: push_to(coordinator, again, deltas_of(coordinator, 1e-3), 64, version=0))
        assert refusal.code == grpc.StatusCode.ALREADY_EXISTS, refusal.message
        assert push_to(coordinator, b, deltas_of(coordinator, 1e-3), 64).accepted
        assert coordinator.version == 1, "the round still waits for the re-join that took a's update over"
        pull_all(coordinator, again)
        assert coordinator.workers[again.worker_id].base_version == 1  # round 1 waits for it
    finally:
        coordinator.close()


def _measured_member(coordinator: SwarmCoordinator) -> pb.JoinResponse:
    """A member with its own entry in the adaptive curriculum (its measured steps), whose update closed round 0 and
    which then left (its entry stays: the round close saved it)."""
    member = coordinator.join(pb.JoinRequest(worker_name="a"))
    pull_all(coordinator, member)
    rows = [pb.Metric(version=0, seq_len=4, batch=4, tokens=0, compute_seconds=0.0, loss=math.nan)]
    rows += [pb.Metric(version=0, step=k, seq_len=4, batch=4, tokens=16, compute_seconds=0.1 * k, loss=5.0)
             for k in range(1, 6)]
    coordinator.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=rows))
    assert push_to(coordinator, member, deltas_of(coordinator, 0.0), 80).accepted
    assert coordinator.version == 1
    coordinator.leave(pb.LeaveRequest(**creds(member), reason="crashed"))
    assert member.worker_id in coordinator.curriculum.workers
    return member


@pytest.mark.parametrize("restart", [False, True], ids=["in memory", "after a restart"])
@pytest.mark.parametrize("claim", CLAIMS)
def test_a_join_naming_another_workers_membership_takes_not_its_curriculum_entry(tmp_path, caplog, claim, restart):
    """The ended membership's own rung and costs stay its own, whether memory still holds it or only the store's
    digest knows it (a restart); the owner's re-join moves them to its new membership."""
    coordinator = open_run(tmp_path, ADAPTIVE)
    try:
        a = _measured_member(coordinator)
        other = coordinator.join(pb.JoinRequest(worker_name="other"))
        if restart:
            coordinator.close()
            coordinator = open_run(tmp_path, ADAPTIVE)
            assert a.worker_id not in coordinator.workers and a.worker_id in coordinator.curriculum.workers
        thief = coordinator.join(pb.JoinRequest(worker_name="thief", **naming(a, claim, other)))
        assert a.worker_id in coordinator.curriculum.workers and thief.worker_id not in coordinator.curriculum.workers
        warned(caplog, a, other.worker_secret)
        again = coordinator.join(pb.JoinRequest(worker_name="a", **previous(a)))
        assert again.worker_id in coordinator.curriculum.workers and a.worker_id not in coordinator.curriculum.workers
    finally:
        coordinator.close()


@pytest.mark.parametrize("claim", CLAIMS)
def test_after_a_restart_a_join_naming_another_workers_membership_takes_not_its_landed_update(tmp_path, caplog,
                                                                                              claim):
    """After a restart the store alone knows whose update round 0 counted, and the digest of each membership's secret:
    a join naming a without a's secret is not entered among round 0's reporters and its update from version 0 is
    stale (its own); a's worker, naming it with its secret, finds its update delivered (ALREADY_EXISTS)."""
    coordinator = open_run(tmp_path)
    try:
        a = coordinator.join(pb.JoinRequest(worker_name="a"))
        pull_all(coordinator, a)
        assert push_to(coordinator, a, deltas_of(coordinator, 1e-3), 64).accepted
        assert coordinator.version == 1
        other = coordinator.join(pb.JoinRequest(worker_name="other"))
    finally:
        coordinator.close()
    restarted = open_run(tmp_path)
    try:
        assert a.worker_id not in restarted.workers
        thief = restarted.join(pb.JoinRequest(worker_name="thief", **naming(a, claim, other)))
        assert restarted.workers[thief.worker_id].accepted_version == -1
        assert restarted.store.reported(thief.worker_id) is None
        refusal = refusal_of(lambda: push_to(restarted, thief, deltas_of(restarted, 1e-3), 64, version=0))
        assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION, refusal.message
        warned(caplog, a, other.worker_secret)
        again = restarted.join(pb.JoinRequest(worker_name="a", **previous(a)))
        assert restarted.store.reported(again.worker_id) == (0, 0)
        refusal = refusal_of(lambda: push_to(restarted, again, deltas_of(restarted, 1e-3), 64, version=0))
        assert refusal.code == grpc.StatusCode.ALREADY_EXISTS, refusal.message
    finally:
        restarted.close()


def _sweep(tmp_path: Path, clock: list[float], **coordinator: Any) -> SweepCoordinator:
    spec = tiny_spec(sweep={"seq_lens": [8, 16]}, run={"rounds": 5}, sync={"codec": "fp32", "max_update_norm": 100.0},
                     coordinator={"lease_s": 60.0, "durable": False, **coordinator})
    return SweepCoordinator(spec, tmp_path, lambda: clock[0])


def _moved_member(sweep: SweepCoordinator) -> tuple[pb.JoinResponse, pb.JoinResponse]:
    """(a worker the sweep moved off the first run toward the second, a member still on the first): 3 workers on the
    first run, none on the second, and the first one's accepted update moves it."""
    members = [sweep.join(pb.JoinRequest(worker_name=name)) for name in "abcdef"]
    first = sweep.runs[0]
    on_first = [m for m in members if first.knows(m.worker_id)]
    for member in members:
        if not first.knows(member.worker_id):
            sweep.leave(pb.LeaveRequest(**creds(member)))
    moved = on_first[0]
    for _ in first.pull(pb.PullParametersRequest(**creds(moved))):
        pass
    header, chunks = tensor_stream.build_payload(deltas_of(first, 1e-3), codec=first.wire_format, run_id=first.run_id,
                                                 version=first.version)
    sweep.push(iter([pb.PushUpdateRequest(meta=pb.UpdateMeta(**creds(moved), base_version=first.version, tokens=100)),
                     pb.PushUpdateRequest(header=header), *(pb.PushUpdateRequest(chunk=c) for c in chunks)]))
    assert first.membership_state(moved.worker_id) == pb.WORKER_STATE_REASSIGNED
    assert sweep._arriving[moved.worker_id][0] == 1
    return moved, on_first[1]


@pytest.mark.parametrize("claim", CLAIMS)
def test_in_a_sweep_a_join_naming_a_moved_worker_without_its_secret_leaves_its_place_toward_its_run(tmp_path, caplog,
                                                                                                   claim):
    """A moved worker counts toward its new run until it joins there (`_arriving`); a join naming it without its
    secret is placed as any other and leaves that count alone; the moved worker's own join hands it over."""
    clock = [1000.0]
    sweep = _sweep(tmp_path, clock)
    try:
        moved, other = _moved_member(sweep)
        sweep.join(pb.JoinRequest(worker_name="thief", run_id=moved.run_id, **naming(moved, claim, other)))
        assert moved.worker_id in sweep._arriving
        warned(caplog, moved, other.worker_secret)
        again = sweep.join(pb.JoinRequest(worker_name="a", run_id=moved.run_id, **previous(moved)))
        assert moved.worker_id not in sweep._arriving and again.run_id == sweep.runs[1].run_id
    finally:
        sweep.close()


@pytest.mark.parametrize("claim", CLAIMS)
def test_in_a_sweep_only_the_owner_of_the_named_membership_is_sent_back_to_its_run(tmp_path, caplog, claim):
    """A re-join goes back to the run it names while that run has room; a join naming another worker's membership
    there is placed as one naming none: in the emptiest run."""
    clock = [1000.0]
    sweep = _sweep(tmp_path, clock)
    try:
        a, b, c, d = (sweep.join(pb.JoinRequest(worker_name=name)) for name in "abcd")
        assert [m.run_id for m in (a, b, c, d)] == [run.run_id for run in sweep.runs] * 2
        for member in (c, b, d):  # the first run keeps a, the second none
            sweep.leave(pb.LeaveRequest(**creds(member)))
        thief = sweep.join(pb.JoinRequest(worker_name="thief", run_id=c.run_id, **naming(c, claim, a)))
        assert thief.run_id == sweep.runs[1].run_id
        assert "back to" not in sweep.runs[1].store.events("assign")[-1].reason
        warned(caplog, c, a.worker_secret)
        again = sweep.join(pb.JoinRequest(worker_name="c", run_id=c.run_id, **previous(c)))
        assert again.run_id == c.run_id and "back to" in sweep.runs[0].store.events("assign")[-1].reason
    finally:
        sweep.close()


@pytest.mark.parametrize("run_busy", ["the first run", "the run the worker trained for"])
def test_a_sweep_re_join_waits_for_no_commit_of_a_run_to_check_the_membership_it_names(tmp_path, run_busy):
    """The check of a re-join's name reads no store while memory holds the membership, and a store only through its
    read connection: with a run's writer lock held (a commit on a slow disk), a re-join naming a membership of the
    second run is still checked. Before, every run before the one knowing the id was asked through its writer lock
    (the first run's commit held up a re-join into the second), and the run holding the membership in memory read its
    store too."""
    clock = [1000.0]
    sweep = _sweep(tmp_path, clock)
    try:
        a, b = (sweep.join(pb.JoinRequest(worker_name=name)) for name in "ab")
        assert b.run_id == sweep.runs[1].run_id
        sweep.leave(pb.LeaveRequest(**creds(b)))
        busy = sweep.runs[0] if run_busy == "the first run" else sweep.runs[1]
        request = pb.JoinRequest(worker_name="b", run_id=b.run_id, **previous(b))
        with busy.store._lock:  # a commit under way
            claimed: list[str] = []
            thread = in_thread(lambda: claimed.append(sweep._claimed(request)))
            thread.join(5.0)
            assert claimed == [b.worker_id], "the check of the name waited for a run's commit"
    finally:
        sweep.close()


def test_a_sweep_join_being_seated_counts_once_for_a_placement_beside_it(tmp_path):
    """A sweep's join holds its place in its run until the run's join returns; once the membership is seated there it
    counts as a member only. Before, a join placed right after a member was seated (its run's join not returned yet)
    counted it twice, saw that run full with max_workers = 2, and with the other run full was refused
    RESOURCE_EXHAUSTED."""
    clock = [1000.0]
    sweep = _sweep(tmp_path, clock, max_workers=2)
    try:
        a, b, c = (sweep.join(pb.JoinRequest(worker_name=name)) for name in "abc")
        assert [m.run_id for m in (a, b, c)] == [sweep.runs[0].run_id, sweep.runs[1].run_id, sweep.runs[0].run_id]
        sweep.leave(pb.LeaveRequest(**creds(b)))  # the first run full (a, c), the second empty
        second = sweep.runs[1]
        real_join = second.join
        beside: list[pb.JoinResponse | Refusal] = []

        def join_then_place_another(request: pb.JoinRequest, **kwargs: Any) -> pb.JoinResponse:
            response = real_join(request, **kwargs)
            if request.worker_name == "f":  # seated in the second run, its group join not returned: place another
                try:
                    beside.append(sweep.join(pb.JoinRequest(worker_name="beside")))
                except Refusal as refusal:
                    beside.append(refusal)
            return response

        second.join = join_then_place_another
        first_in = sweep.join(pb.JoinRequest(worker_name="f"))
        assert first_in.run_id == second.run_id
        assert isinstance(beside[0], pb.JoinResponse), beside[0]
        assert beside[0].run_id == second.run_id and second.active_workers() == 2
        assert not sweep._placing
    finally:
        sweep.close()


def test_a_state_dir_without_the_digests_opens_and_its_memberships_are_taken_over_by_none(tmp_path):
    """A state dir written before the secrets' digests were stored (no member_secrets table) opens; a re-join naming
    a membership of it takes nothing over (the store cannot tell its owner), and the joins from then on are stored
    with their digests."""
    coordinator = open_run(tmp_path)
    try:
        a = coordinator.join(pb.JoinRequest(worker_name="a"))
        pull_all(coordinator, a)
        assert push_to(coordinator, a, deltas_of(coordinator, 1e-3), 64).accepted
    finally:
        coordinator.close()
    with sqlite3.connect(tmp_path / "state.sqlite") as db:
        db.execute("DROP TABLE member_secrets")
    db.close()
    restarted = open_run(tmp_path)
    try:
        assert restarted.store.joined_digest(a.worker_id) is None
        assert restarted.store.reported(a.worker_id) == (0, 0)
        again = restarted.join(pb.JoinRequest(worker_name="a", **previous(a)))
        assert restarted.workers[again.worker_id].accepted_version == -1
        assert restarted.store.joined_digest(again.worker_id) == restarted.workers[again.worker_id].secret_sha256
    finally:
        restarted.close()



def test_the_stored_digests_are_bounded_and_the_newest_kept(tmp_path, monkeypatch):
    """A join token's holder joining in a loop grows `member_secrets` by one row a join: past its bound the oldest go,
    as the events' do; the newest joins' digests stay."""
    monkeypatch.setattr(store_module, "MAX_MEMBER_SECRET_ROWS", 6)
    monkeypatch.setattr(store_module, "EVENT_PRUNE_EVERY", 2)
    store = StateStore(tmp_path, durable=False)
    try:
        for n in range(40):
            store.record_join(f"w{n}", [("join", "test")], float(n), secret_sha256=bytes([n]) * 32)
        kept = [n for n in range(40) if store.joined_digest(f"w{n}") is not None]
        assert store.joined_digest("w39") == bytes([39]) * 32
    finally:
        store.close()
    assert kept == list(range(40 - len(kept), 40)) and 6 <= len(kept) <= 6 + 2, kept
