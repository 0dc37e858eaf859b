"""A worker's patience counts since the coordinator last answered, not per call (issue 13).

A real coordinator on loopback with `coordinator.max_workers = 1`: a second Join is answered
RESOURCE_EXHAUSTED, a transient status the client retries, while the member's heartbeats on the
same client are answered.
"""

from __future__ import annotations

import threading
import time

import pytest

from rcswarm.worker.client import CoordinatorClient, RetriesExhausted, RetryPolicy, Timeouts
from tests.helpers.specs import TOKEN, tiny_spec

PATIENCE_S = 1.5


def full_swarm(start_coordinator):
    """A coordinator whose one seat is taken, and a client holding that seat."""
    local = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"max_workers": 1, "lease_s": 30.0}))
    client = CoordinatorClient(local.target, TOKEN, retry=RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2,
                                                                      max_elapsed_s=PATIENCE_S),
                               timeouts=Timeouts(unary_s=5.0))
    return client, client.join("seated", "cpu", 1)


def test_a_call_retried_while_other_calls_are_answered_outlasts_the_patience(start_coordinator):
    client, member = full_swarm(start_coordinator)
    stop_beats = threading.Event()

    def beat() -> None:
        while not stop_beats.wait(0.2):
            client.heartbeat(member)

    beats = threading.Thread(target=beat, daemon=True)
    beats.start()
    outcome: list[BaseException] = []
    started = time.monotonic()

    def join() -> None:
        try:
            client.join("second", "cpu", 2)
        except BaseException as exc:  # examined below
            outcome.append(exc)

    joiner = threading.Thread(target=join, daemon=True)
    joiner.start()
    joiner.join(timeout=3 * PATIENCE_S)
    assert joiner.is_alive() and not outcome, f"gave up while the coordinator answered heartbeats: {outcome}"
    stop_beats.set()
    beats.join(timeout=5.0)
    silent_from = time.monotonic()
    joiner.join(timeout=PATIENCE_S + 5.0)
    assert not joiner.is_alive() and len(outcome) == 1 and isinstance(outcome[0], RetriesExhausted)
    waited = time.monotonic() - silent_from
    assert waited < PATIENCE_S + 1.5 and time.monotonic() - started > 3 * PATIENCE_S
    message = str(outcome[0])
    assert "without an answer from the coordinator" in message and "RESOURCE_EXHAUSTED" in message
    client.close()


def test_calls_that_fail_one_after_another_share_one_patience(start_coordinator):
    client, _ = full_swarm(start_coordinator)
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
    import grpc

    from rcswarm.protos.transport import not_grpc_problem, target_problem
    from rcswarm.worker import WorkerOptions
    from rcswarm.worker.client import NotACoordinator

    assert target_problem("127.0.0.1:50051") is None and target_problem("dns:///coordinator:50051") is None
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
