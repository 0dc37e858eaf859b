"""`rcswarm dht` mirroring a hivemind swarm without a coordinator (#17): status, dashboard and fit from its state dir.

The pure parts are tests/observe/test_dht_mirror.py. Here the
slow test starts the real `rcswarm dht` main (in-process, stopped by its event) with its dashboard,
and two real DHT peers on 127.0.0.1 that store digest and metric records with hivemind_sync's own
functions, then reads the state dir with the real `rcswarm status`, HTTP and `rcswarm fit`.
"""
from __future__ import annotations

import dataclasses
import json
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
from tests.helpers.coordinator import free_port
from tests.helpers.dht_mirror import RUN, law_rows, metrics, spec
from tests.helpers.specs import write_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for

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
    from rcswarm.worker.hivemind_worker import spec_digest

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

        def publish(dht: Any, key: str, value: dict[str, Any]) -> bool:
            return hs.store_record(dht, dht.record_subkey, key, value, ttl_s)

        torch.manual_seed(0)
        theta, mine = {"w": torch.randn(200)}, spec_digest(spec())
        for name, seq_len, version in (("a", 32, 2), ("b", 32, 1), ("c", 32, 2)):
            dht = hs.start_dht(hs.HivemindOptions.loopback(bootstrap))
            peers.append(dht)
            assert publish(dht, hs.DIGEST_KEY, hs.digest_record(RUN, version, theta, spec=mine))
            assert publish(dht, hs.METRICS_KEY, metrics(name, law_rows(seq_len, 120, version)))
        peers.append(hs.start_dht(hs.HivemindOptions.loopback(bootstrap)))  # a peer of another run
        assert publish(peers[-1], hs.METRICS_KEY, {"run": "other", "name": "x", "rows": law_rows(8, 3)})
        # A peer of this run's name but another config: another swarm, whose version 9 the view leaves out.
        assert publish(peers[-1], hs.DIGEST_KEY, hs.digest_record(RUN, 9, theta, spec="b" * 64))
        # A peer that publishes metrics of this run's name and no digest: not a member, none of its rows is mirrored.
        peers.append(hs.start_dht(hs.HivemindOptions.loopback(bootstrap)))
        assert publish(peers[-1], hs.METRICS_KEY, metrics("outsider", law_rows(128, 30)))

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
        assert (status["run_id"], status["version"], status["target_rounds"]) == (RUN, 2, 3)  # numbers as numbers
        assert status["total_tokens"] == 4 * 120 * 32 * 3
        workers = {w["name"]: w for w in status["workers"]}
        assert sorted(workers) == ["a", "b", "c"] and all(w["state"] == "WORKER_STATE_ACTIVE" for w in workers.values())
        assert (workers["a"]["base_version"], workers["b"]["base_version"]) == (2, 1)
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
        assert publish(peers[0], hs.METRICS_KEY, metrics("a", law_rows(32, 130, 2)))
        wait_for(lambda: len(read_state(state, lambda store: store.metric_rows())) >= 3 * 120 + 10, 60, "the restarted mirror")
        time.sleep(1.0)  # a few more polls
        assert again.close() == 0
        assert len(read_state(state, lambda store: store.metric_rows())) == 3 * 120 + 10
        # Two more runs at other lengths, mirrored beside it (a run keeps one length): `rcswarm fit` over all three.
        for seq_len in (8, 128):
            other = dataclasses.replace(spec(), run=dataclasses.replace(spec().run, name=f"{RUN}-{seq_len}"),
                                        data=dataclasses.replace(spec().data, seq_len=seq_len))
            record = {**metrics("a", law_rows(seq_len, 120)), "run": other.run.name}
            assert publish(peers[1], hs.METRICS_KEY, record)  # replaces its record of the run before
            # A member of that run: its digest holds that run's spec digest (the mirror writes members' rows alone).
            assert publish(peers[1], hs.DIGEST_KEY, hs.digest_record(other.run.name, 0, theta, spec=spec_digest(other)))
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


def test_a_failing_mirror_poll_is_logged_and_the_next_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """One poll that raises (a record the mirror cannot write, a full disk) must not end the bootstrap peer; a DHT
    process that is gone ends it (PeerDied), as nothing is left to poll."""
    from rcswarm.worker import hivemind_sync as hs

    class Flaky:
        def __init__(self) -> None:
            self.errors = [OverflowError("Python int too large to convert to SQLite INTEGER")]

        def poll(self, dht: Any) -> int:
            if self.errors:
                raise self.errors.pop()
            return 3

    mirror = Flaky()
    assert dht_cli._poll(mirror, None) == 0
    assert "mirror poll failed, the next one goes on: OverflowError: Python int too large" in caplog.text
    assert dht_cli._poll(mirror, None) == 3
    mirror.errors = [hs.PeerDied("its hivemind DHT process (pid 1) exited with code -9 during a get")]
    with pytest.raises(hs.PeerDied):
        dht_cli._poll(mirror, None)
