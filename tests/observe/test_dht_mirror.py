"""`rcswarm dht` mirroring a hivemind swarm without a coordinator (#17): status, dashboard and fit from its state dir.

The pure parts (the view's update, a peer's state, GetStatus from a store); the real `rcswarm dht` main
with two real DHT peers on 127.0.0.1 is tests/swarm/test_dht_mirror.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from rcswarm.cli import dht as dht_cli
from rcswarm.cli import status as status_cli
from rcswarm.observe import mirror_view as mv
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.lock import StateDirBusy, StateDirLock
from rcswarm.state.store import StateStore
from tests.helpers.dht_mirror import RUN, law_rows, metrics, spec
from tests.helpers.specs import write_spec
from tests.helpers.verified_state import committed_run


def digest(version: int) -> dict[str, Any]:
    return {"run": RUN, "version": version}


# ---- pure parts ---------------------------------------------------------------------------------


def test_the_view_follows_each_peers_records_and_the_highest_version() -> None:
    first = mv.update_view(None, RUN, {"p-aaaaaaaa": digest(1)},
                           {"p-aaaaaaaa": metrics("a", law_rows(32, 5)), "p-bbbbbbbb": metrics("b", law_rows(64, 3))}, 100.0)
    assert first.version == 1 and first.polled_at == 100.0
    a, b = sorted(first.peers, key=lambda p: p.name)
    assert (a.worker_id, a.version, a.step, a.seq_len, a.seen_at) == ("a@aaaaaaaa", 1, 5, 32, 100.0)
    assert b.version == -1 and b.loss == pytest.approx(law_rows(64, 3)[-1][2])
    # a advances, b's records stay as they were, c appears with a higher version: the swarm is at 4.
    second = mv.update_view(first, RUN, {"p-aaaaaaaa": digest(2), "p-cccccccc": digest(4)},
                            {"p-aaaaaaaa": metrics("a", law_rows(32, 10)), "p-bbbbbbbb": metrics("b", law_rows(64, 3))},
                            130.0)
    peers = {p.name: p for p in second.peers}
    assert second.version == 4
    assert (peers["a"].seen_at, peers["a"].gap_s, peers["a"].step) == (130.0, 30.0, 10)
    assert (peers["b"].seen_at, peers["b"].first_seen) == (100.0, 100.0)
    assert peers["peer"].version == 4  # a digest without metrics yet: no name
    # The view round-trips through JSON (never pickle) and refuses what is not one.
    assert mv.SwarmView.from_json(second.to_json(), "x") == second
    with pytest.raises(ValueError, match="x: the mirrored swarm view is malformed"):
        mv.SwarmView.from_json('{"format": 1, "run": "hm"}', "x")


def test_the_view_is_bounded() -> None:
    records = {f"peer{i:05d}": metrics(f"w{i}", law_rows(32, 1)) for i in range(mv.MAX_PEERS + 20)}
    view = mv.update_view(None, RUN, {}, records, 1.0)
    assert len(view.peers) == mv.MAX_PEERS
    newer = mv.update_view(view, RUN, {}, {"late": metrics("late", law_rows(32, 1))}, 2.0)
    assert len(newer.peers) == mv.MAX_PEERS and newer.peers[0].name == "late"


def test_a_peer_is_stale_once_its_records_stop_advancing() -> None:
    peer = mv.PeerView("p", "a", 3, 10, 32, 2.0, 1.0, first_seen=0.0, seen_at=100.0, gap_s=5.0)
    assert mv.peer_state(160.0, peer, 60.0) == (pb.WORKER_STATE_ACTIVE, "")
    state, reason = mv.peer_state(161.0, peer, 60.0)
    assert state == pb.WORKER_STATE_LEFT and reason == "stale: no new record for 61 s (> 60 s)"
    # A peer whose rounds take long is waited for 3 × its last gap.
    slow = mv.PeerView("p", "a", 3, 10, 32, 2.0, 1.0, first_seen=0.0, seen_at=100.0, gap_s=50.0)
    assert mv.peer_state(249.0, slow, 60.0)[0] == pb.WORKER_STATE_ACTIVE
    assert mv.peer_state(251.0, slow, 60.0)[0] == pb.WORKER_STATE_LEFT


def _mirrored_dir(tmp_path: Path) -> Path:
    """A state dir with the run, 2 peers' rows and their view, written as the mirror writes them."""
    mirror = dht_cli.Mirror(spec(), tmp_path / "state")
    try:
        records = {"p-aaaaaaaa": metrics("a", law_rows(32, 5)), "p-bbbbbbbb": metrics("b", law_rows(64, 5))}
        mirror.store.add_metrics(mirror.rows(records, 1000.0))
        view = mv.update_view(mirror.view, RUN, {"p-aaaaaaaa": digest(1), "p-bbbbbbbb": digest(1)}, records, 1000.0)
        view = mv.update_view(view, RUN, {"p-aaaaaaaa": digest(2)}, {}, 1100.0)  # below run.rounds = 3: running
        mirror.store.set_many({mv.VIEW_KEY: view.to_json()})
    finally:
        mirror.close()
    return tmp_path / "state"


def test_getstatus_from_a_mirrored_store(tmp_path: Path) -> None:
    store = StateStore.open_read_only(_mirrored_dir(tmp_path))
    try:
        status = mv.mirrored_status(store, now=1150.0, stale_s=60.0)
    finally:
        store.close()
    assert (status.run_id, status.version, status.target_rounds, status.run_state) == (RUN, 2, 3, pb.RUN_STATE_RUNNING)
    workers = {w.name: w for w in status.workers}
    assert (workers["a"].state, workers["a"].base_version, workers["a"].worker_id) == (pb.WORKER_STATE_ACTIVE, 2, "a@aaaaaaaa")
    assert workers["b"].state == pb.WORKER_STATE_LEFT and workers["b"].reason.startswith("stale: no new record for 150 s")
    assert workers["a"].trained_tokens == 5 * 4 * 32 and status.total_tokens == 5 * 4 * (32 + 64)
    # A peer publishes a round's rows once its outer step made the next version: the mirrored tokens were applied.
    assert workers["a"].applied_tokens == 5 * 4 * 32 and status.applied_tokens == status.total_tokens
    assert status.latest_loss == pytest.approx(law_rows(32, 5)[-1][2])  # the active peers' latest loss
    assert workers["a"].step_seconds == pytest.approx(0.32)


def test_the_mirror_leaves_out_a_record_it_cannot_read_and_writes_the_others(tmp_path: Path) -> None:
    """Rows a DHT node with an older validator may still serve (NaN, inf, 1e300, 2**64 − 1) reach neither the store nor
    the view; the readable records of the same poll are mirrored, and the view still serves GetStatus and JSON."""
    def row_with(index: int, value: float) -> list[list[float]]:
        rows = law_rows(32, 3)
        rows[-1][index] = value
        return rows

    bad = {f"p-bad{i:05d}": metrics(f"bad{i}", row_with(index, value)) for i, (index, value) in enumerate(
        [(1, float("nan")), (1, float("inf")), (1, 1e300), (4, float("inf")), (3, float(2**64))])}
    records = {"p-aaaaaaaa": metrics("a", law_rows(32, 3)), **bad}
    mirror = dht_cli.Mirror(spec(), tmp_path / "state")
    try:
        rows = mirror.rows(records, 100.0)
        assert {row[1] for row in rows} == {"a@aaaaaaaa"} and len(rows) == 3
        assert set(mirror.seen) == {"p-aaaaaaaa"}
        assert mirror.store.add_metrics(rows) == 3
        digests = {"p-aaaaaaaa": digest(2), "p-huge0000": digest(2**64 - 1), "p-text0000": {"run": RUN, "version": "x"}}
        view = mv.update_view(None, RUN, digests, records, 100.0)
        # bad0's NaN step is its newest row's; bad4's tokens are not in the view.
        assert {p.name for p in view.peers} == {"a", "bad0", "bad4"} and view.version == 2
        assert all(p.version < 2**63 and p.step < 2**63 for p in view.peers)
        mirror.store.set_many({mv.VIEW_KEY: view.to_json()})
        status = mv.mirrored_status(mirror.store, 101.0)
        assert status.version == 2 and "a@aaaaaaaa" in {w.worker_id for w in status.workers}
    finally:
        mirror.close()


def test_a_mirror_holds_its_state_dir_and_takes_no_coordinators_or_other_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The mirror writes its state dir alone: a second mirror or a coordinator on it is refused while it lives; it
    refuses a coordinator's state dir (whose spec and metrics it would overwrite and mix) and another run's."""
    mirror = dht_cli.Mirror(spec(), tmp_path / "state")
    try:
        with pytest.raises(StateDirBusy, match=r"is in use by another mirror \(pid \d+ on [^,]+\); stop it first"):
            dht_cli.Mirror(spec(), tmp_path / "state")
        with pytest.raises(StateDirBusy, match="is in use by another mirror"):
            StateDirLock.acquire(tmp_path / "state")
    finally:
        mirror.close()
    dht_cli.Mirror(spec(), tmp_path / "state").close()  # released on close
    other = dataclasses.replace(spec(), run=dataclasses.replace(spec().run, name="another"))
    with pytest.raises(ValueError, match=f"mirrors run '{RUN}', not 'another'; give the mirror a state dir of its own"):
        dht_cli.Mirror(other, tmp_path / "state")
    committed_run(tmp_path / "coordinator")
    store = StateStore.open_read_only(tmp_path / "coordinator")
    before = (store.get("spec_json"), len(store.metric_rows()))
    store.close()
    # The command refuses it before it starts a DHT peer, and changes nothing there.
    config = write_spec(spec(), tmp_path / "run.toml")
    assert dht_cli.main(["--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--config", str(config),
                         "--state-dir", str(tmp_path / "coordinator")]) == 2
    assert "holds a coordinator's run (its checkpoints); give the mirror a state dir of its own" in capsys.readouterr().err
    store = StateStore.open_read_only(tmp_path / "coordinator")
    assert (store.get("spec_json"), len(store.metric_rows())) == before
    store.close()
    StateDirLock.acquire(tmp_path / "coordinator").release()  # the refused mirror left no lock behind


def test_status_without_state_names_the_path_and_what_was_expected(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert status_cli.main(["--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}: no state.sqlite here; expected a state dir that `rcswarm dht" in err
    coordinator_dir = tmp_path / "coord"
    store = StateStore(coordinator_dir)
    store.set_many({"run_id": RUN, "spec_json": spec().to_json()})
    store.close()
    assert status_cli.main(["--state-dir", str(coordinator_dir), "--json"]) == 2
    assert "holds no mirrored swarm view (run_state key 'mirror_view')" in capsys.readouterr().err
    assert status_cli.main([]) == 2
    assert "expected --coordinator HOST:PORT, or --state-dir DIR" in capsys.readouterr().err
    assert status_cli.main(["--state-dir", str(tmp_path), "--stale-s", "0"]) == 2
    assert "--stale-s 0.0: expected a positive number" in capsys.readouterr().err


def test_dht_flags_are_checked_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    config = str(write_spec(spec(), tmp_path / "run.toml"))
    assert dht_cli.main(["--http-port", "0"]) == 2
    assert "--http-port serves the dashboard over the mirror: add --config" in capsys.readouterr().err
    monkeypatch.delenv("RCSWARM_TOKEN", raising=False)
    assert dht_cli.main(["--config", config, "--state-dir", str(tmp_path), "--http-port", "0", "--http-host", "0.0.0.0"]) == 2
    assert "the dashboard on 0.0.0.0 requires a token: set $RCSWARM_TOKEN" in capsys.readouterr().err
    assert dht_cli.main(["--stale-s", "5"]) == 2
    assert "--stale-s: only with --http-port" in capsys.readouterr().err
    assert not (tmp_path / "state.sqlite").exists()


def test_dht_refuses_the_token_over_plain_http_off_loopback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """rcswarm dht serves no HTTPS: off loopback, a dashboard that takes the token is refused (exit 2, nothing
    started) unless --http-plaintext says a proxy or tunnel is in front, as the coordinator's rule
    (`dashboard_transport_problem`); before, it started with a WARNING and took the token in the clear."""
    config = str(write_spec(spec(), tmp_path / "run.toml"))
    monkeypatch.setenv("RCSWARM_TOKEN", "a-long-enough-join-token-0123")
    flags = ["--config", config, "--state-dir", str(tmp_path), "--http-port", "0", "--http-host", "192.0.2.1"]
    assert dht_cli.main(flags) == 2
    err = capsys.readouterr().err
    assert "would take the join token over plain HTTP" in err and "--http-plaintext" in err, err
    assert not (tmp_path / "state.sqlite").exists()
    assert dht_cli._argument_problem(dht_cli.parser().parse_args([*flags, "--http-plaintext"])) is None
    assert dht_cli._argument_problem(dht_cli.parser().parse_args([*flags, "--http-insecure"])) is None
    assert dht_cli.main(["--http-plaintext"]) == 2
    assert "--http-plaintext: only with --http-port" in capsys.readouterr().err
