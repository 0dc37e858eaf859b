"""`rcswarm dht` mirroring a hivemind swarm without a coordinator (#17): status, dashboard and fit from its state dir.

The pure parts (the view's update, a peer's state, GetStatus from a store) run on their own; the
slow test starts the real `rcswarm dht` main (in-process, stopped by its event) with its dashboard,
and two real DHT peers on 127.0.0.1 that store digest and metric records with hivemind_sync's own
functions, then reads the state dir with the real `rcswarm status`, HTTP and `rcswarm fit`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from rcswarm.cli import dht as dht_cli
from rcswarm.cli import fit as fit_cli
from rcswarm.cli import status as status_cli
from rcswarm.observe import mirror_view as mv
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.conftest import free_port, read_state, tiny_spec, wait_for, write_spec
from tests.test_hivemind import no_new_p2pd  # noqa: F401  (the fixture: no p2pd left behind)

RUN = "hm"


def spec() -> Any:
    return tiny_spec(run={"name": RUN, "rounds": 3}, sync={"backend": "hivemind", "codec": "int8"})


def law_rows(seq_len: int, steps: int, version: int = 0) -> list[list[float]]:
    """Metric rows [version, step, loss, tokens, wall, compute, sync, seq_len, batch] on loss = 5·L^(−α(s))."""
    rows = []
    for step in range(1, steps + 1):
        alpha = 0.3 * (1 - math.exp(-step / 40))
        rows.append([float(version), float(step), 5.0 * seq_len ** -alpha, float(4 * seq_len), 0.01 * seq_len * step,
                     0.01 * seq_len * step, 0.0, float(seq_len), 4.0])
    return rows


def metrics(name: str, rows: list[list[float]]) -> dict[str, Any]:
    return {"run": RUN, "name": name, "rows": rows}


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
        view = mv.update_view(mirror.view, RUN, {"p-aaaaaaaa": digest(2), "p-bbbbbbbb": digest(1)}, records, 1000.0)
        view = mv.update_view(view, RUN, {"p-aaaaaaaa": digest(3)}, {}, 1100.0)
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
    assert (status.run_id, status.version, status.target_rounds, status.run_state) == (RUN, 3, 3, pb.RUN_STATE_FINISHED)
    workers = {w.name: w for w in status.workers}
    assert (workers["a"].state, workers["a"].base_version, workers["a"].worker_id) == (pb.WORKER_STATE_ACTIVE, 3, "a@aaaaaaaa")
    assert workers["b"].state == pb.WORKER_STATE_LEFT and workers["b"].reason.startswith("stale: no new record for 150 s")
    assert workers["a"].trained_tokens == 5 * 4 * 32 and status.total_tokens == 5 * 4 * (32 + 64)
    assert status.latest_loss == pytest.approx(law_rows(32, 5)[-1][2])  # the active peers' latest loss
    assert workers["a"].step_seconds == pytest.approx(0.32)


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


# ---- a real DHT -----------------------------------------------------------------------------------


TOKEN = "mirror-token"


def _get(url: str, token: str | None = TOKEN) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


class DhtCommand:
    """The real `rcswarm dht` main on a thread, stopped by its event."""

    def __init__(self, args: list[str]) -> None:
        self.stop = threading.Event()
        self.code: list[int] = []
        self.thread = threading.Thread(target=lambda: self.code.append(dht_cli.main(args, stop=self.stop)), daemon=True)
        self.thread.start()

    def close(self) -> int | None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "rcswarm dht did not stop"
        return self.code[0] if self.code else None


@pytest.mark.slow
@pytest.mark.usefixtures("no_new_p2pd")
def test_status_dashboard_and_fit_from_a_mirrored_swarm(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    hs = pytest.importorskip("rcswarm.worker.hivemind_sync")
    monkeypatch.setenv("RCSWARM_TOKEN", TOKEN)
    state, maddrs, port = tmp_path / "runs" / RUN, tmp_path / "maddrs.txt", free_port()
    args = ["--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--maddrs-file", str(maddrs), "--config",
            str(write_spec(spec(), tmp_path / "run.toml")), "--state-dir", str(state), "--poll-s", "0.3"]
    command = DhtCommand([*args, "--http-port", str(port), "--http-token-required"])
    peers: list[Any] = []
    try:
        bootstrap = wait_for(lambda: maddrs.is_file() and maddrs.read_text().split(), 60, "the bootstrap peer")
        # Three worker peers store their records as hivemind workers do (store_record, digest_record).
        ttl_s = spec().hivemind.record_ttl_s

        def publish(dht: Any, peer_id: str, key: str, value: dict[str, Any]) -> bool:
            return hs.store_record(dht, peer_id, key, value, ttl_s)

        torch.manual_seed(0)
        theta = {"w": torch.randn(200)}
        for name, seq_len, version in (("a", 32, 2), ("b", 32, 1), ("c", 32, 2)):
            dht = hs.start_dht(hs.HivemindOptions.loopback(bootstrap))
            peers.append(dht)
            assert publish(dht, str(dht.peer_id), hs.DIGEST_KEY, hs.digest_record(RUN, version, theta))
            assert publish(dht, str(dht.peer_id), hs.METRICS_KEY, metrics(name, law_rows(seq_len, 120, version)))
        assert publish(peers[0], "another-run", hs.METRICS_KEY, {"run": "other", "name": "x", "rows": law_rows(8, 3)})

        def mirrored() -> Any:
            stored = read_state(state, lambda store: store.get(mv.VIEW_KEY))
            view = json.loads(stored) if stored is not None else {"peers": []}
            return len(view["peers"]) == 3 and all(p["version"] >= 1 and p["step"] == 120 for p in view["peers"]) and view
        view = wait_for(mirrored, 60, "the mirror's view of 3 peers")
        assert view["version"] == 2
        assert len(read_state(state, lambda store: store.metric_rows())) == 3 * 120

        capsys.readouterr()  # the bootstrap peer's multiaddrs
        assert status_cli.main(["--state-dir", str(state), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert (status["run_id"], status["version"], status["target_rounds"]) == (RUN, "2", "3")
        assert status["total_tokens"] == str(4 * 120 * 32 * 3)
        workers = {w["name"]: w for w in status["workers"]}
        assert sorted(workers) == ["a", "b", "c"] and all(w["state"] == "WORKER_STATE_ACTIVE" for w in workers.values())
        assert (workers["a"]["base_version"], workers["b"]["base_version"]) == ("2", "1")
        assert status_cli.main(["--state-dir", str(state)]) == 0
        printed = capsys.readouterr().out
        for text in ("run hm", "2 / 3", "3 of 3", str(4 * 120 * 32 * 3), "a@", "mirrored by `rcswarm dht`"):
            assert text in printed, text

        base = f"http://127.0.0.1:{port}/"
        # The coordinator dashboard's auth: the token (here required on loopback too), /healthz open.
        assert _get(base + "api/status", token=None)[0] == 401 and _get(base + "api/status", token="wrong")[0] == 401
        assert _get(base + "healthz", token=None)[:1] == (200,)
        code, kind, body = _get(base + "api/status")
        data = json.loads(body)
        assert code == 200 and kind == "application/json" and data["version"] == 2
        assert sorted(w["name"] for w in data["workers"]) == ["a", "b", "c"]
        assert {w["name"]: w["tokens"] for w in data["workers"]}["c"] == 4 * 120 * 32
        assert data["runs"][0]["metrics"]["steps"] == 120 and data["runs"][0]["state_dir"] == str(state)
        page = _get(base)[2].decode()
        assert all(f"{name}@" in page for name in "abc")
        prometheus = _get(base + "metrics")[2].decode()
        assert 'rcswarm_version{run_id="hm"} 2.0' in prometheus and 'rcswarm_workers_active{run_id="hm"} 3.0' in prometheus
        for plot in ("loss_step", "loss_time", "alpha"):
            code, kind, body = _get(base + f"plot/{plot}.png")
            assert (code, kind, body[:8]) == (200, "image/png", b"\x89PNG\r\n\x1a\n")
        assert command.close() == 0
        # A restarted mirror resumes after the rows it wrote (its view keeps each peer's newest step): when a
        # reads 10 more steps, only those are appended, though every peer's record still holds its 120.
        maddrs.unlink()
        again = DhtCommand([*args, "--initial-peers", *hs.visible_maddrs(peers[0])])
        wait_for(maddrs.is_file, 60, "the restarted bootstrap peer")
        assert publish(peers[0], str(peers[0].peer_id), hs.METRICS_KEY, metrics("a", law_rows(32, 130, 2)))
        wait_for(lambda: len(read_state(state, lambda store: store.metric_rows())) >= 3 * 120 + 10, 60, "the restarted mirror")
        time.sleep(1.0)  # a few more polls
        assert again.close() == 0
        assert len(read_state(state, lambda store: store.metric_rows())) == 3 * 120 + 10
        # Two more runs at other lengths, mirrored beside it (a run keeps one length): `rcswarm fit` over all three.
        for seq_len in (8, 128):
            other = dataclasses.replace(spec(), run=dataclasses.replace(spec().run, name=f"{RUN}-{seq_len}"))
            record = {**metrics("a", law_rows(seq_len, 120)), "run": other.run.name}
            assert publish(peers[1], f"p-{seq_len}", hs.METRICS_KEY, record)
            mirror = dht_cli.Mirror(other, tmp_path / "runs" / other.run.name)
            try:
                assert wait_for(lambda: mirror.poll(peers[1]), 30, f"the rows of {other.run.name}") == 120
            finally:
                mirror.close()
    finally:
        for dht in peers:
            dht.shutdown()
        command.close()
    capsys.readouterr()
    assert fit_cli.main([str(tmp_path / "runs"), "--out", str(tmp_path / "fit.png")]) == 0
    printed = capsys.readouterr().out
    assert "8 → 32" in printed and "32 → 128" in printed and "hm-128" in printed
