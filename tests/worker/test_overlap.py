"""Overlapped rounds (`[sync] overlap`, issue #29): the merge equation, and real workers training while a round travels."""

import threading

import pytest
import torch

from rcswarm.config.runspec import RunSpec, SyncSection
from rcswarm.models import registry
from rcswarm.train.round import RoundTrainer
from rcswarm.worker import Worker, WorkerOptions
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

    def _fetch_next(self, version: int, accepted: bool):
        self._evict("await")
        return super()._fetch_next(version, accepted)


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
