"""A run in one line (`pb.RunSummary`) from its status and spec: what a sweep's status lists per run.

The same function serves a coordinator's run (`SwarmCoordinator.summary`) and a mirrored hivemind
swarm (`mirror_view.MirrorRun.summary`).
"""

from __future__ import annotations

from rcswarm.config.runspec import RunSpec
from rcswarm.protos.v1 import coordinator_pb2 as pb


def run_summary(spec: RunSpec, status: pb.GetStatusResponse) -> pb.RunSummary:
    """The run of `status` in one line; the length and batch fall back to the spec's when the curriculum
    assigns none for the whole run (per-worker lengths)."""
    current = status.curriculum
    return pb.RunSummary(
        run_id=status.run_id, version=status.version, run_state=status.run_state, target_rounds=status.target_rounds,
        seq_len=current.seq_len or spec.data.seq_len, batch_size=current.batch_size or spec.data.batch_size,
        active_workers=sum(1 for w in status.workers if w.state == pb.WORKER_STATE_ACTIVE),
        latest_loss=status.latest_loss, total_tokens=status.total_tokens, tokens_per_second=status.tokens_per_second,
        curriculum=current,
    )
