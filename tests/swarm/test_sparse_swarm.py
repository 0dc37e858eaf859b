"""A sparse swarm (issue #28): a coordinator on loopback and 3 real worker processes with `codec = "sparse"`.

Both directions carry the sparse codec: each worker pushes its update's top entries of every chunk, and pulls the
round's step sparsified by the coordinator (with its own error feedback), which it applies and checks against the
SHA-256 of the coordinator's θ. The step goes down at `sync.downlink_density` = 3 × the uplink's density (the
step of 3 workers holds up to 3 × density of each chunk), so each worker checks the downlink's parameters, not the
uplink's. The stated bound on a replica's distance from the coordinator's θ is therefore 0:
every worker's parameters after each pull equal the coordinator's bit for bit (only a join pulls θ in full).
"""

from __future__ import annotations

from itertools import pairwise

import pytest

from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.processes import logs_of
from tests.helpers.rounds import coordinator_digests, round_losses, worker_digests
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state

pytestmark = pytest.mark.slow

ROUNDS = 8


def test_three_sparse_workers_train_and_every_replica_is_the_coordinators_theta(start_coordinator, spawn_worker, tmp_path):
    spec = tiny_spec(
        run={"rounds": ROUNDS}, inner={"steps": 8}, outer={"lr": 1.0, "momentum": 0.0, "nesterov": False},
        sync={"codec": "sparse", "sparse_chunk": 256, "density": 0.05, "value_bits": 2, "error_decay": 0.95,
              "downlink_density": 0.15, "min_reports": 3},
    )
    local = start_coordinator(spec)
    version0 = local.service.param_sha256.hex()
    procs = [spawn_worker(local.target, f"w{i}", "--state-dir", str(tmp_path / f"w{i}")) for i in range(3)]
    for proc in procs:
        assert proc.wait(timeout=240) == 0, logs_of(procs)
    status = local.client().status()
    assert status.version == ROUNDS and status.run_state == pb.RUN_STATE_FINISHED
    assert [r.reports for r in status.rounds if r.closed_at] == [3] * ROUNDS
    assert sum(r.dropped for r in status.rounds) == 0, "the direction check dropped an honest sparse update"
    reported = worker_digests(local.state_dir)
    expected = {0: version0, **coordinator_digests(local.state_dir)}
    for version in range(ROUNDS):
        assert reported[version] == {expected[version]}, f"version {version}: {reported[version]} vs {expected[version]}"
    losses = round_losses(local.state_dir)
    assert losses[-1] < losses[0] - 0.3, losses
    # Traffic: every update and every pull after the first is sparse, far below the fp32 bytes of θ.
    for worker in status.workers:
        assert 0 < worker.round_bytes_up < status.fp32_bytes / 10
        assert worker.round_bytes_up < worker.round_bytes_down < status.fp32_bytes / 10  # 38 of 256 down, 13 up
    assert all((tmp_path / f"w{i}" / "error_feedback.safetensors").is_file() for i in range(3))
    # Each worker pulled θ in full once (its join, fp32), then only sparse steps: its bytes received after each pull.
    pulls: dict[str, list[int]] = {}
    for row in read_state(local.state_dir, lambda store: store.metric_rows()):
        if row.param_sha256:
            pulls.setdefault(row.worker_id, []).append(row.bytes_received)
    for worker_id, received in pulls.items():
        steps = [b - a for a, b in pairwise(received)]
        assert received[0] > status.fp32_bytes and len(steps) == ROUNDS - 1, (worker_id, received)
        assert all(0 < step < status.fp32_bytes / 10 for step in steps), (worker_id, steps)
