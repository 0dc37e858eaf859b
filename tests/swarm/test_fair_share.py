"""Fair share on the real wire (issue #31, finding 2): one join token's identities holding silent PushUpdate
streams, or one identity flooding long polls, pulls, heartbeats and status calls with day-long deadlines, do not
stop the rounds of two honest `rcswarm worker` processes against a real coordinator process.

Before: the kind limits were global, first come first served, and 20 silent streams held all 16 push slots
(0 rounds in 40 s); a 150-thread flood let 1 round close in 18 s."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import WORKER_ID_METADATA, WORKER_SECRET_METADATA
from rcswarm.worker.client import CoordinatorClient, RetryPolicy
from tests.helpers.coordinator import free_port
from tests.helpers.processes import logs_of, start_coordinator_process
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.state import read_state
from tests.helpers.wire import Wire

FAST = ("--rpc-timeout-s", "2", "--transfer-timeout-s", "5", "--patience-s", "120")
WINDOW_S = 12.0
DAY_S = 86_400


@pytest.fixture
def swarm(tmp_path: Path, spawn_worker, request) -> Iterator[tuple[str, CoordinatorClient, list]]:
    """A coordinator process (room for 32 workers; the round deadline indirect-parametrized, 5 s by default) and
    two honest worker processes that have closed 2 rounds."""
    deadline_s = getattr(request, "param", 5.0)
    spec = tiny_spec(run={"rounds": 0, "workers": 2}, inner={"steps": 3}, sync={"round_deadline_s": deadline_s},
                     coordinator={"lease_s": 10.0, "max_wait_s": 10.0, "max_workers": 32, "stream_idle_s": 4.0})
    config = write_spec(spec, tmp_path / "run.toml")
    port = free_port()
    coordinator = start_coordinator_process(config, tmp_path / "state", port, tmp_path / "coordinator.log")
    target = f"127.0.0.1:{port}"
    client = CoordinatorClient(target, TOKEN, retry=RetryPolicy(max_elapsed_s=30.0))
    workers = [spawn_worker(target, name, *FAST) for name in ("honest-a", "honest-b")]
    try:
        deadline = time.monotonic() + 120
        while client.status().version < 2:
            assert time.monotonic() < deadline, logs_of(workers)
            time.sleep(0.1)
        yield target, client, workers
    finally:
        client.close()
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(timeout=30)


def rounds_during(client: CoordinatorClient, attack: Callable[[threading.Event], None], threads: int) -> int:
    """Rounds the swarm closes in WINDOW_S while `threads` threads run `attack(stop)`."""
    stop = threading.Event()
    running = [threading.Thread(target=attack, args=(stop,), daemon=True) for _ in range(threads)]
    for thread in running:
        thread.start()
    try:
        time.sleep(1.0)  # the attack holds what it can first
        before = client.status().version
        time.sleep(WINDOW_S)
        return client.status().version - before
    finally:
        stop.set()
        for thread in running:
            thread.join(timeout=30)


def keep_alive(wire: Wire, ids: list[str], stop: threading.Event) -> None:
    """Heartbeat every identity until `stop`, so none is evicted."""
    while not stop.wait(2.0):
        for worker_id in ids:
            wire.call("Heartbeat", pb.HeartbeatRequest(**wire.creds(worker_id)))


@pytest.mark.slow
def test_silent_push_streams_of_one_tokens_identities_do_not_stop_rounds(swarm) -> None:
    target, client, workers = swarm
    wire = Wire(target)
    ids = [wire.join(f"silent{k}") for k in range(20)]
    beating = threading.Event()
    beater = threading.Thread(target=keep_alive, args=(wire, ids, beating), daemon=True)
    beater.start()
    opened, refused = [0], [0]
    lock = threading.Lock()
    turn = iter(range(10**9))

    def hold(stop: threading.Event) -> None:
        """Keep a silent PushUpdate stream of one identity open, reopening it as soon as it ends."""
        with lock:
            worker_id = ids[next(turn) % len(ids)]
        metadata = (*wire.metadata, (WORKER_ID_METADATA, worker_id), (WORKER_SECRET_METADATA, wire.secrets[worker_id]))

        def silent() -> Iterator[pb.PushUpdateRequest]:
            stop.wait(60.0)
            yield from ()

        while not stop.is_set():
            call = wire.stub.PushUpdate.future(silent(), timeout=DAY_S, metadata=metadata)
            while not call.done() and not stop.wait(0.01):
                pass
            with lock:
                opened[0] += 1
                refused[0] += call.done() and call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            stop.wait(0.01)

    try:
        rounds = rounds_during(client, hold, threads=2 * len(ids))
    finally:
        beating.set()
        beater.join(timeout=10)
        wire.close()
    print(f"silent push streams: {opened[0]} opened ({refused[0]} refused); {rounds} rounds in {WINDOW_S:g} s")
    assert rounds >= 3, logs_of(workers)
    for worker in workers:
        assert worker.poll() is None, logs_of(workers)


# A member that pulls and never pushes makes each round wait for its deadline (by design: rounds wait for every
# worker that trains from their version), so the deadline is 1 s here and the check is that the honest updates
# land in every round.
# A member that pulls and never pushes makes each round wait for its deadline (by design: rounds wait for every
# worker that trains from their version), so the deadline is 1 s here and the check is that the honest updates
# land in every round.
@pytest.mark.slow
@pytest.mark.parametrize("swarm", [1.0], indirect=True)
def test_a_flood_of_long_calls_from_one_identity_does_not_starve_the_others(swarm, tmp_path: Path) -> None:
    target, client, workers = swarm
    wire = Wire(target)
    flooder = wire.join("flooder")
    creds = wire.creds(flooder)
    calls = [0]
    lock = threading.Lock()
    turn = iter(range(10**9))
    roles = ("await", "await", "await", "pull", "beat_or_status")

    def flood(stop: threading.Event) -> None:
        """One thread of the flood, in a role by its turn: day-long long polls (3 in 5 threads), pulls read
        slowly, heartbeats and status calls; each refusal waits 0.2 s."""
        with lock:
            role = roles[next(turn) % len(roles)]
        beats = 0
        while not stop.is_set():
            try:
                if role == "await":
                    wire.stub.AwaitVersion(pb.AwaitVersionRequest(**creds, min_version=10**9, wait_ms=2**31 - 1),
                                           timeout=DAY_S, metadata=wire.metadata)
                elif role == "pull":
                    for _ in wire.stub.PullParameters(pb.PullParametersRequest(**creds), timeout=DAY_S,
                                                      metadata=wire.metadata):
                        stop.wait(1.0)
                elif beats % 2:
                    wire.stub.Heartbeat(pb.HeartbeatRequest(**creds), timeout=DAY_S, metadata=wire.metadata)
                else:
                    wire.stub.GetStatus(pb.GetStatusRequest(), timeout=DAY_S, metadata=wire.metadata)
                beats += 1
            except grpc.RpcError:
                stop.wait(0.2)
            with lock:
                calls[0] += 1

    before = client.status().version
    try:
        rounds = rounds_during(client, flood, threads=150)
    finally:
        wire.close()
    closed = [r for r in read_state(tmp_path / "state", lambda store: store.rounds()) if r.version > before]
    print(f"flood: {calls[0]} calls from 150 threads of one identity; {rounds} rounds in {WINDOW_S:g} s; reports "
          f"{[r.reports for r in closed]}")
    assert rounds >= 4, logs_of(workers)
    assert all(r.reports == 2 for r in closed), [(r.version, r.reports, r.close_reason) for r in closed]
    for worker in workers:
        assert worker.poll() is None, logs_of(workers)
