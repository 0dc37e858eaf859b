"""A worker's patience counts since the coordinator last answered, not per call (issue 13); a worker refused
for want of a place waits for one, since the coordinator answered.

A real coordinator on loopback, subclassed so that its Join is refused RESOURCE_EXHAUSTED without the place-retry
trailer after the first (as the call guard refuses a busy coordinator), a transient status the client retries,
while the member's heartbeats on the same client are answered. With `coordinator.max_workers = 1` and no
subclass, a second Join is refused for want of a place, with the trailer.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc
import pytest

from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker.client import CoordinatorClient, RetriesExhausted, RetryPolicy, Stopped, Timeouts
from tests.helpers.specs import TOKEN, tiny_spec

PATIENCE_S = 1.5


class BusyJoins(SwarmCoordinator):
    """The real coordinator, whose joins after the first are refused as a busy coordinator's are."""

    def join(self, request, placed="", reservation=None):
        if self._joins >= 1:
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "coordinator busy: 32 membership calls already running")
        return super().join(request, placed, reservation)


def client_of(local, **retry) -> CoordinatorClient:
    policy = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2, max_elapsed_s=PATIENCE_S, **retry)
    return CoordinatorClient(local.target, TOKEN, retry=policy, timeouts=Timeouts(unary_s=5.0))


def beating(client: CoordinatorClient, member, every_s: float):
    """Renew `member`'s lease every `every_s` on a daemon thread; returns the function that stops it."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            client.heartbeat(member)

    beats = threading.Thread(target=beat, daemon=True)
    beats.start()

    def stop_beating() -> None:
        stop.set()
        beats.join(timeout=5.0)

    return stop_beating


def joining(client: CoordinatorClient, name: str, pid: int) -> tuple[threading.Thread, list]:
    """`client.join(name)` on a daemon thread, started; the list gets its response or the exception it raised."""
    outcome: list = []

    def join() -> None:
        try:
            outcome.append(client.join(name, "cpu", pid))
        except BaseException as exc:  # examined by the caller
            outcome.append(exc)

    joiner = threading.Thread(target=join, daemon=True)
    joiner.start()
    return joiner, outcome


def busy_swarm(start_coordinator):
    """A coordinator that refuses every further join as busy, and a client holding its one membership."""
    local = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"lease_s": 30.0}), service=BusyJoins)
    client = client_of(local)
    return client, client.join("seated", "cpu", 1)


def test_a_call_retried_while_other_calls_are_answered_outlasts_the_patience(start_coordinator):
    client, member = busy_swarm(start_coordinator)
    stop_beating = beating(client, member, 0.2)
    started = time.monotonic()
    joiner, outcome = joining(client, "second", 2)
    joiner.join(timeout=3 * PATIENCE_S)
    assert joiner.is_alive() and not outcome, f"gave up while the coordinator answered heartbeats: {outcome}"
    stop_beating()
    silent_from = time.monotonic()
    joiner.join(timeout=PATIENCE_S + 5.0)
    assert not joiner.is_alive() and len(outcome) == 1 and isinstance(outcome[0], RetriesExhausted)
    waited = time.monotonic() - silent_from
    assert waited < PATIENCE_S + 1.5 and time.monotonic() - started > 3 * PATIENCE_S
    message = str(outcome[0])
    assert "without an answer from the coordinator" in message and "RESOURCE_EXHAUSTED" in message
    client.close()


def test_calls_that_fail_one_after_another_share_one_patience(start_coordinator):
    client, _ = busy_swarm(start_coordinator)
    time.sleep(PATIENCE_S + 0.3)  # quiet, not unanswered: nothing was asked
    started = time.monotonic()
    with pytest.raises(RetriesExhausted):
        client.join("second", "cpu", 2)
    first = time.monotonic() - started
    assert PATIENCE_S - 0.3 < first < PATIENCE_S + 1.5
    started = time.monotonic()
    with pytest.raises(RetriesExhausted, match="RESOURCE_EXHAUSTED"):
        client.join("third", "cpu", 3)
    assert time.monotonic() - started < 0.5, "the second call started a patience of its own"
    client.close()


def test_a_url_scheme_or_an_http_server_is_a_permanent_error_not_retried(start_coordinator):
    """Issue #33: `--coordinator http://HOST:PORT` is refused before any channel opens; the coordinator's dashboard
    port given as its gRPC port ends the first call at once (not after the patience), saying what answered."""
    from rcswarm.protos.transport import not_grpc_problem, target_problem
    from rcswarm.worker import WorkerOptions
    from rcswarm.worker.client import NotACoordinator

    assert target_problem("127.0.0.1:50051") is None and target_problem("dns:///coordinator:50051") is None
    assert target_problem("[::1]:50051") is None and target_problem("unix:/run/rcswarm.sock") is None
    # Ports gRPC would dial as some other port (99999 as 34463, -5 as 65531), retried for the whole patience.
    for bad in ("127.0.0.1:99999", "127.0.0.1:-5", "127.0.0.1:abc", "host:"):
        with pytest.raises(ValueError, match=r"expected HOST:PORT with a port in 0\.\.65535"):
            WorkerOptions(coordinator=bad)
    with pytest.raises(ValueError, match=r"--coordinator 'http://10.0.0.5:50051': http:// is a URL scheme, .*"
                                         r"expected HOST:PORT \(e.g. 10.0.0.5:50051\)"):
        WorkerOptions(coordinator="http://10.0.0.5:50051")
    assert not_grpc_problem("h:1", grpc.StatusCode.UNAVAILABLE, "Connection refused") is None
    local = start_coordinator(tiny_spec(run={"rounds": 0}), http_port=0)
    dashboard = f"127.0.0.1:{local.running.dashboard.port}"
    client = CoordinatorClient(dashboard, TOKEN, retry=RetryPolicy(max_elapsed_s=300.0), timeouts=Timeouts(unary_s=5.0))
    started = time.monotonic()
    with pytest.raises(NotACoordinator) as refused:
        client.join("lost", "cpu", 1)
    client.close()
    assert time.monotonic() - started < 10
    assert str(refused.value) == (
        f"Join: {dashboard} answered, but not as a gRPC server (its first bytes are not HTTP/2): an HTTP server, "
        "such as the coordinator's dashboard (--http-port), is on that port; give the coordinator's gRPC port (--port)")


def test_a_spare_waits_for_a_place_past_its_patience_says_so_once_and_joins_when_one_frees(start_coordinator, caplog):
    # lease_s 3: the coordinator asks the spare to come back in 1 s (a third of the lease).
    local = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"max_workers": 1, "lease_s": 3.0}))
    holder = client_of(local)
    seat = holder.join("holder", "cpu", 1)
    with pytest.raises(grpc.RpcError) as refused:
        holder.stub.Join(pb.JoinRequest(worker_name="raw", device="cpu", pid=3), timeout=5.0, metadata=holder.metadata)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_workers=1" in refused.value.details()
    assert ("rcswarm-place-retry-ms", "1000") in refused.value.trailing_metadata()
    stop_beating = beating(holder, seat, 0.3)
    spare = client_of(local)
    with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
        joiner, outcome = joining(spare, "spare", 2)
        joiner.join(timeout=3 * PATIENCE_S)
        assert joiner.is_alive() and not outcome, f"the spare stopped waiting for a place: {outcome}"
        assert holder.status().waiting_for_place == 1
        stop_beating()
        holder.leave(seat, "the test frees the place")
        joiner.join(timeout=10.0)
    assert not joiner.is_alive() and outcome and outcome[0].worker_id, outcome
    assert holder.status().waiting_for_place == 0
    said = [r for r in caplog.records if "waiting for a place" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, [r.getMessage() for r in said]
    assert "the swarm is full: 1 active of max_workers=1" in said[0].getMessage()
    for client in (holder, spare):
        client.close()


def test_a_spare_waiting_for_a_place_stops_when_asked_and_gives_up_when_the_coordinator_goes_silent(
        start_coordinator):
    local = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"max_workers": 1, "lease_s": 30.0}))
    holder = client_of(local)
    holder.join("holder", "cpu", 1)
    stopped_spare = client_of(local)
    joiner, outcome = joining(stopped_spare, "spare", 2)
    time.sleep(0.5)
    started = time.monotonic()
    stopped_spare.stop.set()
    joiner.join(timeout=5.0)
    assert not joiner.is_alive() and isinstance(outcome[0], Stopped) and time.monotonic() - started < 1.0

    # A coordinator that stops answering while a spare waits (asking every 10 s): the patience counts from the
    # last refusal.
    spare = client_of(local)
    joiner, outcome = joining(spare, "spare", 3)
    time.sleep(0.5)
    local.running.stop(grace=0.5)
    joiner.join(timeout=10 + PATIENCE_S + 5.0)
    assert not joiner.is_alive() and isinstance(outcome[0], RetriesExhausted), outcome
    assert "without an answer from the coordinator" in str(outcome[0])
    for client in (holder, stopped_spare, spare):
        client.close()


def test_a_proxys_413_is_a_permanent_error_naming_its_body_limit() -> None:
    """ingress-nginx's default 1 MiB request body limit answered every push 413, which gRPC reports as UNKNOWN and
    a worker retried forever behind answered heartbeats: the run sat at version 0 without a word (review of the
    Helm chart, 2026-11-28). It is given up at once, naming the limit to raise."""
    from rcswarm.protos.transport import not_grpc_problem

    details = "Received http2 header with status: 413"
    problem = not_grpc_problem("coordinator.example:443", grpc.StatusCode.UNKNOWN, details)
    assert problem is not None and "HTTP 413; UNKNOWN" in problem and "proxy-body-size" in problem
    assert not_grpc_problem("h:1", grpc.StatusCode.UNKNOWN, "Received http2 header with status: 502") is None
    assert not_grpc_problem("h:1", grpc.StatusCode.UNKNOWN, "Exception calling application") is None


def test_a_transfer_that_moves_is_no_silence() -> None:
    """A review of the transfer watch: only a call's end reset the silence clock, so a pull or push that took longer
    than the patience after a failed attempt (or behind heartbeats timed out on a slow link) was cancelled while its
    messages still arrived. Each message of a transfer now counts as the coordinator answering."""
    client = CoordinatorClient("127.0.0.1:1", "t" * 32, retry=RetryPolicy(max_elapsed_s=60.0))
    try:
        client._silence()  # a failed call starts the clock
        time.sleep(0.05)
        assert client._silent_for() > 0
        assert list(client._progressing(iter([1, 2]))) == [1, 2]
        assert client._silent_for() == 0.0
    finally:
        client.close()
