"""A peer with nobody to average with ends its averaging step soon after its window, not at its step timeout.

Alone (a first peer waiting for others, the last one of a run), a peer used to look for a group until its step
timeout every round: the window, twice the matchmaking time, 3 × its training time and the all-reduce timeout (60 s
before one is measured). `HivemindPeer.average(alone=...)` asks once, when no group has begun by the end of the window
plus the request timeout, and the worker's `_alone` answers from the DHT: no other averager of the run declares its
state and no other peer's digest is within one version of this one. Real hivemind peers on loopback.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from rcswarm.config.runspec import HivemindSection
from tests.helpers.specs import hivemind_spec
from tests.helpers.waiting import wait_for

hs = pytest.importorskip("rcswarm.worker.hivemind_sync")
from rcswarm.worker.hivemind_worker import HivemindWorker  # noqa: E402

SHAPES = [(16, 8), (32,)]
WINDOW_S = 2.0
STATE = ({"run": "hm", "version": 0}, [])


def _deltas() -> list[torch.Tensor]:
    return [torch.ones(shape) for shape in SHAPES]


def _peer(seed: Any, rules: HivemindSection = HivemindSection()) -> Any:
    return hs.HivemindPeer("hm", SHAPES, "int8", 64, hs.HivemindOptions.loopback(hs.visible_maddrs(seed)),
                           lambda: STATE, rules=rules)


@pytest.mark.slow
def test_a_lone_peer_ends_its_step_after_its_window_and_one_that_is_not_alone_looks_on(no_new_p2pd: None) -> None:
    # A short all-reduce timeout, so that the step that looks on ends within the test: its step timeout
    # (window + twice the matchmaking time + the all-reduce timeout) is still well past the lone step's end.
    rules = HivemindSection(initial_allreduce_s=12.0, min_allreduce_s=12.0)
    seed = hs.start_dht(hs.HivemindOptions.loopback())
    asked: list[float] = []
    try:
        peer = _peer(seed, rules)
        try:
            ends_at = WINDOW_S + peer.timer.step_timeout()
            for answer in (True, False):
                started = time.monotonic()

                def alone(answer: bool = answer) -> bool:
                    asked.append(time.monotonic() - started)
                    return answer

                result = peer.average(_deltas(), 100, {"version": 0}, window_s=WINDOW_S, alone=alone)
                assert result is None
                seconds = time.monotonic() - started
                assert asked, "the step never asked whether its peer is alone"
                if answer:
                    lone_s = seconds
                    assert WINDOW_S + peer.request_timeout_s <= asked[0] < WINDOW_S + peer.request_timeout_s + 1.0
                    assert seconds < WINDOW_S + peer.request_timeout_s + 3.0, f"the lone step took {seconds:.1f}s"
                else:
                    assert seconds >= ends_at - 1.0, f"a peer told it is not alone gave up after {seconds:.1f}s"
            assert len(asked) == 2
            assert ends_at - lone_s > 10.0  # what a lone round saves here (60 s more under the default rules)
        finally:
            peer.shutdown()
    finally:
        seed.shutdown()


@pytest.mark.slow
def test_a_peer_is_alone_until_another_averager_declares_or_another_digest_is_recent(no_new_p2pd: None) -> None:
    seed = hs.start_dht(hs.HivemindOptions.loopback())
    peers: list[Any] = []
    others: list[Any] = []
    try:
        peers.append(_peer(seed))
        worker = object.__new__(HivemindWorker)  # only what `_alone` reads: its peer, spec, version and stop
        worker.peer, worker.spec, worker.version, worker.stop = peers[0], hivemind_spec(), 3, threading.Event()
        params = {"w": torch.zeros(4)}
        started = time.monotonic()
        assert worker._alone()
        assert time.monotonic() - started >= worker.spec.hivemind.state_declare_s  # read across a renewal
        # Other peers' digests, each signed by its own node (`store_record`): two versions back (a peer that left)
        # or far ahead (one that finished the run): still alone.
        others = [hs.start_dht(hs.HivemindOptions.loopback(hs.visible_maddrs(seed))) for _ in range(3)]
        for dht, version in zip(others, (1, 8)):
            assert hs.store_record(dht, dht.record_subkey, hs.DIGEST_KEY, hs.digest_record("hm", version, params), 60.0)
        assert worker._alone()
        # One of the version before (a client-mode peer still training its round to this one): not alone.
        client = others[2]
        assert hs.store_record(client, client.record_subkey, hs.DIGEST_KEY, hs.digest_record("hm", 2, params), 60.0)
        assert not worker._alone()
        # Another run's digest does not count; another averager of this run does (its declaration).
        other = object.__new__(HivemindWorker)
        other.peer, other.spec, other.version, other.stop = peers[0], hivemind_spec(run={"name": "other"}), 3, worker.stop
        assert other._alone()
        peers.append(_peer(seed))
        wait_for(lambda: peers[0].declared_versions(), 20.0, "the second averager's declaration")
        worker.version = 10  # past every digest: the declaration alone says it is not alone
        assert not worker._alone()
    finally:
        for peer in peers:
            peer.shutdown()
        for dht in others:
            dht.shutdown()
        seed.shutdown()


def test_a_stopped_peer_cancels_its_averaging_step_at_once(no_new_p2pd: None) -> None:
    """A worker SIGTERMed while it looked for a group (another averager of the run declared, so it was not alone) ran
    its step to the step timeout, ~60 s, before it could exit (review of the hivemind worker loop, 2026-11-28). Given
    the worker's stop event, `average` cancels the step within a poll once it is set."""
    seed = hs.start_dht(hs.HivemindOptions.loopback())
    try:
        peer = _peer(seed)
        try:
            stop = threading.Event()
            threading.Timer(1.0, stop.set).start()
            started = time.monotonic()
            result = peer.average(_deltas(), 100, {"version": 0}, window_s=WINDOW_S, alone=lambda: False, stop=stop)
            seconds = time.monotonic() - started
            assert result is None and seconds < 3.0, f"the step went on {seconds:.1f}s (step timeout " \
                                                     f"{WINDOW_S + peer.timer.step_timeout():.0f}s)"
        finally:
            peer.shutdown()
    finally:
        seed.shutdown()
