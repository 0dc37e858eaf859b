"""Poisoning (issue 14): a malicious worker among 4 honest ones, 20 rounds, a real coordinator on loopback.

The malicious worker is `MaliciousWorker`, a subclass of the real `worker.Worker` that trains
honestly and then changes what it pushes: "scale" multiplies its Δ by 1e3, "flip" sends −Δ,
"scaled_flip" sends −1.9 Δ (a flip scaled to just under the clip limit, clip_factor 2 × the median
norm), "claim" sends −Δ claiming 1e12 tokens (a claim alone, with the honest Δ, would only make
the average its own honest update). Every worker is a real Worker on its own thread (one torch
thread for all), talking real gRPC to an in-process coordinator server; θ of every version is
read back from the coordinator's checkpoints.

Reproducibility. A worker's data stream follows its join index (`data_seed`), so the run
fixes who joins when: the malicious worker joins first (index 1; in the honest-only run a
placeholder joins and leaves at once), then the 4 honest workers take indices 2 to 5, and the
round waits (`sync.min_reports = 4`, and the malicious worker holds its first push until all
have joined) so that every round has the same members. The 4 honest workers then see exactly
the same data in every run, and with the fp32 codec the honest-only run is bit-identical
whenever the attacker's update does not enter it.

The measure. For every round r = 1..20 of a run A and the honest-only run H (same seeds):
    d(r) = ‖θ_A(r) − θ_H(r)‖ / ‖θ_H(r) − θ_H(r−1)‖,
the distance to the honest trajectory in units of the honest run's own step that round; the
criterion is max_r d(r) <= 0.1. Loss = the mean cross-entropy of θ on 4 fixed held-out batches.

What holds:
* Default aggregation (the direction check, clipped_mean, the automatic norm bound, the token
  bound): the scaled update is refused by the hard norm bound and the 1e12-token claim by the token
  bound, each recorded as a `dropped` event with its reason, and the malicious worker exits at its
  first push; the flip and the scaled flip are accepted at push and dropped at every close by the
  direction check (their cosine with each of the 4 honest updates is negative; a `dropped` event per
  round, counted in the round's record), and the malicious worker trains on to the end. In all four
  θ_A = θ_H bit for bit: d(r) = 0 <= 0.1 for every round, and the loss falls as in the honest run.
* Without the direction check (`sync.min_cosine = -1`) a flip of honest norm is no outlier by norm
  and enters like a 5th worker: d reaches 12.8 under clipped_mean, 17.8 for the scaled flip (a 5th
  worker pushing its honest update reaches 7.5). The loss still falls (a flip at honest norm shrinks the step, Δ̄ ≈ 3/5 of
  the honest one). trimmed_mean and centered_clip without the check flag it in most rounds, and no
  honest worker.
* With the hard bound lifted to the old 1e4, clipped_mean scales the 1e3-scaled update (honest in
  direction, so the check keeps it) to clip_factor × the reference norm in every round (recorded per
  round and as events) and the loss ends where the honest run's does; d is of the order of the
  flip's (it is one clipped worker's share), not 0.1. With `sync.outlier_evict_after` it is
  evicted, with its reason.
* `mean` with the old defaults (max_update_norm 1e4, no token bound, no direction check): "scale"
  and "claim" make the loss rise far above its start (diverge: 10^4 and 189 against 5.6 at the start).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.train.inner import make_sampler, masked_cross_entropy
from rcswarm.worker import Worker, WorkerOptions
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.slow

ROUNDS = 20
HONEST = 4
OLD_DEFAULTS = {"aggregation": "mean", "max_update_norm": 1e4, "bound_tokens": False, "min_cosine": -1.0}
# The outer step of those days (DiLoCo's Nesterov; plain averaging is the default since issue #28).
OLD_OUTER = {"lr": 0.7, "momentum": 0.9, "nesterov": True}
CHECK_OFF = {"min_cosine": -1.0}
FACTORS = {"scale": 1e3, "flip": -1.0, "scaled_flip": -1.9, "claim": -1.0}


def poisoning_spec(outer: dict[str, Any] | None = None, **sync: Any) -> RunSpec:
    """The tiny LSTM, 2 inner steps of 2 × 16 bytes, fp32 updates, every round waiting for the 4 honest workers."""
    return tiny_spec(
        outer=outer or {},
        run={"rounds": ROUNDS, "workers": HONEST + 1},
        data={"seq_len": 16, "batch_size": 2, "max_bytes": 300_000},
        inner={"steps": 2, "lr": 1e-2},
        sync={"codec": "fp32", "round_deadline_s": 60.0, "min_reports": HONEST, **sync},
        coordinator={"lease_s": 10.0, "max_wait_s": 2.0, "keep_checkpoints": ROUNDS + 2, "durable": False},
    )


class MaliciousWorker(Worker):
    """A real worker that trains honestly and pushes a poisoned update.

    It holds its first push until `go` is set (so that every honest worker joined first).
    "scale": 1e3 Δ; "flip": −Δ; "scaled_flip": −1.9 Δ; "claim": −Δ with 1e12 tokens. The local
    parameters are set so that the worker's own `_push` computes the poisoned Δ = θ_v − θ_local;
    the next pull overwrites them.
    """

    def __init__(self, options: WorkerOptions, attack: str, go: threading.Event) -> None:
        super().__init__(options, TOKEN)
        self.attack, self.go = attack, go

    def _push(self, version: int, base: dict[str, torch.Tensor], tokens: int) -> bool:
        if not self.go.wait(timeout=60.0):
            raise RuntimeError("the honest workers did not join within 60 s")
        factor = FACTORS[self.attack]
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                honest = base[name] - p.detach().cpu()
                p.copy_(base[name] - factor * honest)
        return super()._push(version, base, tokens)

    def _deliver(self, version: int, tokens: int, header: Any, chunks: Any, rejoin: bool = True) -> bool:
        return super()._deliver(version, 10**12 if self.attack == "claim" else tokens, header, chunks, rejoin)

    def _send_bound(self, base: dict[str, torch.Tensor]) -> float:
        return math.inf  # an attacker does not keep to the cap an honest worker sends under (sync/norm_bound.py)


@dataclasses.dataclass
class SwarmRun:
    """θ of every version, the held-out loss of each, the coordinator's events and per-round records."""

    thetas: list[dict[str, torch.Tensor]]
    losses: list[float]
    events: list[tuple[str, str, str]]
    rounds: list[tuple[int, int, int, str]]
    exit_codes: dict[str, int]

    @property
    def malicious_ids(self) -> list[str]:
        """The malicious worker's memberships in join order (it joins again after an eviction)."""
        return [worker for worker, kind, reason in self.events if kind == "join" and reason.startswith("malicious:")]

    @property
    def malicious_id(self) -> str:
        return self.malicious_ids[0]

    def distance(self, other: SwarmRun, version: int) -> float:
        return math.sqrt(sum(float((self.thetas[version][k].double() - other.thetas[version][k].double()).square().sum())
                             for k in self.thetas[version]))

    def step(self, version: int) -> float:
        return math.sqrt(sum(float((self.thetas[version][k].double() - self.thetas[version - 1][k].double()).square().sum())
                             for k in self.thetas[version]))

    def ratios(self, honest: SwarmRun) -> list[float]:
        """d(r) = ‖θ_self(r) − θ_honest(r)‖ / ‖θ_honest(r) − θ_honest(r − 1)‖ for r = 1..ROUNDS."""
        return [self.distance(honest, r) / honest.step(r) for r in range(1, ROUNDS + 1)]


def held_out_loss(spec: RunSpec, theta: dict[str, torch.Tensor], batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides)
    model.load_state_dict(theta, strict=True)
    with torch.no_grad():
        return sum(float(masked_cross_entropy(model(x), y)) for x, y in batches) / len(batches)


def run_swarm(start: Callable[..., Any], spec: RunSpec, attack: str | None) -> SwarmRun:
    """One run: a malicious worker (or, for the honest-only run, a placeholder that leaves at once) joins
    first, then 4 honest workers; every thread is joined at the end."""
    local = start(spec)
    go = threading.Event()
    options = dict(coordinator=local.target, device="cpu", patience_s=30.0)
    codes: dict[str, int] = {}
    threads = []

    def launch(worker: Worker) -> None:
        thread = threading.Thread(target=lambda: codes.__setitem__(worker.name, worker.run()), name=worker.name)
        thread.start()
        threads.append((thread, worker))

    client = local.client()
    try:
        if attack is None:
            placeholder = client.join("placeholder", "cpu", 1)
            client.leave(placeholder, "placeholder")
        else:
            launch(MaliciousWorker(WorkerOptions(name="malicious", **options), attack, go))
            wait_for(lambda: len(client.status().workers) == 1, 30, "the malicious worker to join")
        for index in range(HONEST):
            launch(Worker(WorkerOptions(name=f"honest{index}", **options), TOKEN))
        wait_for(lambda: len(client.status().workers) == HONEST + 1, 60, "every worker to join")
        go.set()
        for thread, worker in threads:
            thread.join(timeout=240)
            if thread.is_alive():
                worker.stop.set()
                thread.join(timeout=30)
                raise AssertionError(f"{worker.name} did not finish")
    finally:
        go.set()
        for _, worker in threads:
            worker.stop.set()
        client.close()
    val = make_sampler(spec.data, seed=12345, split="val")
    batches = [val.next_batch() for _ in range(4)]
    thetas = [load_file(str(local.state_dir / "checkpoints" / f"v{v:08d}.safetensors")) for v in range(ROUNDS + 1)]
    thetas = [{k: t for k, t in theta.items() if "/" not in k} for theta in thetas]
    return SwarmRun(
        thetas=thetas, losses=[held_out_loss(spec, theta, batches) for theta in thetas],
        events=[(e.worker_id, e.kind, e.reason) for e in read_state(local.state_dir, lambda store: store.events())],
        rounds=[(r.version, r.clipped, r.dropped, r.aggregation) for r in read_state(local.state_dir, lambda store: store.rounds())],
        exit_codes=codes,
    )


@pytest.fixture(scope="module")
def swarms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SwarmRun]]:
    """run_swarm with a module-wide cache: each (spec, attack) runs once."""
    from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator
    from rcswarm.state.store import StateStore
    from tests.helpers.coordinator import LocalCoordinator

    cache: dict[tuple[str, str | None], SwarmRun] = {}
    started: list[LocalCoordinator] = []

    def start(spec: RunSpec) -> LocalCoordinator:
        state_dir = tmp_path_factory.mktemp("state")
        store = StateStore(state_dir, spec.coordinator.keep_checkpoints, spec.coordinator.durable)
        local = LocalCoordinator(RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start(), Path(state_dir))
        started.append(local)
        return local

    def get(spec: RunSpec, attack: str | None) -> SwarmRun:
        key = (spec.to_json(), attack)
        if key not in cache:
            cache[key] = run_swarm(start, spec, attack)
        return cache[key]

    yield get
    for local in started:
        local.running.stop(grace=0.5)


def late_loss(run: SwarmRun) -> float:
    """The mean held-out loss of the last 5 versions (single versions bounce by ±0.3 on the tiny model)."""
    return sum(run.losses[-5:]) / 5


def assert_loss_falls(run: SwarmRun, honest: SwarmRun) -> None:
    """The held-out loss ends well below its start: at least half of the honest run's drop."""
    drop = honest.losses[0] - late_loss(honest)
    assert drop > 1.0, honest.losses
    assert late_loss(run) < run.losses[0] - 0.5 * drop, run.losses


@pytest.mark.parametrize("attack", ["scale", "claim"])
def test_the_default_keeps_a_scaled_or_overclaimed_update_out_and_theta_on_the_honest_path(swarms, attack):
    honest = swarms(poisoning_spec(), None)
    run = swarms(poisoning_spec(), attack)
    assert max(run.ratios(honest)) == 0.0  # d(r) = 0 for every round: bit-identical to the honest-only run
    assert_loss_falls(run, honest)
    # The malicious worker was refused with the reason and left; no honest worker was refused.
    dropped = [(worker, reason) for worker, kind, reason in run.events if kind == "dropped"]
    assert [worker for worker, _ in dropped] == [run.malicious_id], run.events
    expected = "exceeds the automatic sync.max_update_norm" if attack == "scale" else "tokens = 1000000000000 exceed the 64 allowed"
    assert expected in dropped[0][1]
    assert run.rounds[0][2] == 1 and all(dropped_count == 0 for _, _, dropped_count, _ in run.rounds[1:])
    assert run.exit_codes["malicious"] == 1 and all(run.exit_codes[f"honest{i}"] == 0 for i in range(HONEST))


@pytest.mark.parametrize("attack", ["scale", "claim"])
def test_mean_with_the_old_defaults_diverges_under_the_same_attack(swarms, attack):
    honest = swarms(poisoning_spec(OLD_OUTER), None)
    run = swarms(poisoning_spec(OLD_OUTER, **OLD_DEFAULTS), attack)
    assert late_loss(run) > 5 * honest.losses[0], run.losses
    assert max(run.ratios(honest)) > 20
    assert not [e for e in run.events if e[1] in ("dropped", "clipped")]


@pytest.mark.parametrize("attack", ["flip", "scaled_flip"])
def test_the_default_drops_a_sign_flipped_update_every_round_and_theta_stays_on_the_honest_path(swarms, attack):
    honest = swarms(poisoning_spec(), None)
    run = swarms(poisoning_spec(), attack)
    assert max(run.ratios(honest)) == 0.0  # d(r) = 0 for every round: bit-identical to the honest-only run
    assert_loss_falls(run, honest)
    # Accepted at push, dropped at every close with the reason; counted per round; no honest worker dropped.
    dropped = [(worker, reason) for worker, kind, reason in run.events if kind in ("dropped", "clipped", "trimmed")]
    assert [worker for worker, _ in dropped] == [run.malicious_id] * ROUNDS, run.events
    assert all(reason.startswith(f"round {r}: direction: cosine >= sync.min_cosine = 0 with 0 of the other 4 updates")
               for r, (_, reason) in enumerate(dropped))
    assert [(clipped, dropped_count) for _, clipped, dropped_count, _ in run.rounds] == [(0, 1)] * ROUNDS
    assert all("direction: 1 of 5 dropped" in summary for *_, summary in run.rounds)
    assert run.exit_codes == {"malicious": 0, **{f"honest{i}": 0 for i in range(HONEST)}}


def test_without_the_direction_check_a_flip_of_honest_size_gets_in(swarms):
    """The check is what keeps it out: with sync.min_cosine = -1 the flip is no outlier by norm, enters like a
    5th worker and moves θ far past a tenth of the honest step; the loss still falls (the step only shrinks)."""
    honest = swarms(poisoning_spec(), None)
    flipped = swarms(poisoning_spec(**CHECK_OFF), "flip")
    assert max(flipped.ratios(honest)) > 1.0
    assert not [e for e in flipped.events if e[1] in ("dropped", "clipped")]
    assert_loss_falls(flipped, honest)


def test_clipped_mean_bounds_a_scaled_update_below_the_hard_bound(swarms):
    """With the hard bound lifted to the old 1e4 the 1e3-scaled update enters; clipped_mean scales it to
    clip_factor × the reference norm in every round (recorded per round and as events), and the loss falls."""
    honest = swarms(poisoning_spec(), None)
    run = swarms(poisoning_spec(max_update_norm=1e4), "scale")
    assert [clipped for _, clipped, _, _ in run.rounds] == [1] * ROUNDS
    clipped = [(worker, reason) for worker, kind, reason in run.events if kind == "clipped"]
    assert {worker for worker, _ in clipped} == {run.malicious_id} and len(clipped) == ROUNDS
    assert "> 2 × reference" in clipped[0][1]
    assert_loss_falls(run, honest)


def test_trimmed_and_centered_clip_flag_a_flip_without_the_direction_check(swarms):
    for aggregation_name, kind in (("trimmed_mean", "trimmed"), ("centered_clip", "clipped")):
        run = swarms(poisoning_spec(aggregation=aggregation_name, **CHECK_OFF), "flip")
        flagged = [worker for worker, event, _ in run.events if event == kind]
        assert flagged.count(run.malicious_id) >= ROUNDS // 2, (aggregation_name, run.events)
        assert set(flagged) == {run.malicious_id}, (aggregation_name, run.events)


def test_a_persistent_outlier_is_evicted_with_a_reason_and_honest_workers_never(swarms):
    spec = poisoning_spec(max_update_norm=1e4, outlier_evict_after=2, outlier_window=3)
    run = swarms(spec, "scale")
    evicted = [(worker, reason) for worker, kind, reason in run.events if kind == "evict"]
    honest_ids = {worker for worker, kind, reason in run.events if kind == "join" and reason.startswith("honest")}
    assert len(honest_ids) == HONEST and not honest_ids & {worker for worker, _ in evicted}, run.events
    assert {worker for worker, _ in evicted} <= set(run.malicious_ids)
    # Evicted at the close of its second clipped round, with the rounds and the thresholds in the reason.
    assert evicted[0][0] == run.malicious_id
    assert evicted[0][1] == ("evicted: outlier in 2 of its last 2 rounds (clipped in round 0, clipped in round 1); "
                             "sync.outlier_evict_after = 2 of sync.outlier_window = 3")
    # It joins again under a new id (the join token allows that) and is evicted again after 2 more flags.
    assert len(evicted) >= 2 and all("outlier in 2 of its last 2 rounds" in r for _, r in evicted)
    assert all(run.exit_codes[f"honest{i}"] == 0 for i in range(HONEST))
