"""A full pull counts itself in the store after its last chunk (the run summary's traffic, observe/traffic.py): on a
full disk that write failed with StoreError and every full pull failed after the worker had read all of θ (review,
finding 3). The write is best effort: the pull is served, one WARNING per failing spell, the count kept in memory
and written by the next full pull that can."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.observe import traffic
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.errors import StoreError
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import creds
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state


class FullDiskStore(StateStore):
    """A real store whose run_state writes fail as on a full disk while `full` is set."""

    full = False

    def set_many(self, values: Mapping[str, str]) -> None:
        if self.full:
            raise StoreError(f"{self.db_path}: cannot write it: database or disk is full", full=True)
        super().set_many(values)


def test_full_pulls_are_served_on_a_full_disk_and_counted_once_it_frees(
    tmp_path, caplog: pytest.LogCaptureFixture,
) -> None:
    store = FullDiskStore(tmp_path, durable=False)
    coordinator = SwarmCoordinator(tiny_spec(), store)
    try:
        member = coordinator.join(pb.JoinRequest(worker_name="a"))
        list(coordinator.pull(pb.PullParametersRequest(**creds(member))))  # the run's first pull: counted
        store.full = True
        with caplog.at_level(logging.WARNING, logger="rcswarm.coordinator"):
            for _ in range(3):
                messages = list(coordinator.pull(pb.PullParametersRequest(**creds(member))))
                assert messages[0].HasField("header") and len(messages) > 1
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "pulls' counts" in r.getMessage()]
        assert len(warnings) == 1 and "disk is full" in warnings[0].getMessage(), [r.getMessage() for r in warnings]
        assert coordinator.traffic.full_pulls == 4
        store.full = False
        list(coordinator.pull(pb.PullParametersRequest(**creds(member))))
    finally:
        coordinator.close()
    stored = traffic.full_pulls(read_state(tmp_path, lambda s: s.get(traffic.FULL_PULLS_KEY)))
    assert stored[1] == 5 and stored[0] > 0


def test_step_pulls_are_counted_in_the_store_and_a_restart_goes_on_from_the_count(tmp_path) -> None:
    # The run summary's downlink divides the step pulls' bytes by their count (observe/traffic.py STEP_PULLS_KEY):
    # before, nothing stored the count and the summary divided by the updates applied (a short run's downlink read
    # smaller than any pull). A restart loads it, as the full pulls' count.
    from rcswarm.state.store import StateStore as Store
    from tests.helpers.coordinator import deltas_of, pull_all, push

    coordinator = SwarmCoordinator(tiny_spec(sync={"codec": "int8"}), Store(tmp_path, durable=False))
    try:
        member = coordinator.join(pb.JoinRequest(worker_name="a"))
        pull_all(coordinator, member)  # a full pull
        for _ in range(2):
            held = coordinator.version
            push(coordinator, member, deltas_of(coordinator, 0.01), tokens=8)
            list(coordinator.pull(pb.PullParametersRequest(**creds(member), have_version=held)))  # the round's step
        coordinator.flush()
        assert (coordinator.traffic.pulls, coordinator.traffic.full_pulls) == (2, 1)
        served = coordinator.traffic.down_bytes
    finally:
        coordinator.close()
    assert traffic.step_pulls(read_state(tmp_path, lambda s: s.get(traffic.STEP_PULLS_KEY))) == (served, 2)
    restarted = SwarmCoordinator(tiny_spec(sync={"codec": "int8"}), Store(tmp_path, durable=False))
    try:
        assert (restarted.traffic.down_bytes, restarted.traffic.pulls, restarted.traffic.full_pulls) == (served, 2, 1)
    finally:
        restarted.close()
