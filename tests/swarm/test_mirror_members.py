"""Whom `rcswarm dht`'s mirror writes (cli/dht.py `Mirror.poll`, the DHT's answers stubbed): the run's members alone.

A peer is a member once its digest holds this run's spec digest (in this poll, or an earlier one: a version in the
view). A peer of another config under the same run name, or anyone on the open DHT with a schema-valid metrics record,
publishes metrics the mirror leaves out, saying once why: before, such a peer was stored, listed as an active worker,
and its loss entered the run's latest loss, the curves and the fit. Peer names are shown printable (`peer_name`), the
same in the view and in the mirrored rows' worker ids. The dashboard's warning names no flag `rcswarm dht` lacks.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from rcswarm.cli import dht as dht_cli
from rcswarm.cli import status as status_cli
from rcswarm.observe import mirror_view as mv
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker import hivemind_sync as hs
from rcswarm.worker.hivemind_worker import spec_digest
from tests.helpers.dht_mirror import RUN, law_rows, metrics, spec

A, B, OUT, OTHER, OLD, LATE = "p-aaaaaaaa", "p-bbbbbbbb", "p-outsider", "p-otherspc", "p-oldpeer0", "p-latecome"
ANOTHER_SPEC = "f" * 64


class Dht:
    """The DHT's answers to `hivemind_sync.read_records`, set per poll: {key: {peer: record}}."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers: dict[str, dict[str, dict[str, Any]]] = {hs.METRICS_KEY: {}, hs.DIGEST_KEY: {}}
        monkeypatch.setattr(hs, "read_records", lambda dht, key, run: dict(self.answers[key]) if run == RUN else {})

    def set(self, digests: dict[str, dict[str, Any]], records: dict[str, dict[str, Any]]) -> None:
        self.answers = {hs.METRICS_KEY: records, hs.DIGEST_KEY: digests}


def digest(version: int, spec_hex: str | None = None) -> dict[str, Any]:
    record = {"run": RUN, "version": version}
    return record if spec_hex == "" else {**record, "spec": spec_hex or spec_digest(spec())}


def _status(mirror: dht_cli.Mirror) -> pb.GetStatusResponse:
    return mv.mirrored_status(mirror.store, time.time(), stale_s=60.0)


def _ignored_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rcswarm.dht" and "are not mirrored" in r.getMessage()]


def test_the_mirror_writes_and_lists_only_the_runs_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The review's scenario: members a and b publish digests with the run's spec digest; an outsider publishes only
    a schema-valid metrics record (loss 50, seq_len 128), a peer of another config a digest of another spec digest, an
    older rcswarm one that names no spec. Only a's and b's rows are stored; the view, GetStatus, the latest loss and
    the lengths the fit sees are theirs; each other peer is named once, with why (before: all five active, their rows
    stored, fit lengths [32, 64, 128])."""
    caplog.set_level(logging.INFO)
    dht = Dht(monkeypatch)
    far = law_rows(128, 30)
    for row in far:
        row[2] = 50.0
    records = {A: metrics("a", law_rows(32, 30)), B: metrics("b", law_rows(64, 30)), OUT: metrics("outsider", far),
               OTHER: metrics("other", far), OLD: metrics("old", far)}
    dht.set({A: digest(1), B: digest(1), OTHER: digest(1, ANOTHER_SPEC), OLD: digest(1, "")}, records)
    mirror = dht_cli.Mirror(spec(), tmp_path / "state")
    try:
        assert mirror.poll(None) == 60
        rows = mirror.store.metric_rows()
        assert {row.worker_id for row in rows} == {"a@aaaaaaaa", "b@bbbbbbbb"}
        assert {row.seq_len for row in rows} == {32, 64}  # what `rcswarm fit DIR` and the dashboard's fit read
        assert {p.peer_id for p in mirror.view.peers} == {A, B}
        status = _status(mirror)
        assert {(w.name, w.state) for w in status.workers} == {("a", pb.WORKER_STATE_ACTIVE), ("b", pb.WORKER_STATE_ACTIVE)}
        assert status.latest_loss == pytest.approx((law_rows(32, 30)[-1][2] + law_rows(64, 30)[-1][2]) / 2)
        lines = _ignored_lines(caplog)
        assert len(lines) == 3, lines
        why = {peer: next(line for line in lines if peer in line) for peer in (OUT, OTHER, OLD)}
        assert "published no digest of this run" in why[OUT] and "'outsider'" in why[OUT]
        assert "another run spec" in why[OTHER] and f"under the run name {RUN!r} is another swarm" in why[OTHER]
        assert "names no run spec (an older rcswarm)" in why[OLD]
        # Polled again, with newer rows everywhere: the members' rows are written, nothing is said twice.
        caplog.clear()
        records = {peer: metrics(r["name"], r["rows"] + [[*r["rows"][-1][:1], 31.0, *r["rows"][-1][2:]]])
                   for peer, r in records.items()}
        dht.set(dht.answers[hs.DIGEST_KEY], records)
        assert mirror.poll(None) == 2
        assert {row.worker_id for row in mirror.store.metric_rows()} == {"a@aaaaaaaa", "b@bbbbbbbb"}
        assert _ignored_lines(caplog) == []
    finally:
        mirror.close()


def test_a_member_whose_digest_comes_a_poll_after_its_metrics_is_held_back_then_mirrored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The chosen behaviour: metrics that come before their peer's digest are held back (nothing written or listed,
    its newest step written stays 0), so the poll that reads the digest writes every row its record still holds and
    lists it; once a member, a poll whose digest read misses it keeps mirroring it (its version in the view), but a
    digest of another spec ends that."""
    caplog.set_level(logging.INFO)
    dht = Dht(monkeypatch)
    mirror = dht_cli.Mirror(spec(), tmp_path / "state")
    try:
        dht.set({A: digest(1)}, {A: metrics("a", law_rows(32, 5)), LATE: metrics("late", law_rows(64, 5))})
        assert mirror.poll(None) == 5
        assert {p.peer_id for p in mirror.view.peers} == {A} and LATE not in mirror.seen
        assert any(LATE in line and "published no digest of this run" in line for line in _ignored_lines(caplog))
        dht.set({A: digest(1), LATE: digest(1)}, {A: metrics("a", law_rows(32, 5)), LATE: metrics("late", law_rows(64, 6))})
        assert mirror.poll(None) == 6  # all of late's rows, none lost for the poll it waited
        assert {p.name for p in mirror.view.peers} == {"a", "late"}
        assert [row.step for row in mirror.store.metric_rows() if row.worker_id == "late@latecome"] == [1, 2, 3, 4, 5, 6]
        assert any(LATE in r.getMessage() and "mirrored from now on" in r.getMessage() for r in caplog.records)
        dht.set({}, {LATE: metrics("late", law_rows(64, 7))})  # its digest not read this time: still a member
        assert mirror.poll(None) == 1
        dht.set({LATE: digest(2, ANOTHER_SPEC)}, {LATE: metrics("late", law_rows(64, 8))})  # now another config's
        assert mirror.poll(None) == 0
        assert max(row.step for row in mirror.store.metric_rows() if row.worker_id == "late@latecome") == 7
    finally:
        mirror.close()


def test_a_flood_of_outsiders_is_logged_in_a_bounded_number_of_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    dht = Dht(monkeypatch)
    dht.set({}, {f"p-{i:08d}": metrics(f"x{i}", law_rows(32, 1)) for i in range(100)})
    mirror = dht_cli.Mirror(spec(), tmp_path / "state")
    try:
        caplog.set_level(logging.INFO)
        assert mirror.poll(None) == 0 and mirror.view.peers == ()
        lines = [r.getMessage() for r in caplog.records if r.name == "rcswarm.dht"]
        assert len(lines) == 9 and "the metrics of 92 more peers are not mirrored either" in lines[-1]
    finally:
        mirror.close()


NAME = "x\ny\r\x1b[31mRED\x00\"\\}<b>"
SHOWN = "x\\ny\\r\\x1b[31mRED\\x00\"\\}<b>"  # each control character as its escape


def test_a_peer_name_with_control_characters_is_printable_in_the_view_the_rows_and_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """ESC, CR, NUL and a newline in a peer's name reach neither the view, nor the stored rows' worker id, nor
    GetStatus, nor `rcswarm status --state-dir`: each is written as its escape (as a coordinator names a joining
    worker), the name cut at 128 characters, and the view's worker id still matches the rows'."""
    dht = Dht(monkeypatch)
    long = "n" * 150 + "\x1b"
    dht.set({A: digest(1), B: digest(1)}, {A: metrics(NAME, law_rows(32, 5)), B: metrics(long, law_rows(64, 5))})
    mirror = dht_cli.Mirror(spec(), tmp_path / "state")
    try:
        assert mirror.poll(None) == 10
        names = {p.peer_id: p.name for p in mirror.view.peers}
        assert names == {A: SHOWN, B: "n" * 128}
        worker_ids = {row.worker_id for row in mirror.store.metric_rows()}
        assert worker_ids == {f"{SHOWN}@aaaaaaaa", f"{'n' * 128}@bbbbbbbb"}
        status = _status(mirror)
        assert {w.worker_id for w in status.workers} == worker_ids
        assert all(w.name.isprintable() and w.worker_id.isprintable() for w in status.workers)
        assert all(w.trained_tokens == 5 * 4 * (32 if w.name == SHOWN else 64) for w in status.workers)  # ids match
    finally:
        mirror.close()
    for argv in (["--state-dir", str(tmp_path / "state")], ["--state-dir", str(tmp_path / "state"), "--json"]):
        assert status_cli.main(argv) == 0
        out = capsys.readouterr().out
        assert not any(ch in out for ch in "\x1b\r\x00"), repr(out)
    assert mv.peer_name(NAME) == SHOWN and mv.peer_name(long) == "n" * 128


def test_a_view_stored_with_a_raw_name_is_read_printable() -> None:
    """A view a mirror from before `peer_name` stored holds the raw name: it is shown printable all the same."""
    raw = mv.SwarmView(RUN, 1.0, 1, (mv.PeerView(A, NAME, 1, 5, 32, 2.0, 1.0, first_seen=1.0, seen_at=1.0),))
    read = mv.SwarmView.from_json(raw.to_json(), "x")
    assert read.peers[0].name == SHOWN and read.peers[0].worker_id == f"{SHOWN}@aaaaaaaa"
    assert mv.SwarmView.from_json(read.to_json(), "x") == read


def test_the_dashboards_plain_http_warning_names_a_tls_proxy_or_a_tunnel_not_a_missing_flag() -> None:
    required, warning = dht_cli.dashboard_auth("0.0.0.0", False, False)
    assert required and warning is not None
    assert "--http-tls" not in warning and "TLS proxy" in warning and "tunnel" in warning, warning
    assert "takes the join token over plain HTTP" in warning
    assert "--http-tls" not in dht_cli.__doc__ and "--http-tls" not in str(dht_cli.parser().format_help())
    assert dht_cli.dashboard_auth("127.0.0.1", False, False) == (False, None)
    assert dht_cli.dashboard_auth("127.0.0.1", True, False) == (True, None)
    required, warning = dht_cli.dashboard_auth("0.0.0.0", False, True)
    assert not required and warning is not None and "--http-insecure" in warning
    with pytest.raises(ValueError, match="contradict"):
        dht_cli.dashboard_auth("0.0.0.0", True, True)


def test_the_mirrors_dashboard_off_loopback_logs_that_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """`start_dashboard` on 0.0.0.0 logs it (before: "add --http-tls", a flag `rcswarm dht` does not have)."""
    import rcswarm.observe.dashboard as dashboard_package

    class Started:
        def __init__(self, run: Any, host: str, port: int, auth: Any = None, trusted_proxies: Any = ()) -> None:
            self.run, self.url, self.auth = run, f"http://{host}:{port}/", auth

        def start(self) -> Started:
            return self

    dht_cli.Mirror(spec(), tmp_path / "state").close()  # a mirrored state dir (its view stored)
    monkeypatch.setattr(dashboard_package, "Dashboard", Started)
    monkeypatch.setenv("RCSWARM_TOKEN", "token")
    args = dht_cli.parser().parse_args(["--config", "run.toml", "--state-dir", str(tmp_path / "state"),
                                        "--http-port", "0", "--http-host", "0.0.0.0"])
    started = dht_cli.start_dashboard(args)
    started.run.close()
    assert started.auth is not None
    warnings = [r.getMessage() for r in caplog.records if r.name == "rcswarm.dht" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "over plain HTTP" in warnings[0], warnings
    assert "--http-tls" not in warnings[0] and "a TLS proxy" in warnings[0] and "a tunnel" in warnings[0]
