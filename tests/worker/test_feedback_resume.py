"""A restarted worker resumes its error feedback (issue #28): real workers in this process, a real coordinator on
loopback. With `--state-dir` the residual is saved after each delivered update and taken back by the next worker
process of the same run, format and decay; any other file is ignored with its reason."""

from __future__ import annotations

import logging

import grpc
import torch

from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.sync.feedback_state import FEEDBACK_FILE, load_feedback
from rcswarm.worker import Worker
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.worker import _options, run_until

SPARSE = {"codec": "sparse", "sparse_chunk": 256, "density": 0.05, "value_bits": 2, "error_decay": 0.95}


class Recording(Worker):
    """The real worker, counting its delivered pushes and keeping the residual it had right after its join."""

    def __init__(self, options) -> None:
        super().__init__(options, TOKEN)
        self.delivered = 0
        self.at_join: dict[str, torch.Tensor] | None = None

    def _resume_feedback(self) -> None:
        super()._resume_feedback()
        self.at_join = self.error_feedback.snapshot()

    def _push(self, version, base, tokens) -> bool:
        delivered = super()._push(version, base, tokens)
        self.delivered += delivered
        return delivered


def test_a_restarted_worker_resumes_its_error_feedback(start_coordinator, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="rcswarm.worker")
    local = start_coordinator(tiny_spec(run={"rounds": 50}, inner={"steps": 2}, sync=SPARSE))
    state_dir = tmp_path / "worker"
    first = Recording(_options(local.target, state_dir=state_dir))
    assert run_until(first, lambda w: w.delivered >= 2, 60) == 0
    kept = first.error_feedback.snapshot()
    assert kept and first.error_feedback.residual_norm() > 0
    saved, why = load_feedback(state_dir, first.run_id, first.codec, 0.95, local.service.shapes)
    assert saved is not None and all(torch.equal(saved[k], kept[k]) for k in kept), f"the file is not the last residual: {why}"
    # A new worker process of the same run starts from the saved residual, bit for bit.
    second = Recording(_options(local.target, state_dir=state_dir))
    assert run_until(second, lambda w: w.delivered >= 1, 60) == 0
    assert second.at_join is not None and all(torch.equal(second.at_join[k], kept[k]) for k in kept)
    assert "resumed the error feedback of" in caplog.text
    # Without a state dir a worker starts from zero.
    third = Recording(_options(local.target))
    assert run_until(third, lambda w: w.delivered >= 1, 60) == 0
    assert third.at_join == {}


def test_a_residual_of_another_run_or_setting_is_not_taken(start_coordinator, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="rcswarm.worker")
    state_dir = tmp_path / "worker"
    first = start_coordinator(tiny_spec(run={"rounds": 50}, inner={"steps": 2}, sync=SPARSE))
    assert run_until(Recording(_options(first.target, state_dir=state_dir)), lambda w: w.delivered >= 1, 60) == 0
    assert (state_dir / FEEDBACK_FILE).is_file()
    other = start_coordinator(tiny_spec(run={"rounds": 50, "name": "other"}, inner={"steps": 2},
                                        sync={**SPARSE, "error_decay": 0.9}))
    worker = Recording(_options(other.target, state_dir=state_dir))
    assert run_until(worker, lambda w: w.delivered >= 1, 60) == 0
    assert worker.at_join == {}
    assert "is another run's or setting's: run_id" in caplog.text and "decay '0.95' (this run: '0.9')" in caplog.text


class RefusesThirdPush(SwarmCoordinator):
    """The real coordinator, refusing the third update it is pushed as an over-bound update is (INVALID_ARGUMENT),
    after reading it whole."""

    pushes = 0

    def push(self, requests):
        RefusesThirdPush.pushes += 1
        if RefusesThirdPush.pushes == 3:
            for _ in requests:
                pass
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "update rejected: a test's refusal")
        return super().push(requests)


class KeepsResidualOnRefusal(Recording):
    """Records the residual put back in memory when a push raises (what a restart should resume)."""

    put_back: dict[str, torch.Tensor] | None = None

    def _push_deltas(self, version, deltas, tokens, send_bound, rejoin=True):
        try:
            return super()._push_deltas(version, deltas, tokens, send_bound, rejoin)
        except grpc.RpcError:
            self.put_back = self.error_feedback.snapshot()
            raise


def test_a_refused_push_leaves_the_residual_put_back_in_the_file(start_coordinator, tmp_path) -> None:
    """A push refused for good (INVALID_ARGUMENT ends the worker): the file holds the residual from before that push,
    saved as refused; before, it kept the one saved as the push began (the residual once that update landed), which
    a restart resumed: a refused round's part in it, the largest entries it carried lost."""
    RefusesThirdPush.pushes = 0
    local = start_coordinator(tiny_spec(run={"rounds": 50}, inner={"steps": 2}, sync=SPARSE), service=RefusesThirdPush)
    state_dir = tmp_path / "worker"
    worker = KeepsResidualOnRefusal(_options(local.target, state_dir=state_dir))
    assert run_until(worker, lambda w: False, 60) == 1 and worker.delivered == 2
    assert "INVALID_ARGUMENT" in worker.exit_reason or "a test's refusal" in worker.exit_reason, worker.exit_reason
    put_back = worker.put_back
    assert put_back and any(t.abs().sum() > 0 for t in put_back.values())
    saved, why = load_feedback(state_dir, worker.run_id, worker.codec, 0.95, local.service.shapes)
    assert saved is not None and all(torch.equal(saved[k], put_back[k]) for k in put_back), why
    assert "refused" in why, why


class ResumesAGrownResidual(Recording):
    """Resumes a residual far over the hard norm bound, as sparse error feedback grows one over many rounds (a
    density of 0.002 took the sent norm to 15.67 of the automatic bound's 18.83 in 500 rounds, still rising)."""

    def __init__(self, options) -> None:
        super().__init__(options)
        self.residual_norms: list[float] = []

    def _resume_feedback(self) -> None:
        self.error_feedback.restore({name: torch.full_like(p, 10.0) for name, p in self.model.named_parameters()})
        super()._resume_feedback()
        self.residual_norms.append(self.error_feedback.residual_norm())

    def _push(self, version, base, tokens) -> bool:
        delivered = super()._push(version, base, tokens)
        self.residual_norms.append(self.error_feedback.residual_norm())
        return delivered


def test_a_residual_grown_over_the_norm_bound_is_sent_in_parts_not_refused(start_coordinator, caplog) -> None:
    """With error feedback a worker sends at most 0.9 of the coordinator's hard bound (sync/norm_bound.py) and keeps
    the rest in its residual: every push is taken, each round's update under the bound, and the residual shrinks
    round by round. Before, the first push was refused as over the bound (INVALID_ARGUMENT) and the worker ended."""
    caplog.set_level(logging.INFO, logger="rcswarm.worker")
    local = start_coordinator(tiny_spec(run={"rounds": 50}, inner={"steps": 2}, sync=SPARSE))
    worker = ResumesAGrownResidual(_options(local.target))
    assert run_until(worker, lambda w: w.delivered >= 3, 60) == 0, worker.exit_reason
    bound = local.service.closer.norm_bound[0]
    rounds = local.service.store.rounds()
    assert rounds and all(0 < r.update_norm <= bound and r.dropped == 0 for r in rounds), ([r.update_norm for r in rounds], bound)
    assert worker.residual_norms == sorted(worker.residual_norms, reverse=True), worker.residual_norms
    assert "is scaled by" in caplog.text and "the error-feedback residual keeps the rest" in caplog.text
