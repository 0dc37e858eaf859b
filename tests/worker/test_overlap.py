"""Overlapped rounds (`[sync] overlap`, issue #29): the merge equation, and real workers training while a round travels."""

import threading

import pytest
import torch

from rcswarm.config.runspec import RunSpec, SyncSection
from rcswarm.models import registry
from rcswarm.train.round import RoundTrainer
from rcswarm.worker import Worker, WorkerOptions
from rcswarm.worker.client import Identity
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.worker import local_training


def test_rebase_is_the_merge_equation_in_float64():
    spec = tiny_spec()
    trainer = RoundTrainer(torch.device("cpu"))
    trainer.build(spec, model_seed=3)
    trainer.model.double()
    params = dict(trainer.model.named_parameters())
    # Hand-chosen values per parameter, exact in float64: θ_local = 1.25, θ_pushed = 0.5, θ_new = −2.0 + index.
    pushed, new = {}, {}
    for index, (name, p) in enumerate(params.items()):
        with torch.no_grad():
            p.fill_(1.25)
        pushed[name] = torch.full_like(p, 0.5, device="cpu")
        new[name] = torch.full_like(p, -2.0 + index, device="cpu")
    trainer.rebase(new, pushed)
    for index, (name, p) in enumerate(params.items()):
        # θ ← θ_new + (θ_local − θ_pushed) = (−2 + index) + (1.25 − 0.5)
        assert p.dtype == torch.float64
        assert torch.equal(p.detach(), torch.full_like(p, index - 1.25)), name


def test_rebase_keeps_the_progress_since_the_push_per_element():
    spec = tiny_spec()
    trainer = RoundTrainer(torch.device("cpu"))
    trainer.build(spec, model_seed=5)
    trainer.model.double()
    generator = torch.Generator().manual_seed(0)
    local = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    pushed = {n: torch.randn(p.shape, generator=generator, dtype=torch.float64) for n, p in local.items()}
    new = {n: torch.randn(p.shape, generator=generator, dtype=torch.float64) for n, p in local.items()}
    trainer.rebase(new, pushed)
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p.detach(), new[name] + (local[name] - pushed[name]))


def test_overlap_is_validated():
    assert SyncSection(overlap=True).overlap is True
    for bad, match in ((1, "true or false"), ("yes", "true or false")):
        try:
            SyncSection(overlap=bad)
        except ValueError as exc:
            assert "sync.overlap" in str(exc) and match in str(exc)
        else:
            raise AssertionError(f"overlap = {bad!r} was accepted")
    try:
        RunSpec.from_dict({"sync": {"overlap": True, "backend": "hivemind"}})
    except ValueError as exc:
        assert "sync.overlap" in str(exc) and "hivemind" in str(exc)
    else:
        raise AssertionError("overlap with the hivemind backend was accepted")


def test_one_overlapped_worker_with_lr_one_and_no_momentum_is_plain_local_training(start_coordinator, caplog):
    # θ_{v+1} = θ_v − Δ = θ_pushed, so the merge θ_{v+1} + (θ_local − θ_pushed) is θ_local: the steps trained while
    # the round travelled are kept, and every round still pushes inner.steps steps.
    spec = tiny_spec(run={"rounds": 3}, inner={"steps": 7}, outer={"lr": 1.0, "momentum": 0.0},
                     sync={"codec": "fp32", "overlap": True})
    local = start_coordinator(spec)
    worker = Worker(WorkerOptions(coordinator=local.target, device="cpu", name="solo"), TOKEN)
    thread = threading.Thread(target=worker.run)
    with caplog.at_level("INFO", logger="rcswarm.worker"):
        thread.start()
        thread.join(timeout=120)
    assert not thread.is_alive()
    assert local.service.version == 3
    # Versions 1 and 2 arrived by the overlapped merge, not by a blocking pull.
    merged = [r.getMessage() for r in caplog.records if "merged version" in r.getMessage()]
    assert len(merged) == 2, merged
    expected = local_training(spec, steps=3 * 7)
    for name, theta in local.service.params.items():
        torch.testing.assert_close(theta, expected[name], rtol=0, atol=1e-5)
    initial = registry.build_model("lstm_lm", "tiny", seed=spec.run.seed).state_dict()
    assert any(not torch.equal(theta, initial[name]) for name, theta in local.service.params.items())


class EvictedDuringAnExchange(Worker):
    """A real worker whose first overlapped exchange loses its membership (its own Leave on the real wire, as an
    eviction or a coordinator restart would): before its push (`when` = "push") or after it landed ("await")."""

    def __init__(self, *args, when: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.when, self.evicted = when, False

    def _evict(self, when: str) -> None:
        if self.when == when and not self.evicted and threading.current_thread().name.startswith("exchange"):
            self.evicted = True
            self.client.leave(self.identity, "evicted by the test")

    def _push_deltas(self, *args, **kwargs) -> bool:
        self._evict("push")
        return super()._push_deltas(*args, **kwargs)

    def _fetch_next(self, version: int, accepted: bool, stale_in: str | None = None):
        self._evict("await")
        return super()._fetch_next(version, accepted, stale_in)


@pytest.mark.parametrize("when", ["push", "await"])
def test_not_found_on_the_exchange_thread_loses_neither_the_update_nor_the_steps_since(start_coordinator, caplog,
                                                                                       when):
    # NOT_FOUND on the exchange thread: the training thread joins again and finishes the exchange (the update is
    # pushed again under the new membership when it had not landed). With one worker, lr 1 and no momentum the
    # result is plain local training of every step: an update or a step lost would show in θ.
    spec = tiny_spec(run={"rounds": 3}, inner={"steps": 7}, outer={"lr": 1.0, "momentum": 0.0},
                     sync={"codec": "fp32", "overlap": True})
    local = start_coordinator(spec)
    worker = EvictedDuringAnExchange(WorkerOptions(coordinator=local.target, device="cpu", name="solo"), TOKEN,
                                     when=when)
    thread = threading.Thread(target=worker.run)
    with caplog.at_level("INFO", logger="rcswarm.worker"):
        thread.start()
        thread.join(timeout=120)
    assert not thread.is_alive()
    messages = [r.getMessage() for r in caplog.records]
    assert worker.evicted and any("joining again to finish the round in flight" in m for m in messages), messages
    assert local.service.version == 3
    assert len([m for m in messages if "merged version" in m]) == 2, messages
    expected = local_training(spec, steps=3 * 7)
    for name, theta in local.service.params.items():
        torch.testing.assert_close(theta, expected[name], rtol=0, atol=1e-5)


class RestartedDuringAnExchange(Worker):
    """A real worker whose coordinator is restarted on its state dir, with `respec` (a change a restart allows), just
    before the push of its first overlapped exchange from version 1."""

    def __init__(self, *args, restart, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.restart, self.restarted = restart, False

    def _push_deltas(self, version, deltas, tokens, send_bound, rejoin=True) -> bool:
        if not self.restarted and version == 1 and threading.current_thread().name.startswith("exchange"):
            self.restarted = True
            self.restart()
        return super()._push_deltas(version, deltas, tokens, send_bound, rejoin)


def run_restarted(target: str, restart) -> RestartedDuringAnExchange:
    """A `RestartedDuringAnExchange` worker named "solo", run to its end (`run_to_the_end`)."""
    return run_to_the_end(RestartedDuringAnExchange(WorkerOptions(coordinator=target, device="cpu", name="solo"),
                                                    TOKEN, restart=restart))


def run_to_the_end(worker: Worker) -> Worker:
    """Run `worker` on its own thread until it ends (at most 120 s), which must be with exit status 0."""
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    thread.join(timeout=120)
    worker.stop.set()
    assert not thread.is_alive() and result == [0], worker.exit_reason
    return worker


def test_a_restart_with_a_change_it_allows_keeps_the_model_optimizer_and_progress(start_coordinator, tmp_path):
    # The restarted coordinator serves run.rounds 5 instead of 3 (RESTART_MUTABLE): the re-join keeps the model, its
    # inner optimizer and error feedback, and the merge keeps the steps since the push. It used to rebuild the model
    # (fresh random θ) and merge θ_new + (θ_random − θ_pushed): the next update was refused for its norm and the
    # worker exited 1. With one worker, lr 1 and no momentum the run is plain local training of every step.
    spec = tiny_spec(run={"rounds": 3}, inner={"steps": 4}, outer={"lr": 1.0, "momentum": 0.0},
                     sync={"codec": "fp32", "overlap": True})
    respec = tiny_spec(run={"rounds": 5}, inner={"steps": 4}, outer={"lr": 1.0, "momentum": 0.0},
                       sync={"codec": "fp32", "overlap": True})
    state_dir = tmp_path / "restarted"
    running = [start_coordinator(spec, state_dir=state_dir)]
    port = running[0].port

    def restart() -> None:
        running[0].running.stop(grace=0.2)
        running.append(start_coordinator(respec, state_dir=state_dir, port=port))

    worker = run_restarted(running[0].target, restart)
    assert worker.restarted and worker.builds == 1
    assert running[-1].service.version == 5
    expected = local_training(spec, steps=5 * 4)
    for name, theta in running[-1].service.params.items():
        torch.testing.assert_close(theta, expected[name], rtol=0, atol=1e-5)


def test_a_rejoin_that_rebuilds_the_model_loads_the_pulled_theta_instead_of_merging(start_coordinator, tmp_path,
                                                                                     monkeypatch, caplog):
    # Should a re-join rebuild the model (`rebuild_reason`: forced here; a change of model, inner, data or the wire
    # format would), θ_pushed is another model's: the merge loads θ_{v+1} instead of adding θ_random − θ_pushed,
    # drops the update trained on the replaced model and goes on; the run completes.
    from rcswarm.worker import worker as worker_module

    spec = tiny_spec(run={"rounds": 3}, inner={"steps": 4}, outer={"lr": 1.0, "momentum": 0.0},
                     sync={"codec": "fp32", "overlap": True})
    state_dir = tmp_path / "rebuilt"
    running = [start_coordinator(spec, state_dir=state_dir)]
    port = running[0].port
    real = worker_module.rebuild_reason

    def restart() -> None:
        monkeypatch.setattr(worker_module, "rebuild_reason", lambda old, new, same: real(old, new, same) or "forced")
        running[0].running.stop(grace=0.2)
        running.append(start_coordinator(spec, state_dir=state_dir, port=port))

    with caplog.at_level("INFO", logger="rcswarm.worker"):
        worker = run_restarted(running[0].target, restart)
    messages = [r.getMessage() for r in caplog.records]
    assert worker.builds >= 2 and any("model was built anew at the re-join" in m for m in messages), messages
    assert running[-1].service.version == 3
    assert all(bool(torch.isfinite(theta).all()) for theta in running[-1].service.params.values())


def test_an_overlapped_worker_is_not_refused_when_the_curriculum_lowers_batch_times_seq_len(start_coordinator):
    # The steps trained while round 1 travels are trained under version 1's assignment (4 × 32) and count toward the
    # update from version 2 (1 × 64): the coordinator's token bound covers both, or it refused the update as an
    # outlier and the worker exited 1 (`intake.UpdateIntake.trained_since`).
    spec = tiny_spec(run={"rounds": 4}, inner={"steps": 4}, outer={"lr": 1.0, "momentum": 0.0},
                     sync={"codec": "fp32", "overlap": True}, curriculum={"schedule": [[0, 32, 4], [8, 64, 1]]})
    local = start_coordinator(spec)
    run_to_the_end(Worker(WorkerOptions(coordinator=local.target, device="cpu", name="solo"), TOKEN))
    assert local.service.version == 4
    assert local.service.workers and all(w.dropped_updates == 0 for w in local.service.workers.values())


class EvictedAfterItsPushLanded(Worker):
    """A real worker whose membership ends (its own Leave on the real wire, as an eviction would) right after its
    first update landed, while round 0 is still open; it records the versions it trained and encoded updates from."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.evicted, self.encoded = False, []

    def _await(self, min_version: int) -> None:
        if not self.evicted and min_version == 1:
            self.evicted = True
            self.client.leave(self.identity, "evicted by the test")
        super()._await(min_version)

    def _push_deltas(self, version, deltas, tokens, send_bound, rejoin=True) -> bool:
        self.encoded.append(version)
        return super()._push_deltas(version, deltas, tokens, send_bound, rejoin)


@pytest.mark.parametrize("overlap", [True, False])
def test_an_update_that_landed_before_an_eviction_is_awaited_not_trained_again(start_coordinator, caplog, overlap):
    # Round 0 stays open (a second member that never pushes) when the worker loses its membership after its update
    # landed. It used to pull θ_0 again, train a second round from version 0 and push it: ALREADY_EXISTS (the
    # coordinator carried the delivered version over), taken as delivered, so that round's progress and the residual
    # it sent were lost. Now the landed update is pushed again as encoded (ALREADY_EXISTS) and version 1 awaited.
    spec = tiny_spec(run={"rounds": 2, "workers": 2}, inner={"steps": 4}, outer={"lr": 1.0, "momentum": 0.0},
                     sync={"codec": "int8", "overlap": overlap, "round_deadline_s": 3.0})
    local = start_coordinator(spec)
    holder = local.client()
    seat = Identity.of(holder.join("holder", "cpu", 1))
    stop_beat = threading.Event()

    def beat() -> None:
        while not stop_beat.wait(1.0):
            holder.heartbeat(seat)

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    worker = EvictedAfterItsPushLanded(WorkerOptions(coordinator=local.target, device="cpu", name="solo"), TOKEN)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    try:
        with caplog.at_level("INFO", logger="rcswarm.worker"):
            thread.start()
            thread.join(timeout=90)
    finally:
        worker.stop.set()
        stop_beat.set()
        beating.join(timeout=5)
        holder.close()
    assert not thread.is_alive() and result == [0], worker.exit_reason
    messages = [r.getMessage() for r in caplog.records]
    assert worker.evicted and any("pushed again under the new membership" in m for m in messages), messages
    assert worker.encoded == [0, 1], worker.encoded
    assert local.service.version == 2
    assert local.service.applied_tokens == 2 * 4 * 4 * 32


def test_rebuild_reason_rebuilds_for_what_shapes_training_only():
    from rcswarm.worker.worker import rebuild_reason

    spec = tiny_spec(sync={"codec": "int8", "overlap": True})
    assert rebuild_reason(spec, tiny_spec(run={"rounds": 9}, sync={"codec": "int8", "overlap": True,
                                                                    "round_deadline_s": 5.0}), True) == ""
    assert rebuild_reason(None, spec, True) and rebuild_reason(spec, spec, False)
    assert "inner" in rebuild_reason(spec, tiny_spec(inner={"lr": 1e-3}, sync={"codec": "int8", "overlap": True}), True)
    assert "wire format" in rebuild_reason(spec, tiny_spec(sync={"codec": "fp32", "overlap": True}), True)
