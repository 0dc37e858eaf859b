"""Sweeps: the assignment and move decisions over several runs, and the [sweep] and [curriculum] keys' validation.

Workers scheduled across a sweep's runs by a real coordinator are tests/swarm/test_sweep.py."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from rcswarm.coordinator.sweep import RunLoad, SweepCoordinator, decide_assignment, decide_move
from tests.helpers.coordinator import previous
from tests.helpers.specs import tiny_spec


def loads(*items: tuple[int, bool]) -> list[RunLoad]:
    return [RunLoad(i, f"L{i}", active, finished) for i, (active, finished) in enumerate(items)]


def test_assignment_goes_to_the_emptiest_unfinished_run():
    assert decide_assignment(loads((1, False), (0, False), (0, False)))[0] == 1
    assert decide_assignment(loads((0, True), (2, False), (3, False)))[0] == 1
    index, reason = decide_assignment(loads((0, True), (0, True)))
    assert index is None and "finished" in reason


def test_moves_happen_when_a_run_finished_or_is_unbalanced():
    assert decide_move(loads((1, True), (1, False)), 0)[0]
    assert decide_move(loads((3, False), (1, False)), 0)[0]
    assert not decide_move(loads((2, False), (1, False)), 0)[0]
    move, reason = decide_move(loads((1, False), (0, True)), 0)
    assert not move and "no other unfinished run" in reason
    # A full run is no destination: its places are taken (review of the sweep's wire, 2026-11-29).
    finished_here, full_there = RunLoad(0, "L0", 1, True), RunLoad(1, "L1", 0, False, full=True)
    move, reason = decide_move([finished_here, full_there, RunLoad(2, "L2", 3, False)], 0)
    assert move and "moving toward L2" in reason
    move, reason = decide_move([finished_here, full_there], 0)
    assert not move and "no other unfinished run with room" in reason


def test_a_sweep_needs_lengths(tmp_path):
    with pytest.raises(ValueError, match="sweep.seq_lens"):
        SweepCoordinator(tiny_spec(), tmp_path)


def test_curriculum_schedules_are_validated():
    from rcswarm.config.runspec import RunSpec

    with pytest.raises(ValueError, match="curriculum.schedule"):
        RunSpec.from_dict({"curriculum": {"schedule": [[5, 16, 4]]}})
    with pytest.raises(ValueError, match="curriculum.schedule"):
        RunSpec.from_dict({"curriculum": {"schedule": [[0, 16, 4], [0, 32, 2]]}})
    with pytest.raises(ValueError, match="curriculum.schedule"):
        RunSpec.from_dict({"curriculum": {"schedule": [[0, 16]]}})


def test_a_returning_worker_goes_back_to_its_run_while_it_is_unfinished_and_has_room():
    index, reason = decide_assignment(loads((2, False), (0, False)), returning=0)
    assert index == 0 and reason.startswith("back to L0")
    assert decide_assignment(loads((1, True), (0, False), (3, False)), returning=0)[0] == 1
    full = [RunLoad(0, "L0", 4, False, full=True), RunLoad(1, "L1", 1, False)]
    assert decide_assignment(full, returning=0)[0] == 1


def test_with_every_unfinished_run_full_no_run_is_assigned_and_the_reason_names_them():
    both_full = [RunLoad(0, "L8", 1, False, full=True), RunLoad(1, "L16", 0, True), RunLoad(2, "L32", 1, False, full=True)]
    index, reason = decide_assignment(both_full, returning=0)
    assert index is None and reason == "every unfinished run of the sweep is full: L8 (1 active), L32 (1 active)"
    # A full run is never picked over one with room, even when it has fewer workers (runs with their own caps).
    assert decide_assignment([RunLoad(0, "L8", 0, False, full=True), RunLoad(1, "L16", 3, False)])[0] == 1


def _sweep(state_dir, **coordinator):
    base = tiny_spec(run={"rounds": 5}, coordinator=coordinator)
    return SweepCoordinator(base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [8, 16]}}), state_dir)


def test_a_full_sweep_refuses_a_join_with_when_to_ask_again_and_a_finished_one_without(tmp_path):
    import grpc

    from rcswarm.coordinator.records import Refusal
    from rcswarm.protos.v1 import coordinator_pb2 as pb

    sweep = _sweep(tmp_path, max_workers=1, lease_s=6.0)
    for name in ("a", "b"):
        sweep.join(pb.JoinRequest(worker_name=name))
    with pytest.raises(Refusal) as refused:
        sweep.join(pb.JoinRequest(worker_name="spare"))
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and refused.value.place_retry_s == 2.0
    assert "every unfinished run of the sweep is full: " in refused.value.message
    assert sweep.status().waiting_for_place == 1
    for run in sweep.runs:
        run.stop("the test ends the sweep")
    with pytest.raises(Refusal) as finished:
        sweep.join(pb.JoinRequest(worker_name="late"))
    assert finished.value.code == grpc.StatusCode.FAILED_PRECONDITION and finished.value.place_retry_s == 0
    sweep.close()


def test_a_restarted_sweep_sends_each_worker_back_to_its_run_but_not_one_it_moved(tmp_path):
    from rcswarm.protos.v1 import coordinator_pb2 as pb

    sweep = _sweep(tmp_path)
    first, second = (sweep.join(pb.JoinRequest(worker_name=name)) for name in ("a", "b"))
    assert [first.run_id, second.run_id] == [run.run_id for run in sweep.runs]
    sweep.close()
    restarted = _sweep(tmp_path)
    # The L = 16 worker comes back first; both runs are empty, and it still lands on its own run.
    back = restarted.join(pb.JoinRequest(worker_name="b", run_id=second.run_id, **previous(second)))
    assert back.run_id == second.run_id
    assert "back to" in restarted.runs[1].store.events("assign")[-1].reason
    # A worker the sweep moved off a run (REASSIGNED there) is placed afresh, not sent back.
    other = restarted.join(pb.JoinRequest(worker_name="c"))
    assert other.run_id == restarted.runs[0].run_id
    restarted.runs[0].reassign(other.worker_id, "reassigned: rebalancing")
    again = restarted.join(pb.JoinRequest(worker_name="c", run_id=other.run_id, **previous(other)))
    assert again.run_id == restarted.runs[0].run_id
    assert "back to" not in restarted.runs[0].store.events("assign")[-1].reason
    restarted.close()


def test_a_worker_moved_toward_a_run_counts_there_until_it_joins(tmp_path):
    """A worker moved off a run was invisible until it joined its new one: the next push moved a second worker, and
    the tie sent one of the two straight back (a model rebuild, a full pull and a round lost for nothing)."""
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from rcswarm.sync import tensor_stream
    from tests.helpers.coordinator import creds, deltas_of

    clock = [1000.0]
    spec = tiny_spec(sweep={"seq_lens": [8, 16]}, run={"rounds": 5}, sync={"codec": "fp32", "max_update_norm": 100.0},
                     coordinator={"lease_s": 60.0})
    sweep = SweepCoordinator(spec, tmp_path, lambda: clock[0])
    members = [sweep.join(pb.JoinRequest(worker_name=name)) for name in "abcdef"]
    first = sweep.runs[0]
    on_first = [m for m in members if first.knows(m.worker_id)]
    for member in members:
        if not first.knows(member.worker_id):
            sweep.leave(pb.LeaveRequest(**creds(member)))  # 3 workers on the first run, none on the second
    for member in on_first[:2]:
        for _ in first.pull(pb.PullParametersRequest(**creds(member))):
            pass
        header, chunks = tensor_stream.build_payload(deltas_of(first, 1e-3), codec=first.wire_format,
                                                     run_id=first.run_id, version=first.version)
        sweep.push(iter([pb.PushUpdateRequest(meta=pb.UpdateMeta(**creds(member), base_version=first.version, tokens=100)),
                         pb.PushUpdateRequest(header=header), *(pb.PushUpdateRequest(chunk=c) for c in chunks)]))
    states = [first.membership_state(m.worker_id) for m in on_first[:2]]
    assert states == [pb.WORKER_STATE_REASSIGNED, pb.WORKER_STATE_ACTIVE]  # 2 there and 1 arriving: balanced
    moved = on_first[0]
    again = sweep.join(pb.JoinRequest(worker_name="a", run_id=moved.run_id, **previous(moved)))
    assert again.run_id == sweep.runs[1].run_id
    clock[0] += 2 * 60.0 + 1  # a moved worker that never joins stops counting after two leases
    sweep.runs[0].reassign(on_first[1].worker_id, "reassigned: test")
    sweep._arriving[on_first[1].worker_id] = (1, clock[0] - 1)
    assert [load.active for load in sweep._loads()] == [1, 1]
    sweep.close()


def test_a_run_refuses_metric_rows_of_another_run_and_keeps_none_of_versions_it_has_not_served(tmp_path):
    import grpc

    from rcswarm.coordinator.records import Refusal
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from tests.helpers.coordinator import creds

    sweep = _sweep(tmp_path)
    member = sweep.join(pb.JoinRequest(worker_name="a"))
    other_run = sweep.runs[1].run_id
    row = pb.Metric(version=0, step=1, seq_len=16, batch=4, loss=3.0, tokens=64)
    with pytest.raises(Refusal) as refused:
        sweep.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=[row], run_id=other_run))
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert other_run in refused.value.message and member.run_id in refused.value.message
    assert sweep.runs[0].store.metric_rows() == [] and sweep.runs[1].store.metric_rows() == []
    # A row of a version the run has not served (it is at 0) belongs to no round of it: not stored.
    own, future = (pb.Metric(version=v, step=1, seq_len=8, batch=4, loss=3.0, tokens=32) for v in (0, 3))
    request = pb.ReportMetricsRequest(**creds(member), metrics=[own, future], run_id=member.run_id)
    assert sweep.report_metrics(request).stored == 1
    assert [row.version for row in sweep.runs[0].store.metric_rows()] == [0] and sweep.runs[1].store.metric_rows() == []
    sweep.close()


def test_a_state_dir_that_holds_other_runs_than_the_config_describes_is_refused(tmp_path):
    from rcswarm.coordinator.sweep import layout_problem, open_group

    single = tiny_spec()
    sweep = single.from_dict({**single.to_dict(), "sweep": {"seq_lens": [8, 16]}})
    other = single.from_dict({**single.to_dict(), "sweep": {"seq_lens": [8, 32]}})
    assert layout_problem(sweep, tmp_path / "new") is None
    open_group(sweep, tmp_path / "sweep").close()
    assert layout_problem(sweep, tmp_path / "sweep") is None
    assert layout_problem(single, tmp_path / "sweep") == (
        f"state dir {tmp_path / 'sweep'} holds a sweep's runs run0-L8, run1-L16, but the config describes one run "
        "(state.sqlite in the state dir itself); use a new --state-dir, or the config the state dir was made with")
    assert "(not in the config: run1-L16; new in the config: run1-L32)" in layout_problem(other, tmp_path / "sweep")
    with pytest.raises(ValueError, match="holds a sweep's runs"):
        open_group(single, tmp_path / "sweep")
    assert not (tmp_path / "sweep" / "state.sqlite").exists()
    open_group(single, tmp_path / "single").close()
    assert "holds one run (state.sqlite in the state dir itself), but the config describes a sweep's runs run0-L8" \
        in layout_problem(sweep, tmp_path / "single")


def test_the_waiting_ledger_forgets_the_silent_and_holds_at_most_its_limit():
    from rcswarm.coordinator.records import Waiting

    waiting = Waiting(limit=3)
    for i, name in enumerate(("a", "b", "c", "d")):
        waiting.asked(name, now=float(i), retry_s=1.0)  # each counts until now + 3
    assert waiting.count(now=3.5) == 3  # "a" fell out at the limit, not by its time
    waiting.asked("b", now=4.0, retry_s=1.0)  # asking again renews it
    waiting.seated("c")
    assert waiting.count(now=6.5) == 1 and waiting.count(now=7.0) == 0


def test_a_run_whose_close_keeps_failing_stops_no_other_runs_ticks(tmp_path):
    """Run 0's state dir cannot be written (every commit raises): the sweep's tick still closes run 1's round at its
    deadline and evicts its silent worker at its lease, and raises run 0's error for the health record. Before, the
    first run's error ended the tick, so run 1 waited for its dead worker for good."""
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from tests.helpers.coordinator import deltas_of, push

    now = [1000.0]
    spec = tiny_spec(sweep={"seq_lens": [16, 32]}, run={"rounds": 5},
                     sync={"codec": "fp32", "round_deadline_s": 1.0, "max_update_norm": 100.0},
                     coordinator={"lease_s": 5.0, "max_wait_s": 0.5})
    group = SweepCoordinator(spec, tmp_path, lambda: now[0])
    try:
        broken, healthy = group.runs
        members = [group.join(pb.JoinRequest(worker_name=name, device="cpu", pid=1)) for name in "abcd"]
        owned = {run: [m for m in members if run.knows(m.worker_id)] for run in group.runs}
        for run, mine in owned.items():
            for member in mine:
                for _ in run.pull(pb.PullParametersRequest(worker_id=member.worker_id, worker_secret=member.worker_secret)):
                    pass

        def eio(*args, **kwargs):
            raise OSError(5, "Input/output error")

        broken.store.commit_version = eio
        for run, mine in owned.items():
            push(run, mine[0], deltas_of(run, 1e-3), 100)  # one report each; the other worker still trains
        now[0] += 2.0  # both rounds past their deadline
        with pytest.raises(OSError, match="Input/output error"):
            group.tick()
        assert (broken.version, healthy.version) == (0, 1)
        now[0] += 10.0  # every lease expired
        with pytest.raises(OSError):
            group.tick()
        assert healthy.active_workers() == 0
    finally:
        group.close()


def test_a_push_to_a_run_stopped_while_its_round_was_open_moves_its_worker(tmp_path):
    """It was answered `accepted` and never applied: a stopped run's open round never closes. Refused stale, the
    worker pulled, trained and pushed again in a loop (2,016 pushes in 40 s in the wide suite's prune test) and never
    joined the run it should move to: it is told to join again (NOT_FOUND), moved, and its next join lands there."""
    from rcswarm.coordinator.records import Refusal
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from rcswarm.sync import tensor_stream
    from tests.helpers.coordinator import creds, deltas_of

    sweep = SweepCoordinator(tiny_spec(sweep={"seq_lens": [8, 16]}, run={"rounds": 5},
                                       sync={"codec": "fp32", "max_update_norm": 100.0}), tmp_path)
    member = sweep.join(pb.JoinRequest(worker_name="a"))
    run = sweep.runs[0]
    for _ in run.pull(pb.PullParametersRequest(**creds(member))):
        pass
    run.stop("pruned: at 25% of the budget (test)")
    header, chunks = tensor_stream.build_payload(deltas_of(run, 1e-3), codec=run.wire_format, run_id=run.run_id, version=0)
    with pytest.raises(Refusal, match=r"its run was stopped \(pruned: at 25% of the budget \(test\)\); join again") as refused:
        sweep.push(iter([pb.PushUpdateRequest(meta=pb.UpdateMeta(**creds(member), base_version=0, tokens=40)),
                         pb.PushUpdateRequest(header=header), *(pb.PushUpdateRequest(chunk=c) for c in chunks)]))
    assert refused.value.code == grpc.StatusCode.NOT_FOUND and len(run.round.reports) == 0
    assert run.membership_state(member.worker_id) == pb.WORKER_STATE_REASSIGNED
    again = sweep.join(pb.JoinRequest(worker_name="a", run_id=member.run_id, **previous(member)))
    assert again.run_id == sweep.runs[1].run_id
    sweep.close()


def test_a_push_with_a_wrong_secret_to_a_stopped_run_moves_no_one(tmp_path):
    from rcswarm.coordinator.records import Refusal
    from rcswarm.protos.v1 import coordinator_pb2 as pb

    sweep = SweepCoordinator(tiny_spec(sweep={"seq_lens": [8, 16]}, run={"rounds": 5},
                                       sync={"codec": "fp32", "max_update_norm": 100.0}), tmp_path)
    member = sweep.join(pb.JoinRequest(worker_name="a"))
    run = sweep.runs[0]
    run.stop("pruned (test)")
    with pytest.raises(Refusal) as refused:
        sweep.push(iter([pb.PushUpdateRequest(meta=pb.UpdateMeta(worker_id=member.worker_id, worker_secret=b"x" * 32,
                                                                 base_version=0, tokens=40))]))
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert run.membership_state(member.worker_id) == pb.WORKER_STATE_ACTIVE
    sweep.close()


def _full_of_one_held_place(tmp_path, **coordinator: Any) -> tuple[SweepCoordinator, Any]:
    """A sweep of two runs of two places each (and `coordinator`'s other keys): L8 with one active worker and the
    place of "a", which delivered an update to the open round and left (a's JoinResponse is returned), L16 with one
    active worker."""
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from tests.helpers.coordinator import creds, deltas_of, pull_all, push

    sweep = SweepCoordinator(tiny_spec(sweep={"seq_lens": [8, 16]}, run={"rounds": 5},
                                       coordinator={"max_workers": 2, **coordinator},
                                       sync={"codec": "fp32", "max_update_norm": 100.0, "min_reports": 2}), tmp_path)
    first, _, third = (sweep.join(pb.JoinRequest(worker_name=name)) for name in ("a", "b", "c"))
    run = sweep.runs[0]
    assert run.knows(first.worker_id) and run.knows(third.worker_id)
    pull_all(run, first)
    push(run, first, deltas_of(run, 1e-3), 40, 0)
    sweep.leave(pb.LeaveRequest(**creds(first), reason="done"))
    assert run.load(())[:2] == (1, 2)  # (active workers, places taken)
    return sweep, first


def test_a_run_whose_places_ended_updates_hold_is_full_for_the_sweeps_joins(tmp_path):
    """A membership that ended with an update in its run's open round holds its place until the round closes
    (`decide_place`); the sweep counted only active workers, so a join went to that run and was refused while the
    other run had room."""
    from rcswarm.protos.v1 import coordinator_pb2 as pb

    sweep, _ = _full_of_one_held_place(tmp_path)
    try:
        joined = sweep.join(pb.JoinRequest(worker_name="d"))  # before: sent to L8 and refused RESOURCE_EXHAUSTED
        assert sweep.runs[1].knows(joined.worker_id)
    finally:
        sweep.close()


def test_a_re_join_naming_its_ended_membership_takes_its_held_place_back_in_a_full_sweep(tmp_path):
    """The place an ended membership's update holds is its re-join's own (`decide_place`'s `taking_over`); the sweep
    counted it against the re-join too, so with every run full the owner was refused RESOURCE_EXHAUSTED until the
    round closed, and with room elsewhere it was sent away from the run it trained for. A join naming it without its
    secret takes nothing over and is still refused."""
    from rcswarm.coordinator.records import Refusal
    from rcswarm.protos.v1 import coordinator_pb2 as pb

    sweep, first = _full_of_one_held_place(tmp_path)
    try:
        l8, l16 = sweep.runs
        assert l16.knows(sweep.join(pb.JoinRequest(worker_name="d")).worker_id)  # L16 full too
        with pytest.raises(Refusal) as refused:
            sweep.join(pb.JoinRequest(worker_name="x", run_id=l8.run_id, previous_worker_id=first.worker_id,
                                      previous_worker_secret=b"x" * 32))
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        again = sweep.join(pb.JoinRequest(worker_name="a", run_id=l8.run_id, **previous(first)))
        assert l8.knows(again.worker_id), "before: refused RESOURCE_EXHAUSTED, every unfinished run full"
        assert l8.load(())[:2] == (2, 2)  # the held place is the re-join's: no third place taken
    finally:
        sweep.close()


def test_a_re_join_whose_ended_membership_was_forgotten_is_not_sent_to_its_full_run(tmp_path):
    """A review (2026-11-29): once the run forgot the ended membership (`coordinator.forget_after_s`) while its update
    still held a place, the run no longer let the re-join take it over, but the sweep still discounted it: the
    re-join was sent to its full run and refused there, while the other run had room."""
    import time

    from rcswarm.protos.v1 import coordinator_pb2 as pb

    sweep, first = _full_of_one_held_place(tmp_path, forget_after_s=0.2)
    try:
        time.sleep(0.3)
        sweep.tick()
        l8, l16 = sweep.runs
        assert not l8.knows(first.worker_id) and l8.load(())[:2] == (1, 2)  # forgotten, its place still held
        again = sweep.join(pb.JoinRequest(worker_name="a", run_id=l8.run_id, **previous(first)))
        assert l16.knows(again.worker_id), "before: sent to L8 and refused RESOURCE_EXHAUSTED"
    finally:
        sweep.close()


def test_a_re_join_naming_its_ended_membership_goes_back_to_its_run_with_room_elsewhere(tmp_path):
    """With room in another run, the owner of the held place went there (L8 counted full by its own place)."""
    from rcswarm.protos.v1 import coordinator_pb2 as pb

    sweep, first = _full_of_one_held_place(tmp_path)
    try:
        again = sweep.join(pb.JoinRequest(worker_name="a", run_id=sweep.runs[0].run_id, **previous(first)))
        assert sweep.runs[0].knows(again.worker_id), "before: assigned to L16"
    finally:
        sweep.close()


def test_a_worker_is_placed_in_no_run_it_refused_and_moved_toward_none(tmp_path):
    """A worker that cannot train one length of a sweep (its memory holds the shorter ones) names the runs it refused
    at its next join: before, it ended, and a sweep over L up to 100,000 lost every worker it could have used."""
    from rcswarm.coordinator.records import Refusal
    from rcswarm.protos.v1 import coordinator_pb2 as pb

    sweep = _sweep(tmp_path, lease_s=60.0)
    try:
        first, second = sweep.runs
        busy = [sweep.join(pb.JoinRequest(worker_name=name)) for name in ("a", "b", "c")]
        assert sum(first.knows(m.worker_id) for m in busy) == 2  # L8 holds 2, L16 holds 1
        # The emptiest run is L16; a worker that refused it goes to L8.
        placed = sweep.join(pb.JoinRequest(worker_name="small", refused_run_ids=[second.run_id]))
        assert first.knows(placed.worker_id)
        # L8 now has 3 workers to L16's 1: a rebalancing move would send it toward L16, which it refused.
        sweep._maybe_move(placed.worker_id, 0)
        assert first.membership_state(placed.worker_id) == pb.WORKER_STATE_ACTIVE
        sweep._maybe_move(busy[0].worker_id, 0)  # another worker of L8 is moved as before
        assert first.membership_state(busy[0].worker_id) == pb.WORKER_STATE_REASSIGNED
        with pytest.raises(Refusal) as nowhere:
            sweep.join(pb.JoinRequest(worker_name="tiny", refused_run_ids=[first.run_id, second.run_id]))
        assert nowhere.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "this worker refused test-L8, test-L16, and the sweep has no other unfinished run" in nowhere.value.message
        # An unknown run id (a run of another coordinator) excludes nothing.
        assert sweep.join(pb.JoinRequest(worker_name="d", refused_run_ids=["elsewhere"])).worker_id
    finally:
        sweep.close()


def test_a_join_naming_too_many_or_too_long_refused_runs_is_refused_naming_the_field(tmp_path):
    """Names past the 64th were dropped unsaid (one more name placed the worker where it had refused to go), and a
    name of any length was read (review of the sweep's wire, 2026-11-29)."""
    from rcswarm.config.runspec import MAX_RUN_ID_CHARS
    from rcswarm.coordinator.records import Refusal
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from rcswarm.protos.wire import MAX_REFUSED_RUNS

    sweep = _sweep(tmp_path, lease_s=60.0)
    try:
        second = sweep.runs[1]
        for named, message in (
            ([f"junk-{i}" for i in range(MAX_REFUSED_RUNS)] + [second.run_id],
             f"refused_run_ids names {MAX_REFUSED_RUNS + 1} runs: expected at most {MAX_REFUSED_RUNS}"),
            (["x" * (MAX_RUN_ID_CHARS + 1)],
             f"refused_run_ids[0] has {MAX_RUN_ID_CHARS + 1} characters: expected a run id of at most {MAX_RUN_ID_CHARS}"),
        ):
            with pytest.raises(Refusal) as refused:
                sweep.join(pb.JoinRequest(worker_name="w", refused_run_ids=named))
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and message in refused.value.message
        assert not any(run.active_workers() for run in sweep.runs)
        # 64 names, the run's among them, still keep it out.
        placed = sweep.join(pb.JoinRequest(worker_name="w", refused_run_ids=[
            *(f"junk-{i}" for i in range(MAX_REFUSED_RUNS - 1)), second.run_id]))
        assert not second.knows(placed.worker_id)
    finally:
        sweep.close()


def test_run_names_are_bounded_so_that_run_ids_are():
    from rcswarm.config.runspec import MAX_RUN_ID_CHARS, MAX_RUN_NAME_CHARS, RunSpec

    with pytest.raises(ValueError, match=f"run.name = 'aaa.*' is invalid: expected at most {MAX_RUN_NAME_CHARS} characters"):
        tiny_spec(run={"name": "a" * (MAX_RUN_NAME_CHARS + 1)})
    with pytest.raises(ValueError, match=r"with the sweep's suffix: its run 'a+-L1024' has 131"):
        RunSpec.from_dict({"run": {"name": "a" * 125}, "sweep": {"seq_lens": [8, 1024]}})
    longest = tiny_spec(run={"name": "a" * (MAX_RUN_NAME_CHARS - 4)}, sweep={"seq_lens": [8, 16]})
    assert max(len(run.run.name) for run in longest.sweep_runs()) + 9 <= MAX_RUN_ID_CHARS


def test_a_worker_of_a_finished_run_that_refused_every_other_one_has_its_membership_ended(tmp_path):
    """Its heartbeats heard "join again" (NOT_FOUND, moved) while the membership stayed active, each renewing its
    lease; now the membership ends there and its join hears why (review of the sweep's wire, 2026-11-29)."""
    from rcswarm.coordinator.records import Refusal
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from tests.helpers.coordinator import creds

    sweep = _sweep(tmp_path, lease_s=60.0)
    try:
        first, second = sweep.runs
        member = sweep.join(pb.JoinRequest(worker_name="w", refused_run_ids=[second.run_id]))
        assert first.knows(member.worker_id)
        first.stop("pruned: a test")
        with pytest.raises(Refusal) as moved:
            sweep.heartbeat(pb.HeartbeatRequest(**creds(member)))
        assert moved.value.code == grpc.StatusCode.NOT_FOUND and moved.value.moved
        assert first.membership_state(member.worker_id) == pb.WORKER_STATE_REASSIGNED
        with pytest.raises(Refusal) as nowhere:
            sweep.join(pb.JoinRequest(worker_name="w", **previous(member),
                                      refused_run_ids=[second.run_id]))
        assert nowhere.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "this worker refused test-L16, and the sweep has no other unfinished run" in nowhere.value.message
    finally:
        sweep.close()


def test_a_single_run_refuses_the_join_of_a_worker_that_refused_it(tmp_path):
    from rcswarm.coordinator.records import Refusal
    from rcswarm.coordinator.sweep import open_group
    from rcswarm.protos.v1 import coordinator_pb2 as pb

    group = open_group(tiny_spec(), tmp_path)
    try:
        with pytest.raises(Refusal) as refused:
            group.join(pb.JoinRequest(worker_name="a", refused_run_ids=[group.runs[0].run_id]))
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert f"this worker refused run {group.runs[0].run_id}, the only one here" in refused.value.message
        assert group.runs[0].active_workers() == 0
    finally:
        group.close()


def test_the_status_and_the_dashboard_say_which_runs_workers_refused_and_why(tmp_path):
    """A length no worker can train waited for ever and nothing said so: every new worker went there first (it had
    the fewest workers), refused it and left (review of the sweep's wire, 2026-11-29). Each run now counts the
    workers that left refusing it, with the newest reason, in GetStatus, `rcswarm status` and the dashboard."""
    from rich.console import Console

    from rcswarm.cli import status as status_cli
    from rcswarm.coordinator.server import RunningCoordinator
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from rcswarm.protos.wire import MAX_REFUSALS
    from tests.helpers.coordinator import creds
    from tests.helpers.dashboard import get
    from tests.helpers.specs import TOKEN

    sweep = _sweep(tmp_path, lease_s=60.0)
    running = None
    try:
        short, long = sweep.runs
        for name in ("a", "b", "a"):  # "a" refuses twice: one worker
            member = sweep.join(pb.JoinRequest(worker_name=name, refused_run_ids=[short.run_id]))
            assert long.knows(member.worker_id)
            sweep.leave(pb.LeaveRequest(**creds(member), reason=f"refused: out of memory on cuda ({name})"))
        other = sweep.join(pb.JoinRequest(worker_name="c"))
        sweep.leave(pb.LeaveRequest(**creds(other), reason="stopped"))  # not a refusal
        status = sweep.status()
        by_run = {r.run_id: (r.refused_by, r.last_refusal) for r in status.runs}
        assert by_run == {short.run_id: (0, ""), long.run_id: (2, "out of memory on cuda (a)")}
        console = Console(width=220, record=True)
        status_cli.report(status, console)
        assert "L=16: refused by 2 workers, the last: out of memory on cuda (a)" \
            in console.export_text()
        running = RunningCoordinator(sweep, TOKEN, http_port=0).start()
        page = get(running.dashboard.url)[2].decode()
        assert "refused by" in page and 'title="out of memory on cuda (a)">2</td>' in page
        with long._lock:
            for index in range(MAX_REFUSALS + 5):  # the newest MAX_REFUSALS are kept
                long._note_refusal(f"w{index}", "why")
        assert long.summary().refused_by == MAX_REFUSALS
    finally:
        if running is not None:
            running.stop(grace=0.5)
        else:
            sweep.close()
    restarted = _sweep(tmp_path, lease_s=60.0)  # a restarted coordinator counts them still
    try:
        summary = restarted.runs[1].summary()
        assert (summary.refused_by, summary.last_refusal) == (MAX_REFUSALS, "why")
        assert list(restarted.runs[1].refusals)[-1] == f"w{MAX_REFUSALS + 4}"
    finally:
        restarted.close()


def test_stored_refusals_skip_what_is_not_a_refusal():
    from rcswarm.coordinator.service import stored_refusals

    assert stored_refusals(None) == {} and stored_refusals("not json") == {} and stored_refusals('{"a": 1}') == {}
    assert stored_refusals('[["a", 1.5, "why"], ["b", "x", "why"], [1, 2, "z"], ["c", 2, "later"]]') == {
        "a": (1.5, "why"), "c": (2.0, "later")}


def test_a_join_in_flight_holds_its_place_against_a_client_naming_its_reservation(tmp_path):
    """A join placed but still writing holds its run's place. Its key in `_arriving` was the string "joining N",
    which a second join could send as its previous_worker_id to drop that place (a review, 2026-11-29): the two joins
    then went to the same run of an empty sweep. The place is now a `Reservation` in `_placing`, which no name a
    client sends can reach."""
    import threading

    from rcswarm.protos.v1 import coordinator_pb2 as pb

    sweep = _sweep(tmp_path)
    first = sweep.runs[0]
    writing, release = threading.Event(), threading.Event()
    record_join = first.store.record_join

    def slow_record_join(*args, **kwargs):
        writing.set()
        release.wait(10.0)
        return record_join(*args, **kwargs)

    first.store.record_join = slow_record_join
    placed: list[pb.JoinResponse] = []
    joiner = threading.Thread(target=lambda: placed.append(sweep.join(pb.JoinRequest(worker_name="a"))))
    joiner.start()
    try:
        assert writing.wait(10.0), "the first join never reached its write"
        second = sweep.join(pb.JoinRequest(worker_name="b", previous_worker_id="joining 0"))
    finally:
        release.set()
        joiner.join(10.0)
    assert placed and placed[0].run_id == first.run_id
    assert second.run_id == sweep.runs[1].run_id  # the first join's place still counted
    sweep.close()
