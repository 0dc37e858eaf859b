"""The hivemind backend's limits on one peer's influence and its clock check (issue #31, point 6).

* Weights: every reducer counts a groupmate's weight (its claimed tokens) at most the run's batch × seq_len ×
  inner.steps, as the coordinator backend bounds a push's tokens; real averagers in this process.
* Direction: an averaged Δ̄ pointing away from a peer's own Δ is refused like an oversized one.
* The issue's attack, a peer claiming 1,000× the tokens with its Δ flipped and × 3.5 (before: honest loss 4.9 → 131
  in 6 rounds, undetected), by a subclass of the real HivemindWorker in a swarm of real processes (wide).
* Clocks: a peer whose clock is an hour off stops with one line naming the skew, not hivemind's traceback (wide).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from rcswarm.config.runspec import HivemindSection
from tests.helpers.processes import logs_of
from tests.helpers.specs import hivemind_spec

hs = pytest.importorskip("rcswarm.worker.hivemind_sync")
from rcswarm.worker import hivemind_worker  # noqa: E402

# ---- pure parts ---------------------------------------------------------------------------------


def test_the_clock_check_names_the_skew() -> None:
    now = 1_800_000_000.0
    close = hs.ClockSample("QmA", now, now + 2.5, now + 0.01, True)
    assert hs.clock_problem([close]) == ""
    ahead = hs.ClockSample("QmB", now, now - 3600.0, now + 0.004, True)
    problem = hs.clock_problem([close, ahead])
    assert "3,600.0 s ahead of peer QmB's" in problem and "4 ms round trip" in problem
    assert 'local time must be within 3 seconds' in problem and "\n" not in problem
    behind = hs.clock_problem([hs.ClockSample("QmC", now, now + 10.0, now + 0.002, True)])
    assert "10.0 s behind peer QmC's" in behind


def test_the_trust_check_refuses_an_average_pointing_away() -> None:
    local = [torch.ones(10), torch.ones(3)]
    flipped = [t * -0.5 for t in local]
    assert "points away from the local one (cosine -1.000 < hivemind.min_cosine 0)" in hs.trust_problem(flipped, local)
    assert hs.trust_problem(flipped, local, min_cosine=-1.0) == ""
    honest = [local[0] + 0.5 * torch.randn(10), local[1]]
    assert hs.trust_problem(honest, local) == ""
    with pytest.raises(ValueError, match="hivemind.min_cosine"):
        HivemindSection(min_cosine=1.0)


def test_a_rounds_token_bound_is_its_largest_assignment() -> None:
    spec = hivemind_spec()
    assert hivemind_worker.round_token_bound(spec, 0) == 4 * 32 * 5
    schedule = hivemind_spec(curriculum={"schedule": [[0, 32, 4], [10, 64, 4]]})
    assert hivemind_worker.round_token_bound(schedule, 0) == 4 * 32 * 5  # run steps 0..5: the first row
    assert hivemind_worker.round_token_bound(schedule, 1) == 4 * 64 * 5  # the next version's row starts at 10
    per_worker = hivemind_spec(curriculum={"worker_seq_lens": [16, 48]})
    assert hivemind_worker.round_token_bound(per_worker, 0) == 4 * 48 * 5
    assert hivemind_worker.round_token_bound(hivemind_spec(sync={"backend": "hivemind", "bound_tokens": False}), 0) \
        == math.inf


# ---- real averagers -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_groupmate_claiming_more_tokens_is_counted_at_the_bound(no_new_p2pd: None) -> None:
    """A (a reducer) bounds every weight to 1,000; B, in client mode (A reduces every part), claims 10⁹ tokens and
    bounds nothing itself. Both get (640 Δa + 1,000 Δb) / 1,640; unbounded it would be Δb within 10⁻⁶."""
    torch.manual_seed(5)
    shapes = [(300,), (20, 10)]
    deltas = [[torch.randn(s) for s in shapes] for _ in range(2)]
    state = ({"run": "w", "version": 0}, [])
    honest = hs.HivemindPeer("w", shapes, "fp32", 256, hs.HivemindOptions.loopback(), lambda: state)
    cheat = None
    results: dict[int, Any] = {}
    try:
        cheat = hs.HivemindPeer("w", shapes, "fp32", 256,
                                hs.HivemindOptions.loopback(hs.visible_maddrs(honest.dht), client_mode=True),
                                lambda: state)
        calls = [(honest, 640, 1000.0), (cheat, 10**9, math.inf)]
        threads = [threading.Thread(target=lambda i=i, p=p, n=n, b=b: results.__setitem__(i, p.average(
            deltas[i], n, {"version": 0, "tokens": n}, max_tokens=b))) for i, (p, n, b) in enumerate(calls)]
        [t.start() for t in threads]
        [t.join(timeout=120) for t in threads]
    finally:
        for peer in (honest, cheat):
            if peer is not None:
                peer.shutdown()
    want = [(640 * a + 1000 * b) / 1640 for a, b in zip(*deltas)]
    for i in (0, 1):
        assert results.get(i) is not None, results
        for got, expected in zip(results[i].deltas, want):
            assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6), float((got - expected).abs().max())


# ---- real peers ---------------------------------------------------------------------------------

CHEAT = """
import math
import sys
from rcswarm.cli import worker
from rcswarm.worker import hivemind_sync as hs
from rcswarm.worker import hivemind_worker

average = hs.HivemindPeer.average


def claim(self, deltas, tokens, gather, window_s=None, max_tokens=math.inf, **rest):
    # 1,000 times its tokens, and no bound on anyone's weight in the parts it reduces itself.
    return average(self, deltas, tokens * 1000, {**gather, "tokens": tokens * 1000}, window_s, math.inf, **rest)


class Cheat(hivemind_worker.HivemindWorker):
    def pseudo_gradient(self, base):
        return [d * -3.5 for d in super().pseudo_gradient(base)]


hs.HivemindPeer.average = claim
hivemind_worker.HivemindWorker = Cheat
sys.exit(worker.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.wide
def test_a_peer_claiming_1000x_tokens_with_a_flipped_update_is_bounded(swarm: Any, tmp_path: Path) -> None:
    """Two honest peers and the cheat, 6 rounds, fp32: the honest peers count the cheat's weight at the bound, and
    refuse every average it turned against their own Δ; their loss never rises (before: 4.9 → 131)."""
    spec = hivemind_spec(run={"name": "hm", "rounds": 6}, sync={"backend": "hivemind", "codec": "fp32"},
                         hivemind={"initial_allreduce_s": 160.0, "min_allreduce_s": 60.0})
    peers = swarm(spec)
    script = tmp_path / "cheat.py"
    script.write_text(CHEAT)
    honest = [peers.worker("a"), peers.worker("b")]
    cheat = peers.worker("c", script=script)
    peers.wait(honest, timeout=300)
    peers.wait([cheat], timeout=120)
    for proc, name in zip(honest, ("a", "b")):
        history = peers.summary(name)["history"]
        losses = [h["loss"] for h in history]
        # Bounded: at worst the cheat's rounds are skipped (θ stays), never driven up.
        assert all(math.isfinite(x) for x in losses) and max(losses) < losses[0] + 0.5, (name, history)
        with_cheat = [h for h in history if h["group"] == 3]
        assert with_cheat, history
        assert all("points away" in h["skipped"] or "exceeds" in h["skipped"] for h in with_cheat), history
        assert all(torch.isfinite(t).all() for t in peers.params(name).values())
    text = "".join(Path(p.log_path).read_text() for p in honest)
    assert "claimed the weight" in text, logs_of(honest)


SKEWED = """
import sys
import time

real = time.time
time.time = lambda: real() + 3600.0  # before hivemind binds its clock: the whole process is an hour ahead

from rcswarm.cli import worker

sys.exit(worker.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.wide
def test_a_peer_an_hour_ahead_stops_with_one_line_naming_the_skew(swarm: Any, tmp_path: Path) -> None:
    peers = swarm(hivemind_spec())
    script = tmp_path / "skewed.py"
    script.write_text(SKEWED)
    skewed = peers.worker("late", script=script)
    assert skewed.wait(timeout=120) == 1, logs_of([skewed])
    text = Path(skewed.log_path).read_text()
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "clock is 3,6" in errors[0] and "s ahead of peer" in errors[0], text
    assert "Traceback" not in text and "local time must be within 3 seconds" in errors[0]

