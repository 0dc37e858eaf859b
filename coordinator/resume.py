"""What a coordinator starts from: the run committed in its state dir, or a new run at version 0.

`resume` runs once, in `SwarmCoordinator`'s constructor, before any thread calls it: it reads the
last committed checkpoint (θ, the outer momentum and the broadcast residual) and refuses a config
that differs from the stored run's in anything but `RESTART_MUTABLE`, or commits version 0 from the
model's parameters at the run's seed. A new run starts only in a state dir that is no other run's: one holding a
hivemind mirror's run, another run's id or spec, rows a run records, or checkpoint files its state.sqlite does not
record (a lost state.sqlite) is refused, naming what it holds, before anything is written (`_check_new_run`); a
first start that crashed before its first commit (the spec, and maybe the file of version 0) starts again, with
whatever spec it is given now.
`optimizer_state` is the outer optimizer's part of every checkpoint, written here at version 0 and by every round
close (close.py).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.observe.mirror_view import VIEW_KEY
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from rcswarm.sync import codec as codecs
from rcswarm.sync import outer

# Spec keys a restart on an existing state dir may change; any other change is refused. A sweep's run specs carry no
# `[sweep]` table (`RunSpec.sweep_runs`), so its `prune` and `prune_at` are not compared: the fractions decided are
# kept by value (coordinator/sweep.py `prune_decided`) and a restart decides only those above the largest one.
RESTART_MUTABLE = (
    "run.rounds", "run.workers", "run.target_loss", "run.eval_every", "coordinator.", "sync.round_deadline_s",
    # The wall-time budget, as run.rounds (`rcswarm run --minutes` on a run directory): the sweep's budget end,
    # forecasts and pruning read the restarted spec's; a fraction of the budget already pruned at stays done; a run
    # ended at the old budget that the new one no longer ends trains on (coordinator/sweep.py
    # `_lift_lapsed_budget_stops`).
    "run.minutes",
    "curriculum.budget_seconds", "curriculum.forecast_gain",
    # The coordinator's own defences against outliers; workers do not depend on them.
    "sync.max_update_norm", "sync.bound_tokens", "sync.aggregation", "sync.clip_factor", "sync.trim_fraction",
    "sync.centered_clip", "sync.reference_rounds", "sync.outlier_", "sync.min_cosine",
    # How rounds are paced and late updates weighted: the coordinator tells workers in their assignment.
    "sync.round", "sync.min_steps", "sync.adaptive_steps", "sync.max_steps", "sync.max_staleness",
    "sync.staleness_exponent",
    # When a round may close: `rcswarm run` raises it with --workers, which a resumed run directory may change.
    "sync.min_reports",
)


# The tables a new run's state dir holds no rows of (what a run records as it goes), and their rows in words.
ROW_KINDS = {"metrics": "metric", "events": "event", "rounds": "round", "forecasts": "forecast",
             "held_out": "held-out loss"}


@dataclass(frozen=True)
class Resumed:
    """The run a coordinator serves from: its id, θ and the outer momentum in the model's order, its version."""

    run_id: str
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    version: int


def spec_differences(old: RunSpec, new: RunSpec) -> list[str]:
    """Dotted keys whose values differ between two specs."""
    old_d, new_d = old.to_dict(), new.to_dict()
    return sorted(
        f"{table}.{key}"
        for table in old_d
        for key in set(old_d[table]) | set(new_d[table])
        if old_d[table].get(key) != new_d[table].get(key)
    )


def initial_parameters(spec: RunSpec) -> dict[str, torch.Tensor]:
    """The model's parameters at the run's seed, float32, in the model's order."""
    model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides, seed=spec.run.seed)
    return {name: p.detach().to(torch.float32).contiguous().clone() for name, p in model.named_parameters()}


def optimizer_state(momentum: outer.Tensors, feedback: codecs.ErrorFeedback, codec: int) -> dict[str, outer.Tensors]:
    """The outer optimizer's tensors to checkpoint with `momentum`: the broadcast residual of `feedback` too when
    the run's codec loses anything (the closing thread, or the constructor)."""
    state = {"outer_momentum": momentum}
    residual = feedback.snapshot()
    if residual and codec != pb.CODEC_FP32:
        state["broadcast_residual"] = residual
    return state


def _check_restart(spec: RunSpec, stored: RunSpec, state_dir: Path) -> None:
    """ValueError when `spec` differs from the state dir's `stored` spec in a key a restart may not change."""
    changed = [k for k in spec_differences(stored, spec) if not k.startswith(RESTART_MUTABLE)]
    if changed:
        raise ValueError(f"state dir {state_dir} holds a run whose spec differs in {changed}; "
                         "use a new state dir or the original config")


def _unrecorded_checkpoints(store: StateStore) -> list[str]:
    """The checkpoint files in the state dir of a run without a committed checkpoint that its start may not take
    over: every `v*.safetensors`, but for the version 0 a first start wrote and crashed before committing (the
    state dir then holds its spec; the start now writes that file again)."""
    files = sorted(path.name for path in store.checkpoint_dir.glob("v*.safetensors"))
    if files == ["v00000000.safetensors"] and store.get("spec_json") is not None:
        return []
    return files


def _foreign_state(store: StateStore) -> str | None:
    """What the state dir of a run without a committed checkpoint holds that is not a coordinator's (as
    `cli/dht._not_a_mirror_dir` says of a coordinator's for a mirror): a mirror's swarm view, a run id (a
    coordinator's first start writes its run id with its first commit), or any rows a run records as it goes.
    None for a fresh state dir or one whose first start crashed before its first commit, which holds only the spec
    and the parameter names, and maybe the checkpoint file of version 0."""
    if store.get(VIEW_KEY) is not None:
        return "holds a hivemind mirror's run (`rcswarm dht`: its swarm view)"
    run_id = store.get("run_id")
    if run_id is not None:
        return f"holds run {run_id!r} without a committed checkpoint (not a coordinator's run)"
    rows = [f"{count} {ROW_KINDS[table]}" for table, count in store.row_counts(*ROW_KINDS).items() if count]
    if rows:
        return f"holds rows of no committed run ({', '.join(rows)})"
    return None


def _check_new_run(spec: RunSpec, store: StateStore) -> None:
    """ValueError when the state dir of a run without a committed checkpoint holds another run's state (a mirror's,
    another run's id, rows) or checkpoint files its state.sqlite does not record; nothing in the state dir changes
    before. A stored spec alone is a first start's that never committed (a full disk, a kill): `spec` replaces it,
    whatever it was (a review found the state dir otherwise tied for good to a run that never was)."""
    problem = _foreign_state(store)
    if problem is not None:
        raise ValueError(f"state dir {store.state_dir} {problem}; give the coordinator a state dir of its own")
    files = _unrecorded_checkpoints(store)
    if files:
        raise ValueError(_unrecorded_problem(store.state_dir, store.checkpoint_dir, files))


def _unrecorded_problem(state_dir: Path, checkpoint_dir: Path, files: list[str]) -> str:
    return (f"state dir {state_dir} holds checkpoint files {', '.join(files)} in {checkpoint_dir} that its "
            "state.sqlite does not record: the state.sqlite that recorded them is missing; restore it, or move the "
            "files away to start a new run there")


def lost_store_problem(state_dir: Path) -> str | None:
    """Why a run may not start in `state_dir` before its store is opened (which creates state.sqlite): it holds
    checkpoint files but no state.sqlite, the one that recorded them lost; None otherwise. Checked first, so the
    refusal leaves no empty state.sqlite behind (copying the lost one back is then all a restore needs)."""
    if (state_dir / "state.sqlite").exists():
        return None
    checkpoint_dir = state_dir / "checkpoints"
    files = sorted(path.name for path in checkpoint_dir.glob("v*.safetensors"))
    return _unrecorded_problem(state_dir, checkpoint_dir, files) if files else None


def resume(spec: RunSpec, store: StateStore, feedback: codecs.ErrorFeedback, codec: int) -> Resumed:
    """Constructor only: θ, momentum and version from the last committed checkpoint, whose broadcast residual goes
    into `feedback`; or a new run, committed at version 0. ValueError for a state dir of a run whose spec differs
    in a key a restart may not change (checked before anything in the state dir changes: loading prunes old
    checkpoints by the new spec's keep_checkpoints), and, for a new run, for a state dir that holds another run's
    state or checkpoint files it does not record (`_check_new_run`); RuntimeError for a checkpoint without the
    run's parameters."""
    if store.get("checkpoint") is not None:
        _check_restart(spec, RunSpec.from_json(store.get("spec_json") or "{}"), store.state_dir)
    else:
        _check_new_run(spec, store)
    checkpoint = store.load_current()
    if checkpoint is None:
        run_id = f"{spec.run.name}-{secrets.token_hex(4)}"
        params = initial_parameters(spec)
        momentum = {k: torch.zeros_like(v) for k, v in params.items()}
        store.set_many({"spec_json": spec.to_json(), "param_names": json.dumps(list(params))})
        store.commit_version(run_id, 0, params, optimizer_state(momentum, feedback, codec), None)
        return Resumed(run_id, params, momentum, 0)
    store.set_many({"spec_json": spec.to_json()})
    run_id = store.get("run_id") or ""
    names = json.loads(store.get("param_names") or "[]")
    momentum = checkpoint.state.get("outer_momentum", {})
    if sorted(names) != sorted(checkpoint.params) or sorted(names) != sorted(momentum):
        raise RuntimeError(f"checkpoint of version {checkpoint.version} in {store.state_dir} does not hold the run's parameters")
    feedback.restore(checkpoint.state.get("broadcast_residual", {}))
    # safetensors files do not keep insertion order; the wire order is the model's.
    return Resumed(run_id, {name: checkpoint.params[name] for name in names}, {name: momentum[name] for name in names},
                   checkpoint.version)
