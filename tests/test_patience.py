"""A worker's patience counts since the coordinator last answered, not per call (issue 13).

A real coordinator on loopback with `coordinator.max_workers = 1`: a second Join is answered
RESOURCE_EXHAUSTED, a transient status the client retries, while the member's heartbeats on the
same client are answered.
"""

from __future__ import annotations

import threading
import time

import pytest

from rcswarm.worker import CoordinatorClient, RetriesExhausted, RetryPolicy, Timeouts
from tests.conftest import TOKEN, tiny_spec

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
