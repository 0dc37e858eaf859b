"""Event rows on a full disk (review of the eighteenth session): an eviction's event write that failed raised out of
the ticker's `tick` before it closed the round, so a full disk stopped rounds from closing by deadline and turned
health NOT_SERVING; a join whose event write failed left an active membership behind the error its caller got. Now
an ended membership's or a stall's event is written best effort (one WARNING per failing spell), and a join writes
its event before it changes anything, so a refused join leaves nothing behind. Since the twenty-fifth session a join
stores everything it writes in one transaction after its answer is built (`StateStore.record_join`): before, a
per-worker length's "assign" row or a sweep's placement row written after the join's own left a join row and a count
(or, in a sweep, an active membership) behind a refused join, and a re-join's moved curriculum entry stayed moved in
memory when its save failed."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from rcswarm.coordinator import curriculum as curricula
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.sweep import SweepCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.errors import StoreError
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import previous
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state


class FullDiskStore(StateStore):
    """A real store whose writes fail as on a full disk: every event write while `full` is set, and while `full_for`
    names them, the writes of those event kinds and ("run_state") of run_state values."""

    full = False
    full_for: frozenset[str] = frozenset()

    def _fill(self, kinds) -> None:
        if self.full or self.full_for & set(kinds):
            raise StoreError(f"{self.db_path}: cannot write it: database or disk is full", full=True)

    def add_event(self, worker_id: str, kind: str, reason: str, now: float | None = None) -> None:
        self._fill([kind])
        super().add_event(worker_id, kind, reason, now)

    def set_many(self, values) -> None:
        self._fill(["run_state"])
        super().set_many(values)

    def record_join(self, worker_id, events, now, reported=None, run_state=None, secret_sha256=b"") -> None:
        self._fill([kind for kind, _ in events] + (["run_state"] if run_state else []))
        super().record_join(worker_id, events, now, reported, run_state, secret_sha256)


def test_a_full_disk_neither_stops_evictions_nor_leaves_a_refused_join_behind(
    tmp_path, caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1_700_000_000.0]
    store = FullDiskStore(tmp_path, durable=False)
    coordinator = SwarmCoordinator(tiny_spec(), store, clock=lambda: now[0])
    try:
        for name in ("a", "b"):
            coordinator.join(pb.JoinRequest(worker_name=name))
        store.full = True
        with pytest.raises(StoreError, match="disk is full"):
            coordinator.join(pb.JoinRequest(worker_name="c"))
        assert len(coordinator._active) == 2 and coordinator._joins == 2  # the refused join left nothing
        now[0] += 30.0  # past the 10 s lease of both members
        with caplog.at_level(logging.WARNING, logger="rcswarm.coordinator"):
            coordinator.tick()
            coordinator.tick()
        assert not coordinator._active, "the ticker evicted nobody on a full disk"
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "event" in r.getMessage()]
        assert len(warnings) == 1 and "disk is full" in warnings[0], warnings
        store.full = False
        third = coordinator.join(pb.JoinRequest(worker_name="c"))
        assert third.worker_id.split("-")[0] == "w3"
    finally:
        coordinator.close()
    kinds = read_state(tmp_path, lambda s: [event.kind for event in s.events()])
    assert kinds.count("join") == 3 and "evict" not in kinds, kinds


def test_a_refused_join_under_per_worker_lengths_leaves_no_row_and_no_count(tmp_path) -> None:
    store = FullDiskStore(tmp_path, durable=False)
    coordinator = SwarmCoordinator(tiny_spec(curriculum={"worker_seq_lens": [8, 16]}), store)
    try:
        first = coordinator.join(pb.JoinRequest(worker_name="a"))
        store.full_for = frozenset({"assign"})  # the join's own row would fit; its "assign" row does not
        with pytest.raises(StoreError, match="disk is full"):
            coordinator.join(pb.JoinRequest(worker_name="b"))
        store.full_for = frozenset()
        second = coordinator.join(pb.JoinRequest(worker_name="b"))
        assert (first.assignment.seq_len, second.assignment.seq_len) == (8, 16)
        assert second.worker_id.startswith("w2-") and second.data_seed == 2
        assert sorted(coordinator._active) == sorted([first.worker_id, second.worker_id])
    finally:
        coordinator.close()
    rows = read_state(tmp_path, lambda s: [(event.worker_id, event.kind) for event in s.events()])
    assert rows == [(first.worker_id, "join"), (first.worker_id, "assign"),
                    (second.worker_id, "join"), (second.worker_id, "assign")], rows


def test_a_rejoin_whose_store_write_fails_keeps_the_curriculum_entry_it_would_take_over(tmp_path) -> None:
    ladder = {"policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 0.3, "tau": 100.0, "budget_seconds": 1e6}
    store = FullDiskStore(tmp_path, durable=False)
    coordinator = SwarmCoordinator(tiny_spec(curriculum=ladder), store)
    try:
        first = coordinator.join(pb.JoinRequest(worker_name="a"))
        own = curricula.WorkerCurriculum(rung=1, costs={4: (1.0, 10)}, reason="its own pace")
        coordinator.tracker.state = dataclasses.replace(coordinator.tracker.state, workers={first.worker_id: own})
        coordinator.leave(pb.LeaveRequest(worker_id=first.worker_id, worker_secret=first.worker_secret))
        store.full_for = frozenset({"run_state"})  # the moved entry's save fails
        with pytest.raises(StoreError, match="disk is full"):
            coordinator.join(pb.JoinRequest(worker_name="a", **previous(first)))
        assert coordinator.tracker.state.workers == {first.worker_id: own}  # not moved to a membership that never was
        assert len(coordinator._active) == 0
        store.full_for = frozenset()
        again = coordinator.join(pb.JoinRequest(worker_name="a", **previous(first)))
        assert again.assignment.seq_len == 8  # its own rung, not the run's (4)
        assert coordinator.tracker.state.workers == {again.worker_id: own}
    finally:
        coordinator.close()
    stored = read_state(tmp_path, lambda s: s.get(curricula.CURRICULUM_KEY))
    assert list(curricula.CurriculumState.from_json(stored).workers) == [again.worker_id]  # saved with the join


def test_a_sweep_join_whose_placement_row_fails_leaves_no_membership(tmp_path, monkeypatch) -> None:
    sweep = SweepCoordinator(tiny_spec(sweep={"seq_lens": [4, 8]}, run={"workers": 1}), tmp_path)
    try:
        full = [True]
        record_join, add_event = StateStore.record_join, StateStore.add_event

        def failing(write):
            def write_unless_full(self, worker_id, *args, **kwargs):  # an "assign" row does not fit
                events = args[0] if write is record_join else [(args[0], "")]
                if full[0] and any(kind == "assign" for kind, _ in events):
                    raise StoreError(f"{self.db_path}: cannot write it: database or disk is full", full=True)
                return write(self, worker_id, *args, **kwargs)
            return write_unless_full

        monkeypatch.setattr(StateStore, "record_join", failing(record_join))
        monkeypatch.setattr(StateStore, "add_event", failing(add_event))
        with pytest.raises(StoreError, match="disk is full"):
            sweep.join(pb.JoinRequest(worker_name="a"))
        assert not any(run._active for run in sweep.runs), "a refused join left an active membership in a sweep run"
        full[0] = False
        member = sweep.join(pb.JoinRequest(worker_name="a"))
        placed = [run for run in sweep.runs if run.knows(member.worker_id)]
        assert len(placed) == 1 and sum(len(run._active) for run in sweep.runs) == 1
        kinds = [(event.kind, event.reason) for event in placed[0].store.events()]
        assert [kind for kind, _ in kinds] == ["join", "assign"] and kinds[1][1].startswith("assigned to test-L"), kinds
    finally:
        sweep.close()
