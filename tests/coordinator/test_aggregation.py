"""Bounded influence (issue 14): the aggregators against float64 references, the norm and token bounds,
outlier decisions, and how flagged updates are recorded (events, rounds, GetStatus, `rcswarm status`).

The references are written here, plainly, on whole float64 tensors; the package's aggregators run
slice by slice (AVERAGE_SLICE is shrunk so that slices cross tensor boundaries and leave tails).
"""

from __future__ import annotations

import io
import math
import re
import sqlite3
import threading

import grpc
import pytest
import torch
from rich.console import Console

from rcswarm.cli import status as status_cli
from rcswarm.config.runspec import InnerSection, RunSpec
from rcswarm.coordinator import SwarmCoordinator, aggregation, decisions
from rcswarm.coordinator.aggregation import AggregationOptions, Update
from rcswarm.models import registry
from rcswarm.observe.dashboard import render, views
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore
from rcswarm.sync import norm_bound, outer, tensor_stream
from rcswarm.sync.norm_bound import update_norm_bound
from rcswarm.train.inner import make_inner_optimizer, train_step
from rcswarm.worker import Worker, WorkerOptions
from tests.helpers.coordinator import deltas_of, push
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for

SHAPES = {"a": (3, 5), "b": (7,), "c": ()}


@pytest.fixture(autouse=True)
def small_slices(monkeypatch):
    """Slices of 4 elements: every tensor above spans several, with a tail."""
    monkeypatch.setattr(outer, "AVERAGE_SLICE", 4)


def make_updates(tokens: list[int], seed: int = 0, scale: float = 1.0) -> list[Update]:
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for i, n in enumerate(tokens):
        deltas = {name: torch.randn(shape, generator=generator) * scale for name, shape in SHAPES.items()}
        updates.append(Update(f"w{i}", n, tensor_stream.global_norm(deltas), deltas))
    return updates


def flat64(update: Update) -> torch.Tensor:
    return torch.cat([t.reshape(-1).double() for t in update.deltas.values()])  # [P]


def unflat(vector: torch.Tensor) -> dict[str, torch.Tensor]:
    out, start = {}, 0
    for name, shape in SHAPES.items():
        size = math.prod(shape)
        out[name] = vector[start:start + size].reshape(shape)
        start += size
    return out


def reference_clipped(updates: list[Update], limit: float) -> torch.Tensor:
    total = sum(u.tokens for u in updates)
    return sum(u.tokens * min(1.0, limit / float(flat64(u).norm())) * flat64(u) for u in updates) / total


def reference_trimmed(updates: list[Update], k: int) -> torch.Tensor:
    """Per coordinate: sort the values (ties in update order), drop k at each end, token-weighted mean of the rest."""
    x = torch.stack([flat64(u) for u in updates])  # [n, P]
    result = torch.empty(x.shape[1], dtype=torch.float64)
    for j in range(x.shape[1]):
        ranked = sorted(range(len(updates)), key=lambda i: (float(x[i, j]), i))[k:len(updates) - k]
        weight = sum(updates[i].tokens for i in ranked)
        result[j] = sum(updates[i].tokens * float(x[i, j]) for i in ranked) / weight
    return result


def reference_centered_clip(updates: list[Update], tau: float, iterations: int, start: torch.Tensor) -> torch.Tensor:
    total = sum(u.tokens for u in updates)
    v = start.clone()
    for _ in range(iterations):
        v = v + sum(u.tokens / total * (flat64(u) - v) * clip_scale(tau, float((flat64(u) - v).norm())) for u in updates)
    return v


def clip_scale(tau: float, distance: float) -> float:
    """min(1, τ / d), and 1 at the centre itself (d = 0: nothing to scale)."""
    return min(1.0, tau / distance) if distance > 0 else 1.0


def flat_result(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([tensors[name].reshape(-1).double() for name in SHAPES])


def close(got: dict[str, torch.Tensor], want: torch.Tensor) -> None:
    assert all(got[name].dtype == torch.float32 and got[name].shape == SHAPES[name] for name in SHAPES)
    torch.testing.assert_close(flat_result(got), want, rtol=1e-6, atol=1e-6)


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k].view(torch.int32), b[k].view(torch.int32)) for k in a)


def formulas(method: str, **options: float) -> AggregationOptions:
    """`method` without the direction check: the formula tests' random updates share no direction."""
    return AggregationOptions(method, min_cosine=aggregation.DIRECTION_OFF, **options)


TOKEN_CASES = [[7], [3, 11], [5, 5, 9, 1, 30]]


@pytest.mark.parametrize("tokens", TOKEN_CASES)
def test_mean_is_todays_token_weighted_average_bit_for_bit(tokens):
    updates = make_updates(tokens)
    got = aggregation.aggregate(updates, formulas("mean")).average
    total = sum(tokens)
    want = {}
    for name, shape in SHAPES.items():
        acc = torch.zeros(shape, dtype=torch.float64)
        for u in updates:
            acc.add_(u.deltas[name].to(torch.float64), alpha=u.tokens / total)
        want[name] = acc.to(torch.float32)
    assert bits_equal(got, want)


@pytest.mark.parametrize("tokens", TOKEN_CASES)
def test_clipped_mean_against_its_reference(tokens):
    updates = make_updates(tokens)
    updates[-1] = Update("big", tokens[-1], updates[-1].norm * 50, {k: v * 50 for k, v in updates[-1].deltas.items()})
    result = aggregation.aggregate(updates, formulas("clipped_mean", clip_factor=1.5))
    limit = 1.5 * aggregation.reference_norm([u.norm for u in updates], [])
    close(result.average, reference_clipped(updates, limit))
    flagged = [o.worker_id for o in result.outcomes if o.flagged]
    assert flagged == ([] if len(tokens) == 1 else ["big"])  # alone, the median is its own norm
    assert result.accepted_norms == tuple(min(u.norm, limit) for u in updates)


def test_clipped_mean_without_a_clip_is_the_mean_bit_for_bit():
    updates = make_updates([5, 5, 9, 1, 30])
    clipped = aggregation.aggregate(updates, formulas("clipped_mean"))
    assert not any(o.flagged for o in clipped.outcomes)
    assert bits_equal(clipped.average, aggregation.aggregate(updates, formulas("mean")).average)


def test_the_history_keeps_a_small_round_honest():
    """A round of one honest and one inflated update: its own median is half the attacker's, so only the
    recent rounds' norms clip it; the attacker moves the average by at most its share × clip_factor × R."""
    honest, inflated = make_updates([10, 10], seed=3)
    attacker = Update("attacker", 10, inflated.norm * 1e3, {k: v * 1e3 for k, v in inflated.deltas.items()})
    alone = aggregation.aggregate([honest, attacker], formulas("clipped_mean"))
    assert not any(o.flagged for o in alone.outcomes)
    history = [honest.norm] * 8
    result = aggregation.aggregate([honest, attacker], formulas("clipped_mean"), history)
    reference = aggregation.reference_norm([honest.norm, attacker.norm], history)
    assert reference == pytest.approx(honest.norm)
    assert [o.action for o in result.outcomes] == ["kept", "clipped"]
    influence = (flat_result(result.average) - flat64(honest) * 0.5).norm()
    assert float(influence) <= 0.5 * 2.0 * reference * (1 + 1e-6)


@pytest.mark.parametrize("tokens", TOKEN_CASES + [[2, 4, 6]])
def test_trimmed_mean_against_its_reference(tokens):
    updates = make_updates(tokens, seed=1)
    k = aggregation.trim_count(len(tokens), 0.2)
    result = aggregation.aggregate(updates, formulas("trimmed_mean", trim_fraction=0.2))
    close(result.average, reference_trimmed(updates, k))


def test_trimmed_mean_with_ties_and_an_extreme_update():
    base = make_updates([4, 4, 4, 4, 100], seed=2)
    same = base[0].deltas
    # Three equal updates (ties in every coordinate) and one far above all others.
    ties = [Update(f"t{i}", 4, base[0].norm, {k: v.clone() for k, v in same.items()}) for i in range(3)]
    extreme = Update("x", 100, base[4].norm * 1e4, {k: v.abs() * 1e4 + 1 for k, v in base[4].deltas.items()})
    updates = [*ties, base[1], extreme]
    result = aggregation.aggregate(updates, formulas("trimmed_mean", trim_fraction=0.2))
    close(result.average, reference_trimmed(updates, 1))
    by_id = {o.worker_id: o for o in result.outcomes}
    assert by_id["x"].action == "trimmed" and by_id["x"].scale == 0.0  # trimmed in every coordinate
    assert not any(by_id[f"t{i}"].flagged for i in range(3))


def test_trim_count():
    assert [aggregation.trim_count(n, 0.2) for n in (1, 2, 3, 4, 5, 10, 16)] == [0, 0, 1, 1, 1, 2, 4]
    assert [aggregation.trim_count(n, 0.0) for n in (1, 5, 16)] == [0, 0, 0]
    assert aggregation.trim_count(10, 0.3) == 3  # 0.3 × 10 is 3.0000000000000004 in floating point


@pytest.mark.parametrize("tokens", TOKEN_CASES)
@pytest.mark.parametrize("with_start", [False, True])
def test_centered_clip_against_its_reference(tokens, with_start):
    updates = make_updates(tokens, seed=4)
    generator = torch.Generator().manual_seed(6)
    previous = unflat(torch.randn(sum(math.prod(s) for s in SHAPES.values()), dtype=torch.float64, generator=generator) * 0.3)
    start = {k: v.float() for k, v in previous.items()} if with_start else None
    history = [u.norm for u in make_updates([1, 1, 1], seed=5)]
    options = formulas("centered_clip", tau=0.5, iterations=3)
    result = aggregation.aggregate(updates, options, history, start)
    tau = 0.5 * aggregation.reference_norm([u.norm for u in updates], history)
    v0 = flat_result(start) if start is not None else torch.zeros(sum(math.prod(s) for s in SHAPES.values()), dtype=torch.float64)
    close(result.average, reference_centered_clip(updates, tau, 3, v0))
    assert start is None or all(torch.equal(start[k], previous[k].float()) for k in SHAPES)  # the start is not touched


def test_centered_clip_reaches_an_update_within_tau_of_its_start_without_dividing_by_zero():
    (update,) = make_updates([7], seed=4)
    start = {k: (v + 1e-3).float() for k, v in update.deltas.items()}  # within τ: the first step lands on the update
    result = aggregation.aggregate([update], formulas("centered_clip", tau=0.5, iterations=3), [], start)
    close(result.average, flat64(update))
    assert [o.action for o in result.outcomes] == ["kept"]


def test_centered_clip_bounds_one_worker_per_iteration():
    updates = make_updates([10, 10, 10, 10], seed=6)
    attacker = Update("a", 10, 1e6, {k: torch.full(s, 1e6 / math.sqrt(22.0)) for k, s in SHAPES.items()})
    honest_only = aggregation.aggregate(updates, formulas("centered_clip", iterations=1))
    attacked = aggregation.aggregate([*updates, attacker], formulas("centered_clip", iterations=1))
    reference = aggregation.reference_norm([u.norm for u in [*updates, attacker]], [])
    # One iteration from 0: each worker moves v by at most w_i τ; the attacker's w is 1/5.
    moved = float((flat_result(attacked.average) - flat_result(honest_only.average) * 4 / 5).norm())
    assert moved <= reference / 5 * (1 + 1e-5)
    assert [o.worker_id for o in attacked.outcomes if o.flagged][-1] == "a"


def test_the_options_come_from_the_run_spec_and_bad_values_name_the_key():
    spec = RunSpec.from_dict({"sync": {"aggregation": "trimmed_mean", "trim_fraction": 0.25, "min_cosine": 0.05}})
    assert AggregationOptions.from_sync(spec.sync) == AggregationOptions("trimmed_mean", 2.0, 0.25, 1.0, 3, 0.05)
    assert RunSpec().sync.aggregation == "clipped_mean" and RunSpec().sync.max_update_norm == 0.0
    assert AggregationOptions.from_sync(RunSpec().sync) == AggregationOptions() and RunSpec().sync.min_cosine == 0.0
    for sync, message in (
        ({"aggregation": "median"}, "sync.aggregation = 'median'"), ({"clip_factor": 0.5}, "sync.clip_factor = 0.5"),
        ({"trim_fraction": 0.5}, "sync.trim_fraction = 0.5"), ({"max_update_norm": -1.0}, "sync.max_update_norm = -1.0"),
        ({"centered_clip_iterations": 0}, "sync.centered_clip_iterations = 0"),
        ({"outlier_evict_after": 6}, "sync.outlier_evict_after = 6"), ({"bound_tokens": 1}, "sync.bound_tokens = 1"),
        ({"min_cosine": 1.0}, "sync.min_cosine = 1.0 is invalid: expected a number in [-1, 1)"),
        ({"min_cosine": -1.5}, "sync.min_cosine = -1.5"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            RunSpec.from_dict({"sync": sync})


def correlated_updates(tokens: list[int], seed: int = 7, noise: float = 0.5) -> list[Update]:
    """Honest-like updates: one shared direction plus each worker's own noise (pairwise cosines about 0.8)."""
    generator = torch.Generator().manual_seed(seed)
    common = {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}
    updates = []
    for i, n in enumerate(tokens):
        deltas = {name: t + noise * torch.randn(t.shape, generator=generator) for name, t in common.items()}
        updates.append(Update(f"w{i}", n, tensor_stream.global_norm(deltas), deltas))
    return updates


def scaled(update: Update, factor: float, worker_id: str = "attacker") -> Update:
    deltas = {name: t * factor for name, t in update.deltas.items()}
    return Update(worker_id, update.tokens, tensor_stream.global_norm(deltas), deltas)


def test_the_cosine_matrix_against_its_float64_reference():
    zero = Update("zero", 1, 0.0, {name: torch.zeros(shape) for name, shape in SHAPES.items()})
    updates = [*make_updates([1, 2, 3], seed=8), zero]
    x = torch.stack([flat64(u) for u in updates])  # [4, P]
    norms = x.norm(dim=1)  # [4]
    want = torch.zeros(4, 4, dtype=torch.float64)
    want[:3, :3] = (x[:3] @ x[:3].T) / torch.outer(norms[:3], norms[:3])
    torch.testing.assert_close(aggregation.cosine_matrix(updates), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["mean", "clipped_mean", "trimmed_mean", "centered_clip"])
@pytest.mark.parametrize("factor", [-1.0, -1.9])
def test_a_flipped_update_is_dropped_and_the_others_aggregate_as_if_it_was_never_sent(method, factor):
    """A sign-flipped copy of an honest update, of honest norm or scaled to just under the clip limit (1.9 × its
    norm against clip_factor 2 × R): dropped by default under every aggregation, and the result is the honest
    updates' aggregate bit for bit; with the check off it enters."""
    honest = correlated_updates([5, 9, 1, 30])
    attacker = scaled(honest[1], factor)
    history = [u.norm for u in honest]
    previous = {name: t * 0.1 for name, t in honest[0].deltas.items()}
    attacked = aggregation.aggregate([honest[0], attacker, *honest[1:]], AggregationOptions(method), history, previous)
    alone = aggregation.aggregate(honest, AggregationOptions(method), history, previous)
    assert bits_equal(attacked.average, alone.average) and attacked.accepted_norms == alone.accepted_norms
    assert attacked.outcomes[1].action == "dropped" and attacked.outcomes[1].worker_id == "attacker"
    assert attacked.outcomes[1].reason.startswith(
        "direction: cosine >= sync.min_cosine = 0 with 0 of the other 4 updates, fewer than the 2 needed (its score -0.")
    assert [o for o in attacked.outcomes if o.worker_id != "attacker"] == list(alone.outcomes)
    assert (attacked.dropped, attacked.clipped) == (1, alone.clipped) and "direction: 1 of 5 dropped" in attacked.summary
    assert attacked.scores[1] < -0.5 < 0.5 < min(score for i, score in enumerate(attacked.scores) if i != 1)
    # An honest round is the same with the check on as off; with the check off the flip enters.
    assert alone.dropped == 0 and bits_equal(alone.average, aggregation.aggregate(honest, formulas(method), history, previous).average)
    entered = aggregation.aggregate([honest[0], attacker, *honest[1:]], formulas(method), history, previous)
    assert entered.dropped == 0 and not bits_equal(entered.average, alone.average)


def test_the_check_drops_only_a_minority_and_leaves_small_rounds_and_zero_updates_alone():
    honest = correlated_updates([10, 10, 10])
    flip = scaled(honest[0], -1.0)
    pair = aggregation.aggregate([honest[1], flip], AggregationOptions())
    assert pair.dropped == 0 and pair.scores == (None, None)
    assert "direction: not checked (2 updates with a direction; needs 3)" in pair.summary
    # A zero update has no direction: it neither votes nor is judged; the other three outvote the flip.
    zero = Update("zero", 10, 0.0, {name: torch.zeros_like(t) for name, t in honest[0].deltas.items()})
    mixed = aggregation.aggregate([honest[1], zero, flip, honest[2]], AggregationOptions())
    assert [o.action for o in mixed.outcomes] == ["kept", "kept", "dropped", "kept"] and mixed.scores[1] is None
    assert "other 2 updates, fewer than the 1 needed" in mixed.outcomes[2].reason
    # Independent random updates under a strict threshold: only the ⌊(5 − 1)/2⌋ = 2 lowest scores go.
    noise = make_updates([1] * 5, seed=9)
    strict = aggregation.aggregate(noise, AggregationOptions("mean", min_cosine=0.99))
    dropped = sorted(strict.scores[i] for i, o in enumerate(strict.outcomes) if o.action == "dropped")
    assert dropped == sorted(strict.scores)[:2]
    # Off: nothing scored, the summary as before the check existed.
    off = aggregation.aggregate([*honest, flip], formulas("mean"))
    assert off.scores == (None,) * 4 and off.summary == "mean: token-weighted" and off.dropped == 0


def test_adam_step_bound_holds_for_adversarial_gradients():
    bound = norm_bound.adam_step_bound(0.9, 0.95)
    assert bound == pytest.approx(1.1644, abs=1e-3)
    assert norm_bound.adam_step_bound(0.99, 0.95) is None
    # Gradient sequences that push m/sqrt(v) up: a long run of small gradients, then large ones of one sign.
    for pattern in ([1e-3] * 50 + [1.0] * 50, [1.0] * 100, [(-1.0) ** t * 1e-3 for t in range(60)] + [5.0] * 40):
        p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        adam = torch.optim.AdamW([p], lr=1.0, betas=(0.9, 0.95), weight_decay=0.0, eps=0.0)
        for g in pattern:
            before = float(p.detach())
            p.grad = torch.tensor([g], dtype=torch.float64)
            adam.step()
            assert abs(float(p.detach()) - before) <= bound * (1 + 1e-9)


@pytest.mark.parametrize("round_kind", ["steps", "time"])
def test_honest_inner_steps_stay_within_half_the_automatic_norm_bound(round_kind):
    # A time-boxed round (sync.round = "time") trains up to sync.step_cap = 10 × inner.steps steps, and the bound
    # the coordinator uses (`close.update_norm_bound`) counts them: before, it counted inner.steps only.
    spec = tiny_spec(inner={"steps": 5, "lr": 3e-2}, sync={"round": round_kind})
    inner, steps = spec.inner, spec.sync.step_cap(spec.inner.steps)
    model = registry.build_model("lstm_lm", "tiny", {}, seed=0)
    theta = {k: p.detach().clone() for k, p in model.named_parameters()}
    optimizer = make_inner_optimizer(model, inner)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randint(0, 256, (4, 16), generator=generator)
        train_step(model, optimizer, x, torch.roll(x, -1, dims=1), inner.grad_clip)
    delta = {k: theta[k] - p.detach() for k, p in model.named_parameters()}
    parameters = sum(t.numel() for t in theta.values())
    bound, why = update_norm_bound(spec, theta)
    assert tensor_stream.global_norm(delta) <= bound / norm_bound.NORM_BOUND_SAFETY
    assert "AdamW" in why and f"{parameters} parameters" in why and f"the most {steps} honest inner steps" in why
    sgd = InnerSection(optimizer="sgd", grad_clip=0.0)
    assert norm_bound.automatic_norm_bound(sgd, parameters, 1.0)[0] == norm_bound.FALLBACK_NORM_BOUND


def test_outlier_evictions_need_k_flags_in_the_last_m_rounds():
    options = decisions.OutlierOptions(evict_after=2, window=3)
    views = [
        decisions.OutlierView("a", True, ((1, "clipped"), (2, ""), (3, "dropped"))),
        decisions.OutlierView("b", True, ((1, "clipped"), (2, "clipped"), (3, ""), (4, ""), (5, "trimmed"))),
        decisions.OutlierView("c", False, ((1, "clipped"), (2, "clipped"))),
        decisions.OutlierView("d", True, ((7, ""),)),
    ]
    evicted = decisions.decide_outlier_evictions(views, options)
    assert evicted == [("a", "outlier in 2 of its last 3 rounds (clipped in round 1, dropped in round 3); "
                             "sync.outlier_evict_after = 2 of sync.outlier_window = 3")]
    assert decisions.decide_outlier_evictions(views, decisions.OutlierOptions(0, 3)) == []


def refusal(call) -> tuple[grpc.StatusCode, str]:
    from rcswarm.coordinator import Refusal

    with pytest.raises(Refusal) as info:
        call()
    return info.value.code, info.value.message


def test_tokens_above_the_assignment_are_refused_naming_claim_and_bound(tmp_path):
    spec = tiny_spec(sync={"codec": "fp32"}, inner={"steps": 5}, curriculum={"schedule": [[0, 32, 4], [5, 16, 2]]})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path))
    try:
        a, b = (coordinator.join(pb.JoinRequest(worker_name=n)) for n in ("a", "b"))
        code, message = refusal(lambda: push(coordinator, a, deltas_of(coordinator, 1e-3), 4 * 32 * 5 + 1))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message == ("tokens = 641 exceed the 640 allowed: batch 4 × seq_len 32 × inner.steps 5 of the assignment "
                           "at version 0; sync.bound_tokens = true")
        assert push(coordinator, a, deltas_of(coordinator, 1e-3), 640).accepted
        assert push(coordinator, b, deltas_of(coordinator, 1e-3), 640).accepted
        # Version 1 trains from step 5: the schedule's second row, batch 2 × 16.
        assert coordinator.version == 1
        assert refusal(lambda: push(coordinator, a, deltas_of(coordinator, 1e-3), 161))[1].startswith(
            "tokens = 161 exceed the 160 allowed: batch 2 × seq_len 16")
        assert push(coordinator, a, deltas_of(coordinator, 1e-3), 160).accepted
        rows = read_state(tmp_path, lambda store: store.events("dropped"))
        assert [(e.worker_id, e.kind) for e in rows] == [(a.worker_id, "dropped")] * 2 and "round 0: tokens = 641" in rows[0].reason
        assert [(r.version, r.dropped) for r in read_state(tmp_path, lambda store: store.rounds())] == [(0, 1)]
        status = coordinator.status()
        worker = next(w for w in status.workers if w.worker_id == a.worker_id)
        assert (worker.dropped_updates, worker.outlier_rounds) == (2, 2) and "tokens = 161" in worker.outlier
        assert status.rounds[-1].dropped == 1  # the open round 1
    finally:
        coordinator.close()


def test_a_late_update_is_bounded_by_the_assignment_it_trained_under(tmp_path):
    """A worker's update from version 0 that arrives after round 0 closed at its deadline (merged late) claims what
    version 0's assignment trains (batch 8 × 32 × 5): version 1's smaller one (batch 2 × 64) must not refuse it as
    an outlier, which also ended the worker (INVALID_ARGUMENT is fatal to it). Its metric rows likewise."""
    now = [1000.0]
    spec = tiny_spec(sync={"codec": "fp32", "round_deadline_s": 1.0, "max_update_norm": 100.0}, inner={"steps": 5},
                     curriculum={"schedule": [[0, 32, 8], [5, 64, 2]]})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path), clock=lambda: now[0])
    try:
        a, b, c = (coordinator.join(pb.JoinRequest(worker_name=n)) for n in ("a", "b", "c"))
        for member in (a, b, c):
            for _ in coordinator.pull(pb.PullParametersRequest(worker_id=member.worker_id,
                                                               worker_secret=member.worker_secret)):
                pass
        trained = 8 * 32 * 5
        assert push(coordinator, a, deltas_of(coordinator, 1e-3), trained).accepted
        now[0] += 2.0
        coordinator.tick()  # the deadline closes round 0 while b still trains
        assert coordinator.version == 1 and coordinator.intake.token_bound()[0] == 2 * 64 * 5
        late = push(coordinator, b, deltas_of(coordinator, 1e-3), trained, version=0)
        assert late.accepted and late.staleness == 1
        assert coordinator.workers[b.worker_id].dropped_updates == 0
        # Still bounded: more than version 0's assignment is refused, naming the versions it covers.
        code, message = refusal(lambda: push(coordinator, c, deltas_of(coordinator, 1e-3), trained + 1, version=0))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message.startswith(f"tokens = {trained + 1} exceed the {trained} allowed: batch 8 × seq_len 32 × "
                                  "inner.steps 5 of the largest assignment of versions 0..1"), message
        # A metric row trained at version 0 (batch 8 × 32 tokens) is within the rows' bound at version 1.
        assert coordinator.intake.step_token_bound()[0] == 8 * 32
    finally:
        coordinator.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_an_overlapped_update_is_bounded_by_the_assignment_before_its_base_too(tmp_path, overlap):
    """With sync.overlap the steps a worker trains while round 0 travels (under version 0's batch 8 × 32) count
    toward its update from version 1, whose own assignment (batch 2 × 64) is smaller: the bound covers version 0's
    too, or the honest update is refused and the worker exits. Without overlap the bound stays version 1's."""
    spec = tiny_spec(sync={"codec": "fp32", "max_update_norm": 100.0, "overlap": overlap}, inner={"steps": 5},
                     curriculum={"schedule": [[0, 32, 8], [5, 64, 2]]})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path))
    try:
        a = coordinator.join(pb.JoinRequest(worker_name="a"))
        for _ in coordinator.pull(pb.PullParametersRequest(worker_id=a.worker_id, worker_secret=a.worker_secret)):
            pass
        assert push(coordinator, a, deltas_of(coordinator, 1e-3), 8 * 32 * 5).accepted
        wait_for(lambda: coordinator.version == 1, 10, "the close of round 0")
        trained = 8 * 32 * 4 + 2 * 64 * 1  # four steps trained while round 0 travelled, one under version 1
        if overlap:
            assert push(coordinator, a, deltas_of(coordinator, 1e-3), trained, version=1).accepted
        else:
            code, message = refusal(lambda: push(coordinator, a, deltas_of(coordinator, 1e-3), trained, version=1))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert message.startswith(f"tokens = {trained} exceed the {2 * 64 * 5} allowed"), message
        assert coordinator.workers[a.worker_id].dropped_updates == (0 if overlap else 1)
    finally:
        coordinator.close()


def test_heterogeneous_lengths_bound_by_the_largest_assignment(tmp_path):
    spec = tiny_spec(sync={"codec": "fp32"}, inner={"steps": 2}, curriculum={"worker_seq_lens": [8, 32]})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path))
    try:
        short = coordinator.join(pb.JoinRequest(worker_name="short"))
        assert short.assignment.seq_len == 8
        # A worker that joins again mid-round pushes what it trained under its old length: up to 4 × 32 × 2.
        assert push(coordinator, short, deltas_of(coordinator, 1e-3), 4 * 32 * 2).accepted
    finally:
        coordinator.close()


def test_flagged_updates_are_recorded_per_round_and_worker_and_shown(tmp_path):
    spec = tiny_spec(sync={"codec": "fp32", "min_reports": 3, "max_update_norm": 1e3})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path))
    try:
        members = [coordinator.join(pb.JoinRequest(worker_name=n)) for n in ("a", "b", "big")]
        ids = [member.worker_id for member in members]
        for member, value in zip(members, (1e-3, 1.1e-3, 1.0)):
            push(coordinator, member, deltas_of(coordinator, value), 100)
        assert coordinator.version == 1
        status = coordinator.status()
        closed = status.rounds[-2]
        assert (closed.version, closed.clipped, closed.dropped) == (0, 1, 0)
        assert closed.aggregation.startswith("clipped_mean: reference norm") and "1 of 3 flagged" in closed.aggregation
        big = next(w for w in status.workers if w.worker_id == ids[2])
        assert (big.clipped_updates, big.outlier_rounds) == (1, 1) and big.outlier.startswith("round 0: clipped: norm")
        events = read_state(tmp_path, lambda store: store.events("clipped", "dropped"))
        assert [(e.worker_id, e.kind) for e in events] == [(ids[2], "clipped")]
        assert coordinator.store.recent_rounds(5)[0].clipped == 1
        # `rcswarm status` and the dashboard show it.
        console = Console(file=io.StringIO(), width=400)
        status_cli.report(status, console)
        text = console.file.getvalue()
        assert "clipped / dropped" in text and "1 / 0" in text and "aggregation of round 0: clipped_mean" in text
        round_row = views.round_dict(closed)
        worker_row = views.worker_dict(big, {})
        assert (round_row["clipped"], round_row["dropped"], worker_row["clipped_updates"]) == (1, 0, 1)
        data = {**views.finite({"rounds": [round_row], "workers": [worker_row]})}
        rows = render._round_rows({"rounds": [{**data["rounds"][0], "run_id": "r"}]})
        assert rows[0][-3:] == (1, 0, closed.aggregation)
    finally:
        coordinator.close()


def test_a_dropped_direction_is_recorded_and_counts_towards_eviction(tmp_path):
    spec = tiny_spec(sync={"codec": "fp32", "min_reports": 4, "outlier_evict_after": 1, "outlier_window": 1})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path))
    try:
        members = [coordinator.join(pb.JoinRequest(worker_name=n)) for n in ("a", "b", "c", "flip")]
        generator = torch.Generator().manual_seed(10)
        common = {name: torch.randn(shape, generator=generator) * 1e-3 for name, shape in coordinator.shapes.items()}
        for member, sign in zip(members, (1.0, 1.0, 1.0, -1.0)):
            deltas = {name: sign * (t + 5e-4 * torch.randn(t.shape, generator=generator)) for name, t in common.items()}
            assert push(coordinator, member, deltas, 100).accepted
        assert coordinator.version == 1
        flip_id = members[3].worker_id
        status = coordinator.status()
        closed = status.rounds[-2]
        assert (closed.version, closed.clipped, closed.dropped) == (0, 0, 1)
        assert closed.aggregation.startswith("clipped_mean: reference norm") and "direction: 1 of 4 dropped" in closed.aggregation
        events = read_state(tmp_path, lambda store: store.events("dropped", "clipped", "evict"))
        assert [(e.worker_id, e.kind) for e in events] == [(flip_id, "dropped"), (flip_id, "evict")]
        assert events[0].reason.startswith("round 0: direction: cosine >= sync.min_cosine = 0 with 0 of the other 3 updates")
        assert events[1].reason.startswith("evicted: outlier in 1 of its last 1 rounds (dropped in round 0)")
        worker = next(w for w in status.workers if w.worker_id == flip_id)
        assert worker.dropped_updates == 1 and worker.outlier.startswith("round 0: dropped: direction:")
    finally:
        coordinator.close()


def test_an_update_over_the_automatic_norm_bound_is_dropped_with_its_reason(tmp_path):
    coordinator = SwarmCoordinator(tiny_spec(sync={"codec": "fp32"}), StateStore(tmp_path))
    try:
        member = coordinator.join(pb.JoinRequest(worker_name="a"))
        worker_id = member.worker_id
        bound = coordinator.closer.norm_bound[0]
        code, message = refusal(lambda: push(coordinator, member, deltas_of(coordinator, 1.0), 100))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message.startswith("update rejected: global L2 norm") and "the automatic sync.max_update_norm" in message
        assert f"{bound:.4g}" in message and "AdamW" in message
        assert [e.kind for e in read_state(tmp_path, lambda store: store.events()) if e.worker_id == worker_id][-1] == "dropped"
    finally:
        coordinator.close()


def test_a_restart_may_change_the_defences_and_keeps_the_reference_norms(tmp_path):
    spec = tiny_spec(sync={"codec": "fp32", "max_update_norm": 1e4})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path))
    push(coordinator, coordinator.join(pb.JoinRequest(worker_name="a")), deltas_of(coordinator, 1e-3), 100)
    norms = coordinator.closer.norm_history
    coordinator.close()
    again = SwarmCoordinator(tiny_spec(sync={"codec": "fp32", "aggregation": "centered_clip"}), StateStore(tmp_path))
    try:
        assert again.version == 1 and again.closer.norm_history == norms and len(norms) == 1
    finally:
        again.close()


def test_a_state_dir_from_before_the_counts_gets_them(tmp_path):
    db = sqlite3.connect(tmp_path / "state.sqlite")
    db.execute("CREATE TABLE rounds (version INTEGER PRIMARY KEY, opened_at REAL, closed_at REAL, reports INTEGER, "
               "tokens INTEGER, close_reason TEXT, update_norm REAL, param_sha256 TEXT, checkpoint TEXT)")
    db.execute("INSERT INTO rounds VALUES (0, 0.0, 1.0, 2, 64, 'old', 0.5, 'ab', 'v00000001.safetensors')")
    db.commit()
    db.close()
    reader = StateStore.open_read_only(tmp_path)
    assert reader.recent_rounds(5) == [RoundRecord(0, 0.0, 1.0, 2, 64, "old", 0.5, "ab", 0, 0, "")]
    assert reader.round_steps() == {}  # no steps recorded: the run step counts inner.steps for its rounds
    reader.close()
    store = StateStore(tmp_path)
    try:
        assert store.recent_rounds(5)[0].dropped == 0
        store.commit_version("run", 2, {"w": torch.zeros(2)}, {}, RoundRecord(1, 1.0, 2.0, 3, 96, "new", 0.1, "cd", 2, 1, "x"))
        assert store.recent_rounds(5)[-1] == RoundRecord(1, 1.0, 2.0, 3, 96, "new", 0.1, "cd", 2, 1, "x")
    finally:
        store.close()


@pytest.mark.slow
def test_honest_workers_are_never_refused_across_assignment_changes(start_coordinator):
    """Real workers (threads), the default int8 codec with error feedback, the automatic bounds and the direction
    check (3 workers: every round is checked), a schedule that changes seq_len and batch mid-run: nothing is
    refused, dropped, clipped or flagged."""
    spec = tiny_spec(run={"rounds": 6, "workers": 3}, data={"max_bytes": 300_000}, inner={"steps": 3},
                     sync={"min_reports": 3}, curriculum={"schedule": [[0, 16, 4], [6, 32, 2], [12, 8, 8]]})
    local = start_coordinator(spec)
    codes: dict[str, int] = {}
    workers = [Worker(WorkerOptions(local.target, device="cpu", name=f"h{i}", patience_s=30.0), TOKEN) for i in range(3)]
    threads = [threading.Thread(target=lambda w=w: codes.__setitem__(w.name, w.run())) for w in workers]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join(timeout=120)
        assert codes == {"h0": 0, "h1": 0, "h2": 0}
    finally:
        for w in workers:
            w.stop.set()
    wait_for(lambda: local.service.version == 6, 10, "the last round")
    assert read_state(local.state_dir, lambda store: store.events("dropped", "clipped", "evict")) == []
    rounds = read_state(local.state_dir, lambda store: store.rounds())
    assert (sum(r.clipped for r in rounds), sum(r.dropped for r in rounds)) == (0, 0)
    summaries = [r.aggregation for r in rounds]
    assert len(summaries) == 6 and all("direction: 0 of 3 dropped" in summary for summary in summaries)
    lengths = {row.seq_len for row in read_state(local.state_dir, lambda store: store.metric_rows()) if row.tokens > 0}
    assert sorted(lengths) == [8, 16, 32]
