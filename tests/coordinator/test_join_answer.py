"""A Join whose answer cannot be built leaves no member behind (a review of finite config values, 2026-11-28: an
assignment's int32 field out of range refused every Join, and each refused Join left an active member holding a
place until its lease ran out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcswarm.coordinator import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.specs import tiny_spec


class UnbuildableAnswer(SwarmCoordinator):
    """The real coordinator, whose first assignment cannot be serialized (a value past int32, as 2**31 steps was)."""

    broken = True

    def _assignment(self, worker):
        assignment = super()._assignment(worker)
        if self.broken:
            assignment.inner_steps = 2**31  # raises ValueError: Value out of range
        return assignment


def test_a_join_whose_answer_fails_leaves_no_member(tmp_path: Path) -> None:
    coordinator = UnbuildableAnswer(tiny_spec(coordinator={"max_workers": 1}), StateStore(tmp_path))
    try:
        for _ in range(3):
            with pytest.raises(ValueError, match="out of range"):
                coordinator.join(pb.JoinRequest(worker_name="w"))
        assert coordinator.active_workers() == 0
        coordinator.broken = False
        assert coordinator.join(pb.JoinRequest(worker_name="w")).worker_id  # the one place is free
    finally:
        coordinator.close()
