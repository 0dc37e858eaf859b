"""Two threads of a real worker at a real coordinator on loopback (concurrency review 2026-12): the heartbeat thread
outlives an unexpected error in one beat (before, any exception other than a gRPC status, RetriesExhausted or
Stopped ended it for good, and the lease lapsed), logging it once per kind; and a stop while an overlapped round's
exchange hangs on the wire ends the worker within seconds (before, `Exchange.wait` did not look at the stop and the
worker waited up to the transfer deadline, 300 s)."""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker import Worker
from rcswarm.worker.worker import End, Exchange
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for
from tests.helpers.worker import _options, run_until


class CountsHeartbeats(SwarmCoordinator):
    """The real coordinator, counting the heartbeats it answered."""

    beats = 0

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        response = super().heartbeat(request)
        type(self).beats += 1
        return response


class BadBeats(Worker):
    """The real worker, whose handling of a heartbeat's answer raises an unexpected error (not a gRPC status) on the
    heartbeat thread at its first two beats: a bug or a malformed answer."""

    def __init__(self, options) -> None:
        super().__init__(options, TOKEN)
        self.faults = 0
        self.beats_at_fault = 0

    def _note_assignment(self, response, worker_id: str) -> None:
        if threading.current_thread().name == "heartbeat" and self.faults < 2:
            self.faults += 1
            self.beats_at_fault = CountsHeartbeats.beats
            raise ValueError(f"a test's malformed answer {self.faults}")
        super()._note_assignment(response, worker_id)


def test_the_heartbeat_thread_outlives_an_unexpected_error_and_logs_it_once(start_coordinator, caplog) -> None:
    spec = tiny_spec(run={"rounds": 10_000}, coordinator={"lease_s": 1.5})  # beats every 0.5 s
    local = start_coordinator(spec, service=CountsHeartbeats)
    worker = BadBeats(_options(local.target))
    with caplog.at_level(logging.WARNING, logger="rcswarm.worker"):
        # Before, the first error ended the thread: no beat came after it.
        code = run_until(worker, lambda w: w.faults == 2 and CountsHeartbeats.beats >= w.beats_at_fault + 3, 30)
    assert code == 0 and worker.end is End.STOPPED
    assert worker._heartbeat is not None and not worker._heartbeat.is_alive()  # ended by the stop, not before
    failed = [r for r in caplog.records if "heartbeat failed unexpectedly" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in failed]  # the second error of the kind: DEBUG
    assert "ValueError: a test's malformed answer 1" in failed[0].getMessage() and failed[0].exc_info
    states = [w.state for w in local.service.status().workers]
    assert states == [pb.WORKER_STATE_LEFT], states  # one membership, never evicted


class HangingPush(SwarmCoordinator):
    """The real coordinator, whose PushUpdate handler hangs (as over a stalled link) until `release` is set."""

    entered = threading.Event()
    release = threading.Event()

    def push(self, requests):
        type(self).entered.set()
        type(self).release.wait(60)
        return super().push(requests)


def in_exchange_wait(thread: threading.Thread) -> bool:
    """Whether `thread` waits for an overlapped round's exchange (`Exchange.wait`)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "wait" and isinstance(frame.f_locals.get("self"), Exchange):
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def hanging_push():
    HangingPush.entered.clear()
    HangingPush.release.clear()
    yield HangingPush
    HangingPush.release.set()


def test_a_stop_while_the_exchange_hangs_ends_the_worker_within_seconds(start_coordinator, hanging_push) -> None:
    spec = tiny_spec(run={"rounds": 5}, sync={"codec": "fp32", "overlap": True})
    local = start_coordinator(spec, service=hanging_push)
    worker = Worker(_options(local.target, rpc_timeout_s=2.0, transfer_timeout_s=120.0), TOKEN)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    try:
        assert hanging_push.entered.wait(60), "the worker never pushed"
        # The next round's early steps trained, the training thread waits for the exchange.
        wait_for(lambda: in_exchange_wait(thread), 30, "the training thread to wait for the exchange")
        taken = worker._inflight is None  # the training thread took the round in flight to wait for it
        stopped_at = time.monotonic()
        worker.stop.set()
        thread.join(timeout=15)
        took = time.monotonic() - stopped_at
        assert not thread.is_alive(), "the stopped worker still waits for its hanging push"
    finally:
        hanging_push.release.set()
        worker.stop.set()
        thread.join(timeout=60)
    assert result == [0] and worker.end is End.STOPPED
    # Its leave waits rpc_timeout_s (2 s) for the exchange, then the Leave (the coordinator cancels the member's calls)
    # or the channel's close ends the hanging push.
    assert took < 10, took
    assert taken
    # Kept as the round in flight by the stopped wait, so that the leave waited for it and `_end_threads` joined it.
    assert worker._inflight is not None and not worker._inflight.exchange.thread.is_alive()
    states = [w.state for w in local.service.status().workers]
    assert states == [pb.WORKER_STATE_LEFT], states
    assert local.service.version == 0  # the hanging update never landed
