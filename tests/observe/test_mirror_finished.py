"""A mirrored hivemind swarm whose run ended (observe/mirror_view.py): peers that reached run.rounds.

A hivemind peer trains no round past run.rounds and publishes no record that it ended (its Leave goes to a
coordinator only), so its digest's version says it finished: `rcswarm status --state-dir` and the dashboard list
it as left, "finished: reached round N", however recently its records advanced, never as active or stale; with
run.rounds = 0 (a run until stopped) no peer ever finishes. Tokens applied come from the mirrored rows, as trained.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from rcswarm.cli import dht as dht_cli
from rcswarm.cli import status as status_cli
from rcswarm.observe import mirror_view as mv
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.dht_mirror import RUN, law_rows, metrics, spec

A, B = "p-aaaaaaaa", "p-bbbbbbbb"
Poll = tuple[dict[str, int], dict[str, list[list[float]]], float]  # (digest versions, metric rows, when) per peer


def _spec(rounds: int) -> Any:
    return dataclasses.replace(spec(), run=dataclasses.replace(spec().run, rounds=rounds))


def _mirrored(state_dir: Path, rounds: int, polls: list[Poll]) -> Path:
    """A state dir mirrored as `Mirror.poll` writes it, one poll after another (peer a named "a", b "b")."""
    mirror = dht_cli.Mirror(_spec(rounds), state_dir)
    try:
        for versions, rows, now in polls:
            records = {peer: metrics("a" if peer == A else "b", peer_rows) for peer, peer_rows in rows.items()}
            mirror.store.add_metrics(mirror.rows(records, now))
            digests = {peer: {"run": RUN, "version": version} for peer, version in versions.items()}
            mirror.view = mv.update_view(mirror.view, RUN, digests, records, now)
            mirror.store.set_many({mv.VIEW_KEY: mirror.view.to_json()})
    finally:
        mirror.close()
    return state_dir


def _status(state_dir: Path, now: float) -> pb.GetStatusResponse:
    store = StateStore.open_read_only(state_dir)
    try:
        return mv.mirrored_status(store, now, stale_s=60.0)
    finally:
        store.close()


def _rate(seq_len: int, steps: int) -> float:
    """tokens/s of `law_rows(seq_len, steps)` over its own clock (`worker_totals`)."""
    rows = law_rows(seq_len, steps)
    return sum(row[3] for row in rows) / (rows[-1][4] - rows[0][4])


def _loss(seq_len: int, steps: int) -> float:
    return law_rows(seq_len, steps)[-1][2]


def _both_finished(tmp_path: Path) -> Path:
    """Run of 3 rounds: both peers at version 2, then both at 3 (its last) with 20 steps each."""
    return _mirrored(tmp_path / "state", 3, [
        ({A: 2, B: 2}, {A: law_rows(32, 10, 1), B: law_rows(64, 10, 1)}, 1000.0),
        ({A: 3, B: 3}, {A: law_rows(32, 20, 2), B: law_rows(64, 20, 2)}, 1030.0),
    ])


# ---- pure: a peer's state -----------------------------------------------------------------------


def test_a_peer_at_the_runs_last_version_has_finished_not_active_nor_stale() -> None:
    peer = mv.PeerView("p", "a", 3, 20, 32, 2.0, 1.0, first_seen=0.0, seen_at=100.0, gap_s=5.0)
    finished = (pb.WORKER_STATE_LEFT, "finished: reached round 3")
    assert mv.peer_state(101.0, peer, 60.0, target_rounds=3) == finished  # its records just advanced
    assert mv.peer_state(100_000.0, peer, 60.0, target_rounds=3) == finished  # long gone: finished, not stale
    assert mv.peer_state(101.0, peer, 60.0, target_rounds=4) == (pb.WORKER_STATE_ACTIVE, "")  # one round to go
    before = dataclasses.replace(peer, version=2)
    assert mv.peer_state(101.0, before, 60.0, target_rounds=3) == (pb.WORKER_STATE_ACTIVE, "")
    assert mv.peer_state(200.0, before, 60.0, target_rounds=3)[1].startswith("stale: no new record for 100 s")
    # run.rounds = 0, a run until stopped: no version finishes it.
    far = dataclasses.replace(peer, version=10**9)
    assert mv.peer_state(101.0, far, 60.0, target_rounds=0) == (pb.WORKER_STATE_ACTIVE, "")
    assert mv.peer_state(1000.0, far, 60.0, target_rounds=0)[1].startswith("stale: ")


# ---- GetStatus from a mirrored store --------------------------------------------------------------


def test_a_finished_run_lists_its_peers_as_finished_with_the_tokens_they_trained(tmp_path: Path) -> None:
    state_dir = _both_finished(tmp_path)
    tokens = {"a": 20 * 4 * 32, "b": 20 * 4 * 64}
    for now in (1040.0, 100_000.0):  # 10 s after their last records (within --stale-s), and long after
        status = _status(state_dir, now)
        assert (status.run_state, status.version, status.target_rounds) == (pb.RUN_STATE_FINISHED, 3, 3)
        workers = {w.name: w for w in status.workers}
        for name, worker in workers.items():
            assert (worker.state, worker.reason, worker.base_version) == (pb.WORKER_STATE_LEFT,
                                                                          "finished: reached round 3", 3)
            assert worker.trained_tokens == worker.applied_tokens == tokens[name]  # not "0 applied"
        assert status.total_tokens == status.applied_tokens == sum(tokens.values())
        # None is active: the rate the run ended at and its peers' latest losses, not 0 and NaN.
        assert status.tokens_per_second == pytest.approx(_rate(32, 20) + _rate(64, 20))
        assert status.latest_loss == pytest.approx((_loss(32, 20) + _loss(64, 20)) / 2)


def test_the_dashboards_run_and_status_cli_show_the_finished_run(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    state_dir = _both_finished(tmp_path)
    run = mv.MirrorRun(state_dir, 60.0, clock=lambda: 1040.0)
    try:
        status = run.status()
        assert status == _status(state_dir, 1040.0)
        summary = run.summary()
    finally:
        run.close()
    assert (summary.run_state, summary.active_workers, summary.total_tokens) == (pb.RUN_STATE_FINISHED, 0,
                                                                                 20 * 4 * (32 + 64))
    assert status_cli.main(["--state-dir", str(state_dir), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["run_state"] == "RUN_STATE_FINISHED" and printed["applied_tokens"] == 20 * 4 * (32 + 64)
    assert {(w["name"], w["state"], w["reason"], w["applied_tokens"]) for w in printed["workers"]} == {
        ("a", "WORKER_STATE_LEFT", "finished: reached round 3", 20 * 4 * 32),
        ("b", "WORKER_STATE_LEFT", "finished: reached round 3", 20 * 4 * 64)}
    assert status_cli.main(["--state-dir", str(state_dir)]) == 0
    out = capsys.readouterr().out
    assert out.count("finished: reached round 3") == 2 and "stale:" not in out


def test_a_peer_that_finished_while_another_still_trains(tmp_path: Path) -> None:
    """a reached the last version; b, a round behind (its all-reduce ended after a's group finished), still advances:
    a is finished, b active, and the rate and loss are b's alone. The run is finished: the swarm's version is 3."""
    state_dir = _mirrored(tmp_path / "state", 3, [
        ({A: 2, B: 1}, {A: law_rows(32, 10, 1), B: law_rows(64, 5, 0)}, 1000.0),
        ({A: 3, B: 2}, {A: law_rows(32, 20, 2), B: law_rows(64, 10, 1)}, 1030.0),
    ])
    status = _status(state_dir, 1040.0)
    workers = {w.name: w for w in status.workers}
    assert (workers["a"].state, workers["a"].reason) == (pb.WORKER_STATE_LEFT, "finished: reached round 3")
    assert (workers["b"].state, workers["b"].reason, workers["b"].base_version) == (pb.WORKER_STATE_ACTIVE, "", 2)
    assert (workers["a"].applied_tokens, workers["b"].applied_tokens) == (20 * 4 * 32, 10 * 4 * 64)
    assert (status.run_state, status.version) == (pb.RUN_STATE_FINISHED, 3)
    assert status.tokens_per_second == pytest.approx(_rate(64, 10))
    assert status.latest_loss == pytest.approx(_loss(64, 10))
    # b stops short of the last version: stale, while a stays finished.
    later = {w.name: w for w in _status(state_dir, 1200.0).workers}
    assert later["b"].reason.startswith("stale: no new record for 170 s")
    assert later["a"].reason == "finished: reached round 3"


def test_an_unbounded_run_never_finishes(tmp_path: Path) -> None:
    """run.rounds = 0: peers far past any round count are active while they advance, then stale, never finished."""
    state_dir = _mirrored(tmp_path / "state", 0, [
        ({A: 500, B: 499}, {A: law_rows(32, 10, 499), B: law_rows(64, 10, 498)}, 1000.0),
        ({A: 501, B: 500}, {A: law_rows(32, 20, 500), B: law_rows(64, 20, 499)}, 1030.0),
    ])
    status = _status(state_dir, 1040.0)
    assert (status.run_state, status.version, status.target_rounds) == (pb.RUN_STATE_RUNNING, 501, 0)
    assert all(w.state == pb.WORKER_STATE_ACTIVE and not w.reason for w in status.workers)
    assert status.applied_tokens == status.total_tokens == 20 * 4 * (32 + 64)
    assert {w.name: w.applied_tokens for w in status.workers} == {"a": 20 * 4 * 32, "b": 20 * 4 * 64}
    gone = _status(state_dir, 2000.0)
    assert gone.run_state == pb.RUN_STATE_RUNNING
    assert all(w.state == pb.WORKER_STATE_LEFT and w.reason.startswith("stale: ") for w in gone.workers)
    assert gone.tokens_per_second == 0.0  # nothing trains and nothing finished: no rate
    assert gone.latest_loss == pytest.approx((_loss(32, 20) + _loss(64, 20)) / 2)  # the listed peers' latest



def test_the_status_cli_shows_what_a_mirror_does_not_count_as_unknown_not_zero(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Late, stale, clipped and dropped updates and the traffic per round are a coordinator's counts: a mirrored
    swarm's workers show "–" and a line saying why (before: "0 / 0 / 0 / 0" and "0 B / 0 B", read as none)."""
    state_dir = _both_finished(tmp_path)
    assert status_cli.main(["--state-dir", str(state_dir)]) == 0
    out = capsys.readouterr().out
    assert "0 / 0 / 0 / 0" not in out and "0 B / 0 B" not in out, out
    assert " ".join(status_cli.NOT_COUNTED.split()) in " ".join(out.split()), out
