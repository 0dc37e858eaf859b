"""A digest record's step and θ norms are its publisher's word (the schema checks only finite and >= 0). `drift`
divided by the larger of two records' claims, so one record claiming steps of 1e30 (or θ norms of 1e30, through the
skipped-round floor) was within the tolerance of every replica, had the most neighbours, and was named the final
reference replica by every honest peer, which then loaded the state it served (a review, 2026-11-29). Now the unit is
the smaller claim of the two. No process is started; here as it imports hivemind (tests/deploy/test_layout.py)."""

from __future__ import annotations

import pytest
import torch

from rcswarm.config.runspec import HivemindSection

hs = pytest.importorskip("rcswarm.worker.hivemind_sync")

TOLERANCE = HivemindSection().drift_tolerance
SIZE = 4096


def theta_and_step() -> tuple[torch.Tensor, torch.Tensor]:
    """θ [SIZE] and the round's step [SIZE] that led to it, the same at every call."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(SIZE, generator=generator), 1e-2 * torch.randn(SIZE, generator=generator)


def honest_pair_and_cheat(field: str) -> tuple[dict, dict, dict]:
    """Two honest digests of one version a twentieth of a step apart, and a cheat's of a poisoned θ (zeros) that
    claims 1e30 in `field` ("steps": its step norms; "norms": its θ norms, with steps of 0, a skipped round)."""
    theta, step = theta_and_step()
    a = hs.digest_record("r", 5, {"w": theta}, {"w": step})
    b = hs.digest_record("r", 5, {"w": theta + 0.05 * step}, {"w": step})
    cheat = hs.digest_record("r", 5, {"w": torch.zeros(SIZE)}, None if field == "norms" else {"w": step})
    cheat[field] = [1e30] * hs.SKETCH_PARTS
    assert hs.record_problem(hs.DIGEST_KEY, cheat) == ""  # a record every DHT node stores
    return a, b, cheat


@pytest.mark.parametrize("field", ["steps", "norms"])
def test_a_record_claiming_huge_norms_is_not_named_the_final_reference(field: str) -> None:
    a, b, cheat = honest_pair_and_cheat(field)
    digests = {"QmA": a, "QmB": b, "Qm1cheat": cheat}  # the cheat's id sorts first: a tie names it
    named = {hs.final_reference(me, digests[me], {peer: r for peer, r in digests.items() if peer != me}, TOLERANCE)
             for me in ("QmA", "QmB")}
    assert named == {"QmA"}
    assert hs.drift(a, b) < TOLERANCE < min(hs.drift(a, cheat), hs.drift(cheat, b))


@pytest.mark.parametrize("field", ["steps", "norms"])
def test_a_record_claiming_huge_norms_keeps_no_drifted_peer_from_its_resync(field: str) -> None:
    """Within the tolerance of every replica, the cheat was one more of a drifted peer's cluster, as large as the
    honest majority's then, and its id, sorting first, kept the drifted peer on its own replica."""
    a, b, cheat = honest_pair_and_cheat(field)
    theta, step = theta_and_step()
    drifted = hs.digest_record("r", 5, {"w": theta - step}, {"w": step})  # a round's step off the pair
    reason = hs.resync_reason("QmD", drifted, {"QmA": a, "QmB": b, "Qm1cheat": cheat}, TOLERANCE)
    assert reason.startswith("drift") and "from 2 of 4 peers" in reason, reason


def test_drift_is_symmetric_and_in_the_smaller_claims_steps() -> None:
    """Every peer that sees the same digests measures the same drifts (so all name one reference): the unit is the
    smaller of the two records' step norms, whichever is measured against which."""
    theta, step = theta_and_step()
    a = hs.digest_record("r", 5, {"w": theta}, {"w": step})
    b = hs.digest_record("r", 5, {"w": theta + 0.5 * step}, {"w": 2 * step})  # half a step off, twice its step
    assert hs.drift(a, b) == hs.drift(b, a)
    assert hs.drift(a, b) == pytest.approx(hs.drift(a, {**b, "steps": a["steps"]}))


def test_a_skipped_round_reads_about_one_step_from_the_round_applied() -> None:
    """A record of a skipped round claims step norms of 0: it is measured in the other record's step (the smaller
    claim, 0, would make the unit the 1e-7 × θ floor and a missed round read ~1e5 steps)."""
    theta, step = theta_and_step()
    applied = hs.digest_record("r", 5, {"w": theta}, {"w": step})
    skipped = hs.digest_record("r", 5, {"w": theta - step}, None)
    as_if_applied = {**skipped, "steps": applied["steps"]}
    assert hs.drift(applied, skipped) == hs.drift(skipped, applied) == hs.drift(applied, as_if_applied)
    assert hs.drift(applied, skipped) < 10.0  # max over parts of |sum of a random step| / its norm
