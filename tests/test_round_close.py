"""The round close never blocks membership (issue 13, finding 3), on a real coordinator over loopback.

A store whose commit of a round's version sleeps makes the close take seconds. While it runs,
heartbeats, GetStatus and joins are answered at once, a push for the closing version is stale,
and a pull waits for the new version; then the version is published atomically and waiters wake.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore
from tests.conftest import TOKEN, tiny_spec
from tests.test_bounded_data import Wire

COMMIT_SLEEP_S = 2.0


class SlowCommitStore(StateStore):
    """A real store whose commit of a round's version first sleeps, announcing that the close is under way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.committing = threading.Event()

    def commit_version(self, run_id: str, version: int, params: Mapping[str, torch.Tensor],
                       state: Mapping[str, Mapping[str, torch.Tensor]], round_record: RoundRecord | None,
                       **rows: Any) -> None:
        if round_record is not None:
            self.committing.set()
            time.sleep(COMMIT_SLEEP_S)
        super().commit_version(run_id, version, params, state, round_record, **rows)


@pytest.fixture
def slow_close(tmp_path: Path) -> Iterator[tuple[RunningCoordinator, SlowCommitStore, Wire]]:
    """A coordinator (round deadline 1 s) on loopback over a SlowCommitStore, and a Wire to it."""
    # sync.max_staleness = 0: a push for the closing round is refused at once (with late updates merged it
    # would wait for the close and arrive late, tests/test_hetero.py).
    spec = tiny_spec(sync={"round_deadline_s": 1.0, "max_staleness": 0}, coordinator={"lease_s": 30.0, "max_wait_s": 10.0, "durable": False})
    store = SlowCommitStore(tmp_path / "state", durable=False)
    running = RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start()
    wire = Wire(f"127.0.0.1:{running.port}")
    try:
        yield running, store, wire
    finally:
        wire.close()
        running.stop(grace=0.5)


def timed(call: Any) -> tuple[float, Any]:
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def refused_push(wire: Wire, worker_id: str, header: pb.TensorHeader) -> grpc.RpcError:
    """The error of a zero update that must be refused."""
    with pytest.raises(grpc.RpcError) as info:
        wire.push_zero(worker_id, header)
    return info.value


def test_membership_and_status_are_answered_while_a_round_closes(slow_close: Any) -> None:
    running, store, wire = slow_close
    first, late = wire.join("first"), wire.join("late")
    header = wire.pull(first)
    wire.pull(late)
    assert wire.push_zero(first, header).reports == 1
    # `late` never reports: the ticker closes the round at its 1 s deadline and sleeps in the commit.
    assert store.committing.wait(timeout=15), "the round did not start closing"
    closing_since = time.perf_counter()
    latencies, versions = [], []
    joined = ""
    while time.perf_counter() - closing_since < COMMIT_SLEEP_S / 2:
        seconds, beat = timed(lambda: wire.call("Heartbeat", pb.HeartbeatRequest(**wire.creds(first)), timeout=5.0))
        latencies.append(seconds)
        versions.append(beat.version)
        seconds, status = timed(lambda: wire.call("GetStatus", pb.GetStatusRequest(), timeout=5.0))
        latencies.append(seconds)
        versions.append(status.version)
        if not joined:
            seconds, joined = timed(lambda: wire.join("newcomer"))
            latencies.append(seconds)
    assert max(latencies) < 0.25 and statistics.median(latencies) < 0.1, latencies
    assert len(latencies) >= 10 and versions == [0] * len(versions)
    seconds, refusal = timed(lambda: refused_push(wire, late, header))
    assert refusal.code() == grpc.StatusCode.FAILED_PRECONDITION and "round 0 is closing" in refusal.details()
    during = time.perf_counter() - closing_since
    assert seconds < 0.25 and during < COMMIT_SLEEP_S, f"the calls took {during:.2f}s: they waited for the close"
    # A pull during the close waits for the new version; the waiters wake when it is published.
    seconds, pulled = timed(lambda: wire.pull(joined))
    assert pulled.version == 1 and seconds < COMMIT_SLEEP_S + 5
    awaited = wire.call("AwaitVersion", pb.AwaitVersionRequest(**wire.creds(first), min_version=1, wait_ms=5000))
    assert awaited.version == 1
    status = wire.call("GetStatus", pb.GetStatusRequest())
    closed = [r for r in status.rounds if r.version == 0]
    assert closed and "deadline" in closed[0].close_reason and closed[0].reports == 1
    assert status.param_sha256 == pulled.content_sha256.hex()
    assert set(running.coordinator.last_close_seconds) >= {"average", "compressed step", "commit"}
    assert running.coordinator.last_close_seconds["commit"] >= COMMIT_SLEEP_S
