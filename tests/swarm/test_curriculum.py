"""The curriculum with real worker processes: each trains its assigned length; an adaptive run lengthens."""

from __future__ import annotations

import pytest

from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.state.store import StateStore
from tests.helpers.processes import logs_of
from tests.helpers.rounds import coordinator_digests, round_losses, worker_digests
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state


@pytest.mark.slow
def test_workers_of_one_run_train_their_assigned_lengths(start_coordinator, spawn_worker):
    spec = tiny_spec(run={"rounds": 4}, inner={"steps": 8}, sync={"min_reports": 2}, data={"batch_size": 4},
                     curriculum={"worker_seq_lens": [4, 8]})
    local = start_coordinator(spec)
    version0 = local.service.param_sha256.hex()
    procs = [spawn_worker(local.target, f"w{i}") for i in range(2)]
    for proc in procs:
        assert proc.wait(timeout=180) == 0, logs_of(procs)
    status = local.client().status()
    assert status.version == 4 and status.curriculum.seq_len == 0
    assert sorted(w.assignment.seq_len for w in status.workers) == [4, 8]
    store = local.service.store
    trained = [(r.worker_id, r.seq_len, r.batch, r.tokens) for r in read_state(store.state_dir, lambda s: s.metric_rows())
               if r.tokens > 0]
    per_worker = {w.worker_id: w.assignment.seq_len for w in status.workers}
    assert {(worker, length) for worker, length, _, _ in trained} == set(per_worker.items())
    assert all(tokens == 4 * length for _, length, _, tokens in trained)
    # Each round's weight is the tokens each worker trained: 8 steps × batch 4 × (4 + 8).
    assert [r.tokens for r in read_state(store.state_dir, lambda s: s.rounds())] == [8 * 4 * 12] * 4
    reported = worker_digests(local.state_dir)
    expected = {0: version0, **coordinator_digests(local.state_dir)}
    assert all(reported[v] == {expected[v]} for v in range(4)), (reported, expected)
    losses = round_losses(local.state_dir)
    assert losses[-1] < losses[0] - 0.3, losses


@pytest.mark.slow
def test_an_adaptive_run_lengthens_after_measured_rounds(start_coordinator, spawn_worker, tmp_path):
    spec = tiny_spec(run={"rounds": 6}, inner={"steps": 4}, sync={"min_reports": 2}, data={"batch_size": 4}, curriculum={
        "policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 2.0, "tau": 1.0, "budget_seconds": 600.0})
    local = start_coordinator(spec)
    procs = [spawn_worker(local.target, f"w{i}") for i in range(2)]
    for proc in procs:
        assert proc.wait(timeout=180) == 0, logs_of(procs)
    store = local.service.store
    lengths_of: dict[int, list[int]] = {}
    for row in read_state(store.state_dir, lambda s: s.metric_rows()):
        if row.tokens > 0:
            lengths_of.setdefault(row.version, []).append(row.seq_len)
    by_version = [(version, min(found), max(found)) for version, found in sorted(lengths_of.items())]
    lengths = [low for _, low, _ in by_version]
    assert all(low == high for _, low, high in by_version), by_version
    assert lengths[0] == 4 and lengths == sorted(lengths) and len(set(lengths)) >= 2, by_version
    decisions = [event.reason for event in read_state(store.state_dir, lambda s: s.events("curriculum"))]
    assert any("lengthens L = 4 -> 8" in reason for reason in decisions), decisions
    status = local.client().status().curriculum
    assert status.policy == "adaptive" and status.seq_len >= lengths[-1] and 4 in status.seconds_per_step
    local.running.stop(grace=0.5)
    restarted = SwarmCoordinator(spec, StateStore(local.state_dir))
    try:
        assert restarted.status().curriculum.seq_len == status.seq_len
        assert restarted.curriculum.reason == status.reason.split(": ", 1)[1]
    finally:
        restarted.close()