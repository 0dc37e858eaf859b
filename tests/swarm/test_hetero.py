"""Heterogeneous swarms (issue #15): a fast and a slow real worker process, paced rounds, late work merged.

The slow worker is `tests/helpers/paced_worker.py`: the real Worker with a sleep hook that makes each inner
step take three times the fast worker's (both padded to a floor so the ratio holds on a loaded
machine). Over 10 rounds of the tiny LSTM:

* time-boxed rounds apply >= 99% of the tokens both trained, the slow worker's updates carry about a
  third of the fast one's tokens, replicas stay bit-identical and the loss falls, blocking or overlapped
  (`[sync] overlap`, issue #29);
* step-boxed rounds as before (a round deadline the slow worker misses, late updates refused) lose
  the slow worker's work, and adaptive step counts do not.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.processes import logs_of, spawn_paced
from tests.helpers.rounds import coordinator_digests, round_losses, worker_digests
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state

ROUNDS = 10


STEPS = 8


# Seconds an inner step takes at least: fast = FLOOR_S, slow = SLOW_FACTOR × FLOOR_S (headroom for a loaded machine).
FLOOR_S = 0.1


SLOW_FACTOR = 3.0


# A round deadline between the fast worker's round (0.8 s) and the slow one's (2.4 s), with room for load.
DEADLINE_S = 2 * STEPS * FLOOR_S


def pair_spec(**sync: Any):
    """The tiny LSTM, 8 inner steps of 4 × 32 bytes, 10 rounds, int8 broadcasts, with `sync` overrides."""
    return tiny_spec(
        run={"rounds": ROUNDS}, inner={"steps": STEPS, "lr": 1e-2}, sync=sync,
        coordinator={"lease_s": 10.0, "max_wait_s": 2.0, "durable": False, "keep_checkpoints": ROUNDS + 2},
    )


def run_pair(start_coordinator, tmp_path: Path, **sync: Any) -> tuple[pb.GetStatusResponse, Path]:
    """Run 10 rounds with a fast and a slow worker process; the final status and the state dir."""
    local = start_coordinator(pair_spec(**sync), tmp_path / "state")
    procs = [spawn_paced(local.target, "fast", 1.0, FLOOR_S, tmp_path), spawn_paced(local.target, "slow", SLOW_FACTOR, FLOOR_S, tmp_path)]
    try:
        for proc in procs:
            assert proc.wait(timeout=120) == 0, logs_of(procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    client = local.client()
    status = client.status()
    client.close()
    assert status.version == ROUNDS, logs_of(procs)
    return status, local.state_dir


def by_name(status: pb.GetStatusResponse) -> dict[str, pb.WorkerStatus]:
    return {w.name: w for w in status.workers}


def applied_share(status: pb.GetStatusResponse) -> float:
    return status.applied_tokens / status.total_tokens


def tokens_per_update(state_dir: Path, worker_id: str) -> list[int]:
    """Tokens the worker trained from each version it trained from (one update each)."""
    tokens: dict[int, int] = {}
    for row in read_state(state_dir, lambda store: store.metric_rows()):
        if row.worker_id == worker_id and row.tokens > 0:
            tokens[row.version] = tokens.get(row.version, 0) + row.tokens
    return [total for _, total in sorted(tokens.items())]


# The blocking case is wide (about 15 s on 2 cores): the overlapped one runs the same checks on the newer path.
@pytest.mark.parametrize("overlap", [pytest.param(False, id="blocking", marks=pytest.mark.wide),
                                     pytest.param(True, id="overlapped")])
def test_time_boxed_rounds_apply_the_work_of_a_fast_and_a_slow_worker(start_coordinator, tmp_path, overlap):
    # Overlapped (issue #29): each worker's next round starts on its own time budget while its push travels, and the
    # steps trained before the merge count toward it: the same shares, bases and falling loss.
    status, state_dir = run_pair(start_coordinator, tmp_path, round="time", round_seconds=1.0, overlap=overlap)
    workers = by_name(status)
    assert applied_share(status) >= 0.99, (status.applied_tokens, status.total_tokens)
    for worker in workers.values():
        assert worker.applied_tokens == worker.trained_tokens and worker.stale_updates == 0, worker
    # Each worker trained for the budget: the slow one's updates carry about a third of the fast one's tokens.
    fast, slow = (sorted(tokens_per_update(state_dir, workers[n].worker_id))[1:-1] for n in ("fast", "slow"))
    ratio = (sum(slow) / len(slow)) / (sum(fast) / len(fast))
    assert 0.2 <= ratio <= 0.5, (fast, slow)
    assert workers["slow"].step_seconds > 2 * workers["fast"].step_seconds > 0
    assert "time-boxed" in status.pace
    reported, expected = worker_digests(state_dir), coordinator_digests(state_dir)
    assert all(reported[v] == {expected[v]} for v in range(1, ROUNDS) if v in reported) and len(reported) >= ROUNDS - 1
    losses = round_losses(state_dir)
    assert losses[-1] < losses[0] - 0.2, losses


@pytest.mark.wide  # about 25 s on 2 cores
def test_step_boxed_rounds_lose_the_slow_workers_work_and_adaptive_steps_do_not(start_coordinator, tmp_path):
    # Both swarms run at once (their steps are mostly sleeps), which halves the test's time.
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(run_pair, start_coordinator, tmp_path / "old", round_deadline_s=DEADLINE_S, max_staleness=0),
                pool.submit(run_pair, start_coordinator, tmp_path / "adaptive", round_deadline_s=DEADLINE_S, adaptive_steps=True)]
        (old, _), (adaptive, adaptive_dir) = (run.result(timeout=180) for run in runs)
    lost = 1.0 - applied_share(old)
    print(f"step-boxed rounds, late updates refused: {lost:.1%} of the trained tokens lost")
    assert lost > 0.15 and by_name(old)["slow"].stale_updates >= 3, old
    assert by_name(old)["fast"].applied_tokens == by_name(old)["fast"].trained_tokens

    print(f"adaptive step counts: {1.0 - applied_share(adaptive):.1%} of the trained tokens lost ({adaptive.pace})")
    assert applied_share(adaptive) >= 0.99, (adaptive.applied_tokens, adaptive.total_tokens)
    slow = by_name(adaptive)["slow"]
    assert slow.stale_updates == 0 and slow.applied_tokens == slow.trained_tokens
    # Paced from its second round on: about a third of inner.steps (the fast worker's round time).
    per_update = sorted(tokens_per_update(adaptive_dir, slow.worker_id))
    assert per_update[len(per_update) // 2] <= STEPS * 4 * 32 / 2, per_update
    assert "adaptive steps" in adaptive.pace
