"""The hivemind sync backend (#17): codecs, records, drift, trust, and real peers on loopback.

Every peer listens and announces on 127.0.0.1 only (explicit multiaddrs, no relays, no NAT
traversal, no public bootstrap) and every test stops its DHTs, averagers and p2pd processes
itself; `no_new_p2pd` asserts none is left. The default suite runs two real swarms (three workers
and a bootstrap peer mirroring metrics, 5 rounds; two workers with a coordinator assigning their
lengths, 2 rounds); the longer scenarios are `wide`.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from rcswarm.cli import worker as worker_cli
from rcswarm.config.runspec import HivemindSection, OuterSection, RunSpec
from rcswarm.coordinator.resume import initial_parameters
from rcswarm.sync import codec as codecs
from rcswarm.sync import outer
from tests.helpers.hivemind import (
    PATIENT,
    REPLICA_TOLERANCE_PER_ROUND,
    RULES,
    assert_replicas_agree,
    run_whole,
)
from tests.helpers.processes import logs_of, worker_env
from tests.helpers.specs import hivemind_spec, tiny_spec, write_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for

hs = pytest.importorskip("rcswarm.worker.hivemind_sync")
from hivemind.compression.serialization import deserialize_torch_tensor  # noqa: E402
from hivemind.dht.protocol import DHTProtocol  # noqa: E402
from hivemind.dht.routing import DHTID  # noqa: E402
from hivemind.dht.validation import DHTRecord  # noqa: E402

from rcswarm.worker import hivemind_worker  # noqa: E402

# ---- pure parts ---------------------------------------------------------------------------------


def test_sync_backend_is_validated() -> None:
    assert hivemind_spec().sync.backend == "hivemind"
    assert RunSpec().sync.backend == "coordinator"
    with pytest.raises(ValueError, match=r"sync.backend = 'p2p' is invalid: expected one of \('coordinator', 'hivemind'\)"):
        tiny_spec(sync={"backend": "p2p"})


def test_both_backends_share_one_outer_step() -> None:
    from rcswarm.coordinator import close
    from rcswarm.worker import hivemind_worker

    assert hivemind_worker.outer_step is outer.outer_step
    assert close.outer is outer


@pytest.mark.parametrize("codec", ["bf16", "int8"])
def test_rcswarm_codecs_travel_as_hivemind_compression(codec: str) -> None:
    torch.manual_seed(0)
    tensor = torch.randn(1000) * 3  # [1000]
    compression = hs.compression_for(codec, 64)
    message = compression.compress(tensor, hs.CompressionInfo.from_tensor(tensor))
    decoded = deserialize_torch_tensor(message)  # hivemind's own table decodes it
    want = codecs.decode(codecs.encode(tensor, codecs.codec_from_name(codec), 64), codecs.codec_from_name(codec), (1000,), 64)
    assert torch.equal(decoded, want)
    assert len(message.buffer) == 4 + codecs.encoded_size(1000, codecs.codec_from_name(codec), 64)
    message.buffer = message.buffer[:2]
    with pytest.raises(ValueError, match="expected a 4-byte block size"):
        deserialize_torch_tensor(message)
    with pytest.raises(ValueError, match="sync.codec = 'fp8'"):
        hs.compression_for("fp8", 64)


@pytest.mark.parametrize("bits", codecs.LOWBIT_VALUE_BITS)
def test_the_lowbit_codec_travels_as_hivemind_compression_with_its_bits(bits: int) -> None:
    torch.manual_seed(1)
    tensor = torch.randn(1000) * 3  # [1000]
    fmt = codecs.WireFormat(codecs.codec_from_name("lowbit"), 64, 0, bits)
    message = hs.compression_for("lowbit", 64, bits).compress(tensor, hs.CompressionInfo.from_tensor(tensor))
    decoded = deserialize_torch_tensor(message)  # hivemind's own table decodes it, whatever bits it registered
    assert torch.equal(decoded, codecs.decode(codecs.encode(tensor, fmt), fmt, (1000,)))
    assert len(message.buffer) == 5 + codecs.encoded_size(1000, fmt) < 1000 * (bits + 1) / 8
    message.buffer = message.buffer[:4] + bytes([3]) + message.buffer[5:]
    with pytest.raises(ValueError, match="value_bits in"):
        deserialize_torch_tensor(message)


def _record(field: str, subkey: str, value: Any) -> DHTRecord:
    key = DHTID.generate(source=f"{hs.RECORD_PREFIX}_{field}").to_bytes()
    dumps = DHTProtocol.serializer.dumps
    return DHTRecord(key=key, subkey=dumps(subkey), value=dumps(value), expiration_time=0.0)


def test_records_are_checked_by_a_msgpack_schema() -> None:
    validator = hs.record_validator()
    good = hs.digest_record("hm", 3, {"w": torch.ones(40)})
    assert validator.validate(_record("digest", "peer", good))
    for bad in ({**good, "version": 3.0}, {**good, "version": -1}, {**good, "sha256": "xyz"},
                {**good, "sums": good["sums"][:3]}, {**good, "extra": 1}, {k: v for k, v in good.items() if k != "run"}):
        assert not validator.validate(_record("digest", "peer", bad)), bad
    rows = [[0.0, 1.0, 2.5, 128.0, 0.1, 0.1, 0.0, 32.0, 4.0]]
    assert validator.validate(_record("metrics", "peer", {"run": "hm", "name": "a", "rows": rows}))
    assert not validator.validate(_record("metrics", "peer", {"run": "hm", "name": "a", "rows": [[1, 2]]}))
    # Bytes that msgpack does not decode (e.g. a pickle) are refused, not unpickled.
    pickled = DHTRecord(key=_record("digest", "p", good).key, subkey=DHTProtocol.serializer.dumps("p"),
                        value=b"\x80\x04\x95", expiration_time=0.0)
    assert not validator.validate(pickled)


def test_drift_tells_rounding_from_a_missed_round() -> None:
    torch.manual_seed(1)
    theta = {"w": torch.randn(4096)}
    step = {"w": 0.01 * torch.randn(4096)}
    ulp = {"w": theta["w"] + theta["w"].abs() * 2**-23 * torch.sign(torch.randn(4096))}
    missed = {"w": theta["w"] - step["w"]}
    # A partial all-reduce (a reducer died): 1% of θ, contiguous, kept each peer's own Δ.
    partial = {"w": theta["w"].clone()}
    partial["w"][:40] -= 2 * step["w"][:40]
    mine, same, other, torn = (hs.digest_record("hm", 5, p, step) for p in (theta, ulp, missed, partial))
    assert hs.drift(mine, mine) == 0.0
    assert 0 < hs.drift(mine, same) < 1e-3 < RULES.drift_tolerance < 0.5 < min(hs.drift(mine, other), hs.drift(mine, torn))
    assert hs.resync_reason("p2", mine, {}) == ""
    # Two peers apart: the one without the smallest peer id re-syncs, the other keeps its state.
    assert hs.resync_reason("p2", mine, {"p1": other}).startswith("drift")
    assert hs.resync_reason("p1", other, {"p2": mine}) == ""
    # A majority wins whatever the ids.
    assert hs.resync_reason("p1", other, {"p2": mine, "p3": same}).startswith("drift")
    assert hs.resync_reason("p2", mine, {"p1": other, "p3": same}) == ""
    assert hs.resync_reason("p2", mine, {"p1": {**same, "version": 6}}) == "behind: version 5 < 6"
    assert hs.resync_reason("p2", {**mine, "version": 7}, {"p1": other}) == ""


def test_a_group_names_one_reference_replica_and_a_loaded_state_must_be_it() -> None:
    """At the last version every peer names the same reference (most peers within tolerance, then the smallest
    id), and a loaded state counts as the reference's only with its sha256 and the sketch judged against the group."""
    torch.manual_seed(2)
    theta = {"w": torch.randn(4096)}
    step = {"w": 0.01 * torch.randn(4096)}
    near = {"w": theta["w"] + 0.05 * step["w"]}
    far = {"w": theta["w"] - step["w"]}
    a, b, c = (hs.digest_record("hm", 9, p, step) for p in (theta, near, far))
    digests = {"p1": c, "p2": a, "p3": b}
    named = {hs.final_reference(pid, digests[pid], {q: r for q, r in digests.items() if q != pid}) for pid in digests}
    assert named == {"p2"}  # p2 and p3 agree (two neighbours each); p1 is alone; p2 < p3
    assert hs.final_reference("p9", a, {}) == "p9"
    assert hs.same_replica(hs.digest_record("hm", 9, theta, None) | {"steps": a["steps"]}, a)
    assert not hs.same_replica(b, a)
    # A peer that publishes one θ's sketch with another θ's sha256 is not the replica it claims.
    assert not hs.same_replica(hs.digest_record("hm", 9, theta, step), {**b, "sha256": a["sha256"]})


def test_trust_check_refuses_non_finite_and_oversized_averages() -> None:
    local = [torch.ones(10), torch.ones(3)]
    assert hs.trust_problem([t * 0.5 for t in local], local) == ""
    assert "non-finite" in hs.trust_problem([torch.full((10,), float("nan")), torch.ones(3)], local)
    assert "exceeds 4 ×" in hs.trust_problem([t * 1e3 / 3 for t in local], local)


def test_timeouts_are_derived_from_measured_all_reduce_times() -> None:
    timer = hs.RoundTimer(matchmaking_s=2.0)
    assert timer.allreduce_timeout() == RULES.initial_allreduce_s
    timer.record(0.2)
    assert timer.allreduce_timeout() == RULES.min_allreduce_s
    timer.record(8.0)
    assert timer.allreduce_timeout() == pytest.approx(24.0)
    # hivemind's sender and reducer timeouts fit inside it: a peer dead mid-all-reduce is dropped in time.
    assert (timer.sender_timeout(), timer.reducer_timeout()) == pytest.approx((6.0, 12.0))
    assert timer.step_timeout() == pytest.approx(28.0)
    timer.train_s = 1.5  # groupmates training up to 3 × as long as this peer are waited for
    assert timer.group_wait() == pytest.approx(4.0 + 4.5) and timer.step_timeout() == pytest.approx(32.5)
    assert "median 4.10s, max 8.00s of 2" in timer.describe()
    for _ in range(RULES.timer_window):
        timer.record(1.0)
    assert timer.allreduce_timeout() == RULES.min_allreduce_s  # the slow round left the window


def test_the_rules_of_a_hivemind_section_change_the_checks_and_timeouts() -> None:
    """Non-default [hivemind] values change what trust_problem, resync_reason and RoundTimer answer."""
    local = [torch.ones(10), torch.ones(3)]
    thrice = [t * 3 for t in local]
    assert hs.trust_problem(thrice, local, RULES.trust_factor) == ""
    assert "exceeds 2 ×" in hs.trust_problem(thrice, local, HivemindSection(trust_factor=2.0).trust_factor)
    torch.manual_seed(1)
    theta, step = {"w": torch.randn(4096)}, {"w": 0.01 * torch.randn(4096)}
    half = {"w": theta["w"] - 0.5 * step["w"]}  # half a round apart
    mine, other = hs.digest_record("hm", 5, theta, step), hs.digest_record("hm", 5, half, step)
    assert RULES.drift_tolerance < hs.drift(mine, other) < 2.0
    assert hs.resync_reason("p2", mine, {"p1": other}, RULES.drift_tolerance).startswith("drift")
    assert hs.resync_reason("p2", mine, {"p1": other}, HivemindSection(drift_tolerance=2.0).drift_tolerance) == ""
    rules = HivemindSection(timeout_factor=5.0, timer_window=2, min_allreduce_s=4.0, initial_allreduce_s=9.0)
    timer = hs.RoundTimer(matchmaking_s=2.0, rules=rules)
    assert timer.allreduce_timeout() == 9.0
    timer.record(0.2)
    assert timer.allreduce_timeout() == 4.0
    timer.record(2.0)
    assert timer.allreduce_timeout() == pytest.approx(10.0)
    timer.train_s = 1.0
    assert timer.group_wait() == pytest.approx(4.0 + 5.0)
    timer.record(0.1)
    timer.record(0.1)
    assert timer.allreduce_timeout() == 4.0  # a window of 2: the 2 s all-reduce left it


def test_a_run_specs_hivemind_rules_reach_the_workers_trust_check() -> None:
    """A trust_factor set in the run spec decides the worker's outer step (no peer needed: _step is the check)."""
    def stepped(trust_factor: float) -> str:
        spec = hivemind_spec(hivemind={"trust_factor": trust_factor})
        worker = hivemind_worker.HivemindWorker(spec, hs.HivemindOptions.loopback())
        base = worker._params()
        deltas = [0.01 * torch.ones_like(t) for t in base]
        return worker._step(base, deltas, [3 * d for d in deltas])

    assert stepped(4.0) == ""
    assert "exceeds 2.5 ×" in stepped(2.5)


def test_bad_hivemind_flags_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--initial-peers '127.0.0.1:5': expected a multiaddr"):
        hs.HivemindOptions(initial_peers=("127.0.0.1:5",))
    with pytest.raises(ValueError, match="--client-mode needs --initial-peers"):
        hs.HivemindOptions(client_mode=True)
    assert worker_cli.main(["--backend", "hivemind"]) == 2
    assert "needs --config RUN.toml" in capsys.readouterr().err
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    assert worker_cli.main(["--backend", "hivemind", "--config", str(config)]) == 2
    assert 'needs sync.backend = "hivemind"' in capsys.readouterr().err
    assert worker_cli.main([]) == 2
    assert "--coordinator HOST:PORT is required" in capsys.readouterr().err
    per_worker = write_spec(hivemind_spec(curriculum={"worker_seq_lens": [16, 48]}), tmp_path / "lengths.toml")
    assert worker_cli.main(["--backend", "hivemind", "--config", str(per_worker)]) == 2
    assert "curriculum.worker_seq_lens = [16, 48]: a hivemind worker needs --coordinator" in capsys.readouterr().err


# ---- real peers ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_three_peers_train_average_and_agree(swarm: Any) -> None:
    # Rules of the [hivemind] table off their defaults reach every peer through RUN.toml (logged at start-up).
    spec = hivemind_spec(run={"name": "hm", "rounds": 5}, hivemind={**PATIENT, "trust_factor": 5.0})
    names = ["a", "b", "c"]
    # A fresh swarm's first all-reduce sometimes loses one link for its whole sender timeout on this 2-core VM
    # (about one run in four; docs/RELIABILITY.md, "The three-peer test"): the peer falls behind a run whose others
    # finish, or tears a round. That signature alone (one of the first two rounds in less than the whole group, or
    # torn) starts the scenario once more in a fresh swarm; a second occurrence, or any other failure, fails the test.
    peers, workers = run_whole(swarm, spec, names, 240)
    logs = {name: Path(proc.log_path).read_text() for name, proc in zip(names, workers)}
    for text in logs.values():
        assert "hivemind rules: trust_factor 5, min_cosine 0, drift_tolerance 0.25," in text and "all-reduce timeout 160.0s" in text
    summaries = [peers.summary(name) for name in names]
    for name, summary in zip(names, summaries):
        history = summary["history"]
        assert [h["version"] for h in history] == [1, 2, 3, 4, 5] and summary["version"] == 5
        # Every round whole but at most one (the stall above later in a run: a partial group, a round skipped
        # locally, or a torn one, survived). Whole: averaged in the group of 3, and the replicas within about twice
        # the tolerance (the re-sync rule, `_publish`, bounds each one's drift from its group's majority by the
        # tolerance; one peer's drift from another above the tolerance alone is allowed: the reducers' int8 replies
        # carry no error feedback, and 0.24-0.33 of a step was seen between two peers while the third stayed within
        # 0.25 of both).
        degraded = [h for h in history if h["group"] != 3 or h["skipped"] or h["drift"] > 2 * RULES.drift_tolerance]
        assert len(degraded) <= 1, [(h["version"], h["group"], h["skipped"], h["drift"]) for h in history]
        assert history[-1]["loss"] < history[0]["loss"] - 0.5, history  # the loss falls
    # At the last version the group settles on one replica (`_settle`): the three end bit-identical.
    worst = assert_replicas_agree(peers, names, 0.0)
    assert all(s["history"][-1]["settled_drift"] == 0.0 for s in summaries)
    print(f"replicas: max |Δθ| {worst:.3g}, drift per round {[h['drift'] for h in summaries[0]['history']]}")
    # The bootstrap peer mirrored every training row of every worker into a state dir.
    state = peers.tmp / "state"
    want = len(names) * spec.run.rounds * spec.inner.steps
    wait_for(lambda: sum(r.tokens > 0 for r in read_state(state, lambda store: store.metric_rows())) >= want, 20, "the mirror")
    every = read_state(state, lambda store: store.metric_rows())
    rows = [(w, sum(r.worker_id == w for r in every), max(r.version for r in every if r.worker_id == w))
            for w in sorted({r.worker_id for r in every})]
    assert [(w.split("@")[0], n, v) for w, n, v in rows] == [(name, 25, 4) for name in names]


@pytest.mark.wide
def test_three_peers_train_with_the_4_bit_lowbit_codec(swarm: Any) -> None:
    """Issue #28: the most compact codec hivemind's all-reduce carries (4-bit blockwise, 7.5× below fp32, with the
    workers' error feedback): the loss falls, and replicas differ by the 4-bit error of the reducers' replies (no
    error feedback on that path): measured 0.15-0.37 of a step per round (int8: under 0.1), so a peer past the
    0.25 drift tolerance re-syncs. Before the run's block size and bits reached the replies (`use_in_replies`) they
    went out at the table's default 2 bits and replicas drifted by 0.7-1.8 steps a round. Drift is in units of one
    outer step: these figures are the Nesterov step's (η 0.7, μ 0.9), pinned here; under today's default, plain
    averaging, a step is smaller than Nesterov's and the same codec error a larger share of it (one run: a drift
    of 0.6 or more at some version, so more re-syncs). The bounds: the median drift below 0.45 (the 2-bit regression
    sat at 0.7 and above every round) and none at 1.0 (a tail of 0.6 was seen once in a run at these settings)."""
    spec = hivemind_spec(run={"name": "hm", "rounds": 4}, hivemind=PATIENT,
                         sync={"backend": "hivemind", "codec": "lowbit", "value_bits": 4},
                         outer={"lr": 0.7, "momentum": 0.9, "nesterov": True})
    names = ["a", "b", "c"]
    # The known stall of a fresh swarm's first all-reduce (as in the three-peer test above) left one peer 60 s late
    # in its first round in CI on 2026-11-27, behind a run whose others had finished: the scenario starts once more.
    # Torn here is a drift above 1.0 (the bound below): 4-bit drift alone reached 0.71 in a first round.
    peers, _ = run_whole(swarm, spec, names, 240, torn_drift=1.0)
    drifts = []
    for name in names:
        history = peers.summary(name)["history"]
        assert peers.summary(name)["version"] == 4 and history[-1]["loss"] < history[0]["loss"] - 0.3, history
        drifts += [h["drift"] for h in history if h["drift"] is not None]
    assert drifts and statistics.median(drifts) < 0.45 and max(drifts) < 1.0, drifts
    worst = assert_replicas_agree(peers, names, 4 * 20 * REPLICA_TOLERANCE_PER_ROUND, drift=False)
    print(f"lowbit 4-bit replicas: max |Δθ| {worst:.3g}, drift per round {sorted(drifts)}")


@pytest.mark.slow
@pytest.mark.wide
def test_averaging_equals_the_coordinators_round_within_codec_error(no_new_p2pd: None) -> None:
    """Two in-process peers average Δ_a, Δ_b by tokens; the shared outer step then gives the coordinator's θ_1."""
    torch.manual_seed(3)
    shapes = [(300,), (20, 10)]
    theta = {"w": torch.randn(300), "m": torch.randn(20, 10)}
    deltas = [{k: 0.01 * torch.randn_like(v) for k, v in theta.items()} for _ in range(2)]
    tokens = [640, 1920]
    options = OuterSection(lr=0.7, momentum=0.9, nesterov=True)
    zeros = {k: torch.zeros_like(v) for k, v in theta.items()}
    target, _ = outer.outer_step(theta, zeros, outer.weighted_average(list(zip(tokens, deltas))), options)
    state = ({"run": "eq", "version": 0}, [])
    first = hs.HivemindPeer("eq", shapes, "int8", 256, hs.HivemindOptions.loopback(), lambda: state)
    second = None
    try:
        second = hs.HivemindPeer("eq", shapes, "int8", 256, hs.HivemindOptions.loopback(hs.visible_maddrs(first.dht)), lambda: state)
        results: dict[int, Any] = {}
        threads = [threading.Thread(target=lambda i=i, p=p: results.__setitem__(i, p.average(
            list(deltas[i].values()), tokens[i], {"version": 0, "tokens": tokens[i]}))) for i, p in enumerate((first, second))]
        [t.start() for t in threads]
        [t.join(timeout=120) for t in threads]
    finally:
        for peer in (first, second):
            if peer is not None:
                peer.shutdown()
    for i in (0, 1):
        assert results[i] is not None and sorted(g["tokens"] for g in results[i].gathered) == tokens
        mine, _ = outer.outer_step(theta, zeros, dict(zip(theta, results[i].deltas)), options)
        for name in theta:
            # int8: |error| ≤ absmax/254 per sent part and per returned average, times η (1 + μ) = 1.33.
            bound = 2 * 1.33 * max(float(d[name].abs().max()) for d in deltas) / 254 + 1e-6
            assert float((mine[name] - target[name]).abs().max()) <= bound


CHEAT = """
import sys
import torch
from rcswarm.cli import worker
from rcswarm.worker import hivemind_worker

MODE = {mode!r}

class Cheat(hivemind_worker.HivemindWorker):
    def pseudo_gradient(self, base):
        deltas = super().pseudo_gradient(base)
        if MODE == "nan":
            deltas[0][0] = float("nan")
            return deltas
        return [d * 1e3 for d in deltas]

hivemind_worker.HivemindWorker = Cheat
sys.exit(worker.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.wide
@pytest.mark.parametrize("mode", ["nan", "scaled"])
def test_a_peer_sending_nan_or_a_huge_update_reaches_no_honest_theta(swarm: Any, tmp_path: Path, mode: str) -> None:
    """The cheat's Δ enters the all-reduce; the honest peers' trust check refuses the average and skips the step."""
    spec = hivemind_spec(run={"name": "hm", "rounds": 2}, sync={"backend": "hivemind", "codec": "fp32"})
    peers = swarm(spec)
    script = tmp_path / "cheat.py"
    script.write_text(CHEAT.format(mode=mode))
    honest = [peers.worker("a"), peers.worker("b")]
    cheat = peers.worker("c", script=script)
    peers.wait(honest, timeout=200)
    peers.wait([cheat], timeout=60)
    histories = {name: peers.summary(name)["history"] for name in ("a", "b")}
    for name, history in histories.items():
        # Every average the cheat took part in was refused, and no NaN reached θ.
        assert all(h["skipped"] for h in history if h["group"] == 3), history
        assert all(torch.isfinite(t).all() for t in peers.params(name).values())
        # hivemind's matchmaking may leave one honest peer out of one round under load (seen once in CI:
        # its groupmates counted it, it found "no group" and stepped alone); at most once.
        assert sum(h["group"] < 3 for h in history) <= 1, history
    clean = [name for name, history in histories.items() if all(h["group"] == 3 for h in history)]
    assert clean, histories
    # A peer in every group skipped every step: it holds θ_0 exactly. The scaled cheat passes its own check
    # (its Δ is the large one) and steps away: the honest pair measures that drift and, being the larger
    # group, keeps its θ.
    theta_0 = initial_parameters(spec)
    for name in clean:
        assert all(torch.equal(t, theta_0[key]) for key, t in peers.params(name).items()), name
    if len(clean) == 2:
        assert not any("re-syncs" in Path(p.log_path).read_text() for p in honest)


@pytest.mark.slow
@pytest.mark.wide
def test_a_late_joiner_loads_the_swarms_state_and_trains(swarm: Any) -> None:
    peers = swarm(hivemind_spec(run={"name": "hm", "rounds": 16}))
    first = [peers.worker("a"), peers.worker("b")]
    wait_for(lambda: "version 1 " in Path(first[0].log_path).read_text(), 120, "version 1")
    late = peers.worker("c")  # it needs some 5 s to start; the others are at about version 3 by then
    peers.wait([*first, late], timeout=240)
    text = Path(late.log_path).read_text()
    assert "loaded version" in text, logs_of([late])
    history = peers.summary("c")["history"]
    assert history[0]["version"] > 2 and history[-1]["version"] == 16
    assert any(h["group"] == 3 for h in history), history
    assert_replicas_agree(peers, ["a", "b", "c"], 16 * REPLICA_TOLERANCE_PER_ROUND)


@pytest.mark.slow
@pytest.mark.wide
def test_the_others_finish_when_a_peer_is_killed_mid_round(swarm: Any) -> None:
    peers = swarm(hivemind_spec(run={"name": "hm", "rounds": 6}))
    procs = [peers.worker(name) for name in ("a", "b", "c")]
    wait_for(lambda: "version 2 " in Path(procs[2].log_path).read_text(), 120, "version 2")
    os.killpg(procs[2].pid, signal.SIGKILL)  # the worker, its DHT and averager; its p2pd exits with its parent
    peers.wait(procs[:2], timeout=240)
    for name in ("a", "b"):
        history = peers.summary(name)["history"]
        assert history[-1]["version"] == 6 and all(math.isfinite(h["loss"]) for h in history)
        # After the kill (at version 2 or 3) a and b average as a pair; a ghost follower (docs/RELIABILITY.md) may
        # leave one of the last three rounds alone, as it did the stalled-peer test's last round in CI.
        assert all(h["group"] <= 2 for h in history[-3:]) and sum(h["group"] < 2 for h in history[-3:]) <= 1, history
    assert_replicas_agree(peers, ["a", "b"], 6 * REPLICA_TOLERANCE_PER_ROUND)


STALL = """
import os
import signal
import sys
from rcswarm.cli import worker
from rcswarm.worker import hivemind_sync as hs

averager_pid, waits = [], []
start, wait_for_group = hs.HivemindPeer.__init__, hs._wait_for_group

def init(self, *args, **kwargs):
    start(self, *args, **kwargs)
    averager_pid.append(self.averager.pid)

def wait(control, deadline, *rest):
    formed = wait_for_group(control, deadline, *rest)
    waits.append(formed)
    if len(waits) == 2 and formed is not None:  # the second round's group formed: stop sending and reducing
        print("stalled mid-all-reduce", flush=True)
        os.kill(averager_pid[0], signal.SIGSTOP)
    return formed

hs.HivemindPeer.__init__, hs._wait_for_group = init, wait
sys.exit(worker.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.wide
def test_a_peer_stalled_mid_all_reduce_is_dropped_by_the_sender_and_reducer_timeouts(swarm: Any, tmp_path: Path) -> None:
    """c's averager stops (SIGSTOP: its p2pd keeps the streams open, so only timeouts help) once its second
    round's all-reduce began: a and b drop it within hivemind's sender/reducer timeouts and finish that
    all-reduce instead of failing their step (which the averager's fixed 60 s timeout made them do)."""
    spec = hivemind_spec(run={"name": "hm", "rounds": 4})
    script = tmp_path / "stall.py"
    script.write_text(STALL)
    # The scenario needs c to average its first round with a and b, then stall in the next group it joins. The
    # known stall of a fresh swarm's first all-reduce on this VM (docs/RELIABILITY.md, "The three-peer test") can
    # tear c's first round instead: c falls behind and re-syncs, or logs nothing more while a and b finish (both
    # seen on 2026-11-26, once in CI). Then, and only then (c's log has no first round in the group of 3), the
    # scenario starts once more in a fresh swarm; a second miss, or any other failure, fails the test.
    for attempt in (1, 2):
        peers = swarm(spec, f"attempt{attempt}")
        honest = [peers.worker("a"), peers.worker("b")]
        stalled = peers.worker("c", script=script)
        try:
            peers.wait(honest, timeout=240)
        finally:
            os.killpg(stalled.pid, signal.SIGKILL)
        if "c: version 1 (group of 3," in Path(stalled.log_path).read_text():
            break
        peers.stop()
    assert "c: version 1 (group of 3," in Path(stalled.log_path).read_text(), logs_of([stalled])
    assert "stalled mid-all-reduce" in Path(stalled.log_path).read_text(), logs_of([stalled])
    for proc, name in zip(honest, ("a", "b")):
        history = peers.summary(name)["history"]
        why = f"{history}\n{timelines(honest)}"
        assert [h["version"] for h in history] == [1, 2, 3, 4], why
        # c stalls in the second group it joins: round 2 unless load made it miss a round. That round's group
        # is the last of 3; a and b finished its all-reduce without c. Under load one later round may still
        # end alone (a matchmaking failed while c's stalled averager is dropped, or a ghost follower: the peer
        # steps alone and the drift check re-syncs it), the last round too (CI, 2026-11-28: b's round 4 alone,
        # a's with b as a ghost); every other later round is a pair.
        with_c = [i for i, h in enumerate(history) if i >= 1 and h["group"] == 3]
        assert with_c, why
        assert history[with_c[-1]]["allreduce_s"] is not None, why
        later = history[with_c[-1] + 1:]
        assert all(h["group"] <= 2 for h in later) and sum(h["group"] < 2 for h in later) <= 1, why
        assert Path(proc.log_path).read_text().count("averaging failed") <= 1, why
    assert_replicas_agree(peers, ["a", "b"], 4 * REPLICA_TOLERANCE_PER_ROUND)


LATE = """
import logging
import sys
import time
from rcswarm.cli import worker
from rcswarm.worker import hivemind_sync as hs

ROUNDS, WAIT_S = {rounds}, {wait_s}
average, calls = hs.HivemindPeer.average, []

def late(self, deltas, tokens, gather, **kwargs):
    calls.append(gather["version"])
    if len(calls) > 1:
        return average(self, deltas, tokens, gather, **kwargs)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # until the others published their digests of the last version
        digests = self.records(hs.DIGEST_KEY, self.run).values()
        if sum(r["version"] == ROUNDS for r in digests) >= 2:
            break
        time.sleep(0.2)
    time.sleep(WAIT_S)
    logging.getLogger("rcswarm.worker").info("the first all-reduce ends late")
    return hs.Averaged([d.clone() for d in deltas], [gather] * 3, 1.0)

hs.HivemindPeer.average = late
sys.exit(worker.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.wide
def test_a_peer_whose_all_reduce_ends_after_the_run_loads_the_final_replica(swarm: Any, tmp_path: Path) -> None:
    """The known stall of a first all-reduce (docs/RELIABILITY.md, "the three-peer test") as CI met it on
    2026-11-27: c's all-reduce in a group of 3 ends only after a and b finished the run. Before, c waited
    hivemind.settle_s for digests of a version the others had left, found nobody to load from (they served their
    state 3 s) and trained the last rounds alone, each waiting its whole step timeout for a group (past that test's
    240 s). Now it sees them past its version and re-syncs at once, they serve their state on while it declares an
    earlier one, and c ends at the last version on their replica. c's all-reduce here ends 8 s after their last
    digests, past their grace (3 s); c re-syncs within 5 s of it (waiting for its group's digests it took settle_s,
    10 s)."""
    rounds = 3
    spec = hivemind_spec(run={"name": "hm", "rounds": rounds}, hivemind=PATIENT)
    script = tmp_path / "late.py"
    script.write_text(LATE.format(rounds=rounds, wait_s=8.0))
    peers = swarm(spec)
    honest = [peers.worker("a"), peers.worker("b")]
    late = peers.worker("c", script=script)
    peers.wait([*honest, late], timeout=180)
    text = Path(late.log_path).read_text()
    assert "the first all-reduce ends late" in text, timelines([late])
    assert f"c loaded version {rounds} from peers" in text, timelines([late])
    assert "no peer served its state" not in text, timelines([late])
    ended = logged_at(text, "the first all-reduce ends late")
    resynced = logged_at(text, "c re-syncs from peers: behind")
    assert 0.0 <= resynced - ended < 5.0, timelines([late])
    assert peers.summary("c")["version"] == rounds
    served = [Path(proc.log_path).read_text() for proc in honest]
    assert any(f"peer(s) behind version {rounds}" in log for log in served), timelines(honest)
    assert_replicas_agree(peers, ["a", "b", "c"], 0.0, drift=False)


def logged_at(log: str, text: str) -> float:
    """The time (seconds since the epoch) of the first line of `log` holding `text`, from its timestamp."""
    line = next(line for line in log.splitlines() if text in line)
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def timelines(procs: list[subprocess.Popen]) -> str:
    """The rcswarm lines of each peer's log and hivemind's warnings (rounds, failures, re-syncs, partial
    all-reduces): what a flaky failure needs to be told apart, without hivemind's debug chatter."""
    keep = (" worker ", "[WARN]", "[ERROR]")
    return "\n".join(f"--- {Path(p.log_path).stem} ---\n" + "\n".join(
        line[:300] for line in Path(p.log_path).read_text(errors="replace").splitlines() if any(k in line for k in keep))
        for p in procs)


@pytest.mark.slow
@pytest.mark.wide
def test_rcswarm_run_trains_a_local_hivemind_swarm(tmp_path: Path, no_new_p2pd: None) -> None:
    config = write_spec(hivemind_spec(run={"name": "hm", "rounds": 3, "workers": 2}), tmp_path / "run.toml")
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "rcswarm.cli", "run", str(config), "--run-dir", str(run_dir)],
                          env=worker_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "completed" and summary["rounds"] == 3 and len(summary["peers"]) == 2, summary
    assert summary["val_loss_final"] < summary["val_loss_initial"] - 0.3
    assert summary["replica_max_abs_difference"] <= 3 * REPLICA_TOLERANCE_PER_ROUND
    assert (run_dir / "final.safetensors").is_file()
    # The bootstrap peer mirrored every training row, however its polls fell against the rounds.
    assert sum(row.tokens > 0 for row in read_state(run_dir / "state", lambda store: store.metric_rows())) == 2 * 3 * 5


@pytest.mark.slow
@pytest.mark.wide
def test_workers_keep_averaging_while_the_coordinator_is_down(swarm: Any, start_coordinator: Any, tmp_path: Path) -> None:
    """The coordinator is the control plane only: killed, the workers train on; restarted, they join it again."""
    spec = hivemind_spec(run={"name": "hm", "rounds": 14})
    first = start_coordinator(spec, tmp_path / "coordinator")
    port = first.port
    peers = swarm(spec)
    extra = ["--coordinator", first.target, "--patience-s", "120"]
    procs = [peers.worker("a", *extra), peers.worker("b", *extra)]
    wait_for(lambda: first.service.status().version >= 2, 120, "version 2 reported to the coordinator")
    assert first.service.status().version == first.service.peer_version and first.service.version == 0
    first.running.stop(grace=0.5)
    down_at = max(int(line.split("version ")[1].split(" ")[0]) for line in Path(procs[0].log_path).read_text().splitlines()
                  if ": version " in line)
    wait_for(lambda: f"version {down_at + 3} " in Path(procs[0].log_path).read_text(), 60, "rounds without a coordinator")
    second = start_coordinator(spec, tmp_path / "coordinator", port=port)
    wait_for(lambda: second.service.status().version > down_at + 3, 60, "reports to the restarted coordinator")
    peers.wait(procs, timeout=180)
    status = second.service.status()
    assert status.run_state == 2 and status.version == 14, status  # RUN_STATE_FINISHED
    joined = {w.name for w in status.workers}
    assert joined == {"a", "b"}, joined
    for name in ("a", "b"):
        assert [h["version"] for h in peers.summary(name)["history"]] == list(range(1, 15))


@pytest.mark.wide  # about 20 s on 2 cores; test_three_peers_train_average_and_agree stays in the default suite
def test_workers_train_the_lengths_their_coordinator_assigns(swarm: Any, start_coordinator: Any, tmp_path: Path) -> None:
    """curriculum.worker_seq_lens: each hivemind worker trains the length the coordinator assigned it
    at its join, and the two lengths average in one group (Δ̄ weighted by tokens)."""
    spec = hivemind_spec(run={"name": "hm", "rounds": 2}, curriculum={"worker_seq_lens": [16, 48]}, hivemind=PATIENT)
    coordinators = []

    def via_a_fresh_coordinator(attempt: int) -> tuple[str, str]:  # a second attempt's joins find no earlier ones
        coordinators.append(start_coordinator(spec, tmp_path / f"coordinator{attempt}"))
        return "--coordinator", coordinators[-1].target

    peers, _ = run_whole(swarm, spec, ["a", "b"], 150, worker_args=via_a_fresh_coordinator)
    coordinator = coordinators[-1]
    assigned = {w.name: w.assignment.seq_len for w in coordinator.service.status().workers}
    assert sorted(assigned.values()) == [16, 48], assigned
    for name in ("a", "b"):
        history = peers.summary(name)["history"]
        whole = [h["version"] for h in history] == [1, 2] and all(h["group"] == 2 and not h["skipped"] for h in history)
        assert whole, (name, history, logs_of(peers.procs))
        assert {h["seq_len"] for h in history} == {assigned[name]}, history
    assert_replicas_agree(peers, ["a", "b"], 2 * REPLICA_TOLERANCE_PER_ROUND)
