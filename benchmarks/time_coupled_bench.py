"""The time-coupled influence of a worker that stays just under the clip limit every round (issue #31).

    python benchmarks/time_coupled_bench.py                  # 1 and 3 honest workers, 20 rounds
    python benchmarks/time_coupled_bench.py --honest 1 2 4 8 --rounds 30

Each round the coordinator's own close pieces run on the round's updates: `aggregation.aggregate` (the
direction check, then clipped_mean against the reference norm R of this round's and the last
`sync.reference_rounds` rounds' accepted norms, the history kept as `RoundCloser` keeps it) and
`outer.outer_step` (Nesterov, η = 0.7, μ = 0.9: the defaults until issue #28; the momentum is what couples rounds). Honest updates are synthetic and the same in
both runs: each is a shared drift direction u plus the worker's own noise (cosine with u about 0.7), norm 1
± 10 %, 2 × 10⁴ parameters; they do not depend on θ, so the two runs differ only by what the attacker adds.
The attacker pushes, every round, the largest update nothing flags: 0.99 × min(clip_factor × R, the hard
bound), R predicted as the coordinator will compute it (it knows the history: GetStatus shows the norms), with
the hard bound `sync.max_update_norm` at 2 × the largest honest norm (what the automatic bound is: twice what
honest inner steps can reach). Its direction, two attacks: "amplify", its own honest update; "steer", the same
fixed vector every round, half the honest drift and half a fixed direction orthogonal to it (cosine about 0.5
with every honest update, so the direction check keeps it), the component the outer momentum accumulates.

The table gives, per swarm size and attack, the ratio of the attacked run's outer step ‖θ_t − θ_{t−1}‖ to the
honest-only run's at round 1, 13 and the last, its largest, and how far θ ends from the honest run's θ in units of
the honest run's last step.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics

import torch

from rcswarm.config.runspec import OuterSection
from rcswarm.coordinator import aggregation
from rcswarm.sync import outer, tensor_stream

PARAMETERS = 20_000


def honest_updates(rounds: int, workers: int, seed: int) -> tuple[list[list[dict[str, torch.Tensor]]], torch.Tensor]:
    """updates[t][i]: worker i's update of round t, a shared unit drift plus its own noise, norm 1 ± 10 %; and the
    steering attack's fixed direction (half the drift, half a unit vector orthogonal to it)."""
    generator = torch.Generator().manual_seed(seed)
    drift = torch.randn(PARAMETERS, generator=generator)
    drift /= drift.norm()
    away = torch.randn(PARAMETERS, generator=generator)
    away -= float(away @ drift) * drift
    steer = drift + away / away.norm()
    rounds_of = []
    for _ in range(rounds):
        row = []
        for _ in range(workers):
            noise = torch.randn(PARAMETERS, generator=generator)
            delta = drift + noise / noise.norm()
            delta *= (0.9 + 0.2 * float(torch.rand(1, generator=generator))) / float(delta.norm())
            row.append({"w": delta.clone()})
        rounds_of.append(row)
    return rounds_of, steer


# The hard bound on an update's norm (sync.max_update_norm): twice the largest honest norm, as the automatic one.
HARD_BOUND = 2.0 * 1.1


def attacker_norm(honest_norms: list[float], history: list[float], factor: float) -> float:
    """0.99 × the limit the round will have with the attacker's own norm in it: the hard bound, or the clip
    limit, a fixed point of x = c · median(this round's norms with x, history)."""
    x = factor * statistics.median(honest_norms + history)
    for _ in range(50):
        x = min(factor * aggregation.reference_norm([*honest_norms, x], history), HARD_BOUND)
    return 0.99 * x


def run(updates: list[list[dict[str, torch.Tensor]]], attack: str | None, reference_rounds: int,
        steer: torch.Tensor) -> tuple[list[float], torch.Tensor]:
    """Outer steps' norms of one run (attack None: honest only), and its last θ."""
    options = aggregation.AggregationOptions()
    outer_options = OuterSection(lr=0.7, momentum=0.9, nesterov=True)
    params = {"w": torch.zeros(PARAMETERS)}
    momentum = {"w": torch.zeros(PARAMETERS)}
    history: list[tuple[float, ...]] = []
    steps = []
    for row in updates:
        reports = [aggregation.Update(f"h{i}", 1000, tensor_stream.global_norm(d), d) for i, d in enumerate(row)]
        pool = [n for norms in history for n in norms]
        if attack is not None:
            direction = row[0]["w"] if attack == "amplify" else steer
            norm = attacker_norm([u.norm for u in reports], pool, options.clip_factor)
            deltas = {"w": direction * (norm / float(direction.norm()))}
            reports.append(aggregation.Update("attacker", 1000, tensor_stream.global_norm(deltas), deltas))
        result = aggregation.aggregate(reports, options, pool)
        assert not any(o.flagged for o in result.outcomes), [o.reason for o in result.outcomes if o.flagged]
        target, momentum = outer.outer_step(params, momentum, result.average, outer_options)
        steps.append(float((target["w"] - params["w"]).norm()))
        params = target
        history = [*history, result.accepted_norms][-reference_rounds:]
    return steps, params["w"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--honest", type=int, nargs="+", default=[1, 3], help="honest workers per round")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--reference-rounds", type=int, default=4, help="sync.reference_rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# {platform.machine()}, torch {torch.__version__}; {PARAMETERS} parameters, {args.rounds} rounds, "
          f"clipped_mean (clip_factor 2), reference_rounds {args.reference_rounds}, outer lr 0.7, momentum 0.9")
    print("| honest workers | attack | step ratio round 1 | round 13 | last | largest | ‖θ − θ_honest‖ / last honest step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for workers in args.honest:
        updates, steer = honest_updates(args.rounds, workers, seed=workers)
        honest, theta = run(updates, None, args.reference_rounds, steer)
        for attack in ("amplify", "steer"):
            attacked, attacked_theta = run(updates, attack, args.reference_rounds, steer)
            ratios = [a / h for a, h in zip(attacked, honest)]
            at13 = ratios[12] if len(ratios) > 12 else math.nan
            away = float((attacked_theta - theta).norm()) / honest[-1]
            print(f"| {workers} | {attack} | {ratios[0]:.2f} | {at13:.2f} | {ratios[-1]:.2f} | {max(ratios):.2f} | "
                  f"{away:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
