"""Event rows on a full disk (review of the eighteenth session): an eviction's event write that failed raised out of
the ticker's `tick` before it closed the round, so a full disk stopped rounds from closing by deadline and turned
health NOT_SERVING; a join whose event write failed left an active membership behind the error its caller got. Now
an ended membership's or a stall's event is written best effort (one WARNING per failing spell), and a join writes
its event before it changes anything, so a refused join leaves nothing behind."""

from __future__ import annotations

import logging

import pytest

from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.errors import StoreError
from rcswarm.state.store import StateStore
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state


class FullDiskStore(StateStore):
    """A real store whose event writes fail as on a full disk while `full` is set."""

    full = False

    def add_event(self, worker_id: str, kind: str, reason: str, now: float | None = None) -> None:
        if self.full:
            raise StoreError(f"{self.db_path}: cannot write it: database or disk is full", full=True)
        super().add_event(worker_id, kind, reason, now)


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
