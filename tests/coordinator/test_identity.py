"""Per-worker identity and join-token rotation (issue 14), on real coordinators over loopback.

Join returns a worker secret; each later call of that worker carries it. Another worker's id with
one's own secret is refused (PERMISSION_DENIED) and changes nothing for the victim; a call
without a secret is refused (UNAUTHENTICATED), a push before its payload is read; the secrets
never show in GetStatus, the dashboard, SQLite or the logs. The join token can be rotated from a
token file while a real worker process keeps training on its secret; a restarted coordinator
hands a re-joining worker a new secret and refuses the old one; a sweep routes and checks alike.
"""

from __future__ import annotations

import argparse
import base64
import logging
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import torch

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.coordinator import DEFAULT_MAX_CALLS, CallLimits, RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.sweep import SweepCoordinator
from rcswarm.coordinator.tokens import JoinTokens
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS, WORKER_ID_METADATA, WORKER_SECRET_METADATA
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from rcswarm.worker import Worker, WorkerOptions
from rcswarm.worker.client import Action, Identity, classify
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for
from tests.helpers.wire import refused

AUTH = (("authorization", f"Bearer {TOKEN}"),)
WORKER_RPCS = ("Heartbeat", "Leave", "PullParameters", "AwaitVersion", "PushUpdate", "ReportMetrics")


def stub_to(target: str) -> tuple[grpc.Channel, pb_grpc.CoordinatorStub]:
    channel = grpc.insecure_channel(target, options=MESSAGE_SIZE_OPTIONS)
    return channel, pb_grpc.CoordinatorStub(channel)


def zero_update(shapes: dict[str, tuple[int, ...]], run_id: str, version: int) -> list[pb.PushUpdateRequest]:
    """The header and chunks of an all-zero fp32 update (without its meta)."""
    deltas = {name: torch.zeros(shape) for name, shape in shapes.items()}
    header, chunks = tensor_stream.build_payload(deltas, codec=pb.CODEC_FP32, run_id=run_id, version=version)
    return [pb.PushUpdateRequest(header=header), *(pb.PushUpdateRequest(chunk=c) for c in chunks)]


def worker_call(stub: pb_grpc.CoordinatorStub, rpc: str, worker_id: str, secret: bytes, local: Any,
                metadata: tuple = AUTH) -> Any:
    """One call of a worker RPC for `worker_id` presenting `secret`, with valid contents otherwise."""
    who = {"worker_id": worker_id, "worker_secret": secret}
    if rpc == "PullParameters":
        return list(stub.PullParameters(pb.PullParametersRequest(**who), timeout=30, metadata=metadata))
    if rpc == "PushUpdate":
        meta = pb.PushUpdateRequest(meta=pb.UpdateMeta(**who, base_version=0, tokens=64, inner_steps=1))
        messages = [meta, *zero_update(local.service.shapes, local.service.run_id, 0)]
        return stub.PushUpdate(iter(messages), timeout=30, metadata=metadata)
    request = {
        "Heartbeat": lambda: pb.HeartbeatRequest(**who),
        "Leave": lambda: pb.LeaveRequest(**who, reason="impostor"),
        "AwaitVersion": lambda: pb.AwaitVersionRequest(**who, min_version=1, wait_ms=3000),
        "ReportMetrics": lambda: pb.ReportMetricsRequest(**who, metrics=[pb.Metric(
            version=0, step=1, seq_len=local.service.spec.data.seq_len, loss=3.0, tokens=8)]),
    }[rpc]()
    return getattr(stub, rpc)(request, timeout=10, metadata=metadata)


def shown(secret: bytes) -> list[bytes]:
    """The forms a secret could leak in: raw, hex, base64 (as protobuf JSON writes bytes)."""
    return [secret, secret.hex().encode(), base64.b64encode(secret), base64.urlsafe_b64encode(secret)]


@pytest.fixture
def pair(start_coordinator: Any) -> Any:
    """A coordinator (fp32) and two joined workers A and B over a raw stub, both holding version 0."""
    local = start_coordinator(tiny_spec(sync={"codec": "fp32", "max_update_norm": 100.0}), http_port=0)
    channel, stub = stub_to(local.target)
    a, b = (stub.Join(pb.JoinRequest(worker_name=name, device="cpu", pid=1), timeout=10, metadata=AUTH) for name in "ab")
    for member in (a, b):
        worker_call(stub, "PullParameters", member.worker_id, member.worker_secret, local)
    yield local, stub, a, b
    channel.close()


def test_join_returns_a_fresh_32_byte_secret_per_membership(pair: Any) -> None:
    local, stub, a, b = pair
    assert len(a.worker_secret) == len(b.worker_secret) == 32 and a.worker_secret != b.worker_secret
    record = local.service.workers[a.worker_id]
    assert a.worker_secret not in repr(record).encode() and record.secret_sha256 != a.worker_secret
    assert "worker_secret" not in repr(Identity.of(a)) and a.worker_secret.hex() not in repr(Identity.of(a))


@pytest.mark.parametrize("rpc", WORKER_RPCS)
def test_another_workers_id_is_refused_and_the_victim_is_unaffected(pair: Any, rpc: str) -> None:
    local, stub, a, b = pair
    victim = local.service.workers[a.worker_id]
    before = (victim.last_seen, victim.base_version, victim.active, victim.metric_budget)
    time.sleep(0.01)
    error = refused(lambda: worker_call(stub, rpc, a.worker_id, b.worker_secret, local))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
    assert rpc in error.details() and a.worker_id in error.details()
    assert not any(form.decode("latin-1") in error.details() for s in (a.worker_secret, b.worker_secret) for form in shown(s))
    # Nothing changed for A: still a member, its lease not renewed, no report or metric rows in its name.
    assert (victim.last_seen, victim.base_version, victim.active, victim.metric_budget) == before
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10, metadata=AUTH)
    assert {w.worker_id: w.state for w in status.workers}[a.worker_id] == pb.WORKER_STATE_ACTIVE
    assert status.rounds[-1].reports == 0 and status.version == 0
    assert [r for r in read_state(local.state_dir, lambda store: store.metric_rows()) if r.worker_id == a.worker_id] == []
    # A's own update lands and counts (no ALREADY_EXISTS), and B's own closes the round.
    pushed = worker_call(stub, "PushUpdate", a.worker_id, a.worker_secret, local)
    assert pushed.accepted and pushed.reports == 1
    assert worker_call(stub, "PushUpdate", b.worker_id, b.worker_secret, local).reports == 2
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=10, metadata=AUTH).version == 1


@pytest.mark.parametrize("with_token", [True, False], ids=["with-token", "without-token"])
@pytest.mark.parametrize("rpc", WORKER_RPCS)
def test_a_worker_call_without_a_secret_is_unauthenticated(pair: Any, rpc: str, with_token: bool) -> None:
    local, stub, a, _ = pair
    victim = local.service.workers[a.worker_id]
    before = (victim.last_seen, victim.active)
    error = refused(lambda: worker_call(stub, rpc, a.worker_id, b"", local, metadata=AUTH if with_token else ()))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    if rpc == "PushUpdate" and not with_token:  # refused by the server's guard, before the stream takes a slot
        assert "worker's id and secret in the call's metadata" in error.details()
    else:
        assert "carries no worker secret; join first" in error.details() and rpc in error.details()
    assert (victim.last_seen, victim.active) == before
    assert local.service.round.reports == {}


@pytest.mark.parametrize("whose", ["none", "another worker's"])
def test_a_push_with_a_wrong_secret_is_refused_before_its_payload_is_read(pair: Any, whose: str) -> None:
    local, stub, a, b = pair
    secret, code = (b"", grpc.StatusCode.UNAUTHENTICATED) if whose == "none" else (b.worker_secret, grpc.StatusCode.PERMISSION_DENIED)
    release = threading.Event()

    def meta_then_payload_later():
        yield pb.PushUpdateRequest(meta=pb.UpdateMeta(worker_id=a.worker_id, worker_secret=secret, base_version=0, tokens=64))
        release.wait(8.0)  # a server that read on for the header would wait here
        yield from zero_update(local.service.shapes, local.service.run_id, 0)

    started = time.monotonic()
    try:
        error = refused(lambda: stub.PushUpdate(meta_then_payload_later(), timeout=20, metadata=AUTH))
        elapsed = time.monotonic() - started
    finally:
        release.set()
    assert error.code() == code and elapsed < 4.0, (error.code(), elapsed)
    assert local.service.round.reports == {}


def credential_metadata(member: Any) -> tuple:
    """What a worker's PushUpdate presents beside its meta: its id and secret (worker/client.py)."""
    return ((WORKER_ID_METADATA, member.worker_id), (WORKER_SECRET_METADATA, member.worker_secret))


def test_a_stream_without_credentials_never_takes_a_push_slot(start_coordinator: Any) -> None:
    """Without a join token, a PushUpdate must present an active worker's id and secret in its metadata:
    silent streams with none, a made-up secret or a left worker's are refused at once instead of holding one
    of the (here 2) push slots for stream_idle_s, and an honest worker's push then still goes through."""
    limits = CallLimits(max_calls={**DEFAULT_MAX_CALLS, "push": 2}, stream_idle_s=10.0)
    local = start_coordinator(tiny_spec(sync={"codec": "fp32", "max_update_norm": 100.0}), limits=limits)
    channel, stub = stub_to(local.target)
    a, gone = (stub.Join(pb.JoinRequest(worker_name=name, device="cpu", pid=1), timeout=10, metadata=AUTH) for name in "ag")
    worker_call(stub, "PullParameters", a.worker_id, a.worker_secret, local)
    worker_call(stub, "Leave", gone.worker_id, gone.worker_secret, local)
    release = threading.Event()

    def silent() -> Any:
        release.wait(15.0)
        yield from ()

    forged = ((WORKER_ID_METADATA, a.worker_id), (WORKER_SECRET_METADATA, b"\0" * 32))
    try:
        for metadata in [(), forged, credential_metadata(gone)] * 2:
            started = time.monotonic()
            error = refused(lambda: stub.PushUpdate(silent(), timeout=20, metadata=metadata))
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED and time.monotonic() - started < 3.0
            assert "in the call's metadata" in error.details()
        assert worker_call(stub, "PushUpdate", a.worker_id, a.worker_secret, local, metadata=credential_metadata(a)).accepted
    finally:
        release.set()
        channel.close()


def test_a_joined_worker_needs_no_join_token_but_join_and_status_do(pair: Any) -> None:
    local, stub, a, b = pair
    for rpc in ("Heartbeat", "ReportMetrics", "PullParameters"):
        worker_call(stub, rpc, a.worker_id, a.worker_secret, local, metadata=())
    assert worker_call(stub, "PushUpdate", a.worker_id, a.worker_secret, local, metadata=credential_metadata(a)).accepted
    worker_call(stub, "Leave", b.worker_id, b.worker_secret, local, metadata=())
    awaited = worker_call(stub, "AwaitVersion", a.worker_id, a.worker_secret, local, metadata=())
    assert awaited.version == 1
    wrong = (("authorization", "Bearer not-the-token"),)
    for metadata in ((), wrong):
        assert refused(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=10, metadata=metadata)).code() == \
            grpc.StatusCode.UNAUTHENTICATED
        assert refused(lambda: stub.Join(pb.JoinRequest(worker_name="c"), timeout=10, metadata=metadata)).code() == \
            grpc.StatusCode.UNAUTHENTICATED


def test_secrets_never_show_in_status_dashboard_sqlite_or_logs(start_coordinator: Any, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    local = start_coordinator(tiny_spec(sync={"codec": "fp32"}), http_port=0)
    channel, stub = stub_to(local.target)
    a, b = (stub.Join(pb.JoinRequest(worker_name=name, device="cpu", pid=1), timeout=10, metadata=AUTH) for name in "ab")
    for member in (a, b):
        for rpc in ("Heartbeat", "PullParameters", "ReportMetrics"):
            worker_call(stub, rpc, member.worker_id, member.worker_secret, local)
    refused(lambda: worker_call(stub, "Heartbeat", a.worker_id, b.worker_secret, local))
    worker_call(stub, "PushUpdate", a.worker_id, a.worker_secret, local)
    worker_call(stub, "Leave", b.worker_id, b.worker_secret, local)
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10, metadata=AUTH)
    assert status.version == 1 and len(status.workers) == 2
    with urllib.request.urlopen(local.running.dashboard.url + "api/status", timeout=20) as response:
        dashboard = response.read()
    assert a.worker_id.encode() in dashboard
    channel.close()
    stored = b"".join(path.read_bytes() for path in local.state_dir.rglob("*") if path.is_file())
    assert len(read_state(local.state_dir, lambda store: store.events())) == 3
    assert "refused Heartbeat for worker " + a.worker_id in caplog.text
    places = {"GetStatus": status.SerializeToString() + str(status).encode(), "/api/status": dashboard,
              "the logs": caplog.text.encode()}
    for member in (a, b):
        digest = local.service.workers[member.worker_id].secret_sha256
        for where, text in {**places, "the state dir (SQLite, checkpoints)": stored}.items():
            for form in shown(member.worker_secret):
                assert form not in text, f"{member.worker_id}'s secret shows in {where}"
        for where, text in places.items():
            for form in shown(digest):
                assert form not in text, f"{member.worker_id}'s secret's digest shows in {where}"
        # The state dir keeps the digest (never the secret): a restarted coordinator checks a re-join naming the
        # membership against it (`StateStore.joined_digest`).
        assert read_state(local.state_dir, lambda store, m=member: store.joined_digest(m.worker_id)) == digest


class RecordingWorker(Worker):
    """The real worker, recording the identity of each of its joins and the rounds it pushed."""

    def __init__(self, options: WorkerOptions) -> None:
        super().__init__(options, TOKEN)
        self.identities: list[Identity] = []
        self.pushed = 0

    def _join(self) -> int | None:
        version = super()._join()
        self.identities.append(self.identity)
        return version

    def _push(self, version: int, base: dict[str, torch.Tensor], tokens: int) -> bool:
        delivered = super()._push(version, base, tokens)
        self.pushed += delivered
        return delivered


def run_in_thread(worker: Worker) -> tuple[threading.Thread, list[int]]:
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    return thread, result


def options(target: str, **overrides: Any) -> WorkerOptions:
    return WorkerOptions(coordinator=target, device="cpu", name="identity", threads=1, **overrides)


def start_running(spec: Any, state_dir: Path, port: int = 0) -> RunningCoordinator:
    store = StateStore(state_dir, spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    return RunningCoordinator(SwarmCoordinator(spec, store), TOKEN, port=port).start()


def test_after_a_coordinator_restart_the_worker_rejoins_with_a_new_secret(tmp_path: Path) -> None:
    spec = tiny_spec(run={"rounds": 0, "workers": 1}, inner={"steps": 3}, coordinator={"lease_s": 10.0, "max_wait_s": 1.0})
    running = start_running(spec, tmp_path / "state")
    port = running.port
    worker = RecordingWorker(options(f"127.0.0.1:{port}", patience_s=30.0))
    thread, result = run_in_thread(worker)
    try:
        wait_for(lambda: worker.pushed >= 2, 60, "two rounds before the restart")
        running.stop(grace=0.2)
        running = start_running(spec, tmp_path / "state", port)
        wait_for(lambda: len(worker.identities) >= 2 and worker.pushed >= 4, 60, "the re-join and rounds after it")
        first, second = worker.identities[:2]
        assert first.worker_id != second.worker_id and first.worker_secret != second.worker_secret
        channel, stub = stub_to(f"127.0.0.1:{port}")
        old = refused(lambda: stub.Heartbeat(pb.HeartbeatRequest(worker_id=first.worker_id, worker_secret=first.worker_secret),
                                             timeout=10))
        assert old.code() == grpc.StatusCode.NOT_FOUND
        stolen = refused(lambda: stub.Heartbeat(pb.HeartbeatRequest(worker_id=second.worker_id, worker_secret=first.worker_secret),
                                                timeout=10))
        assert stolen.code() == grpc.StatusCode.PERMISSION_DENIED
        channel.close()
    finally:
        worker.stop.set()
        thread.join(timeout=30)
        running.stop(grace=0.2)
    assert result == [0]


class ForgetfulWorker(Worker):
    """The real worker, which replaces its worker secret after joining with one the coordinator never gave."""

    def _join(self) -> int | None:
        version = super()._join()
        self.identity = Identity(self.identity.worker_id, b"\x00" * 32)
        return version


def test_a_refused_identity_ends_the_worker_with_its_own_message(start_coordinator: Any, caplog: Any) -> None:
    local = start_coordinator(tiny_spec(run={"rounds": 0}))
    with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
        code = ForgetfulWorker(options(local.target, patience_s=5.0), TOKEN).run()
    assert code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "PERMISSION_DENIED" in errors[0], errors
    assert "refused this worker's identity" in errors[0] and "join token" not in errors[0], errors
    assert classify(grpc.StatusCode.PERMISSION_DENIED)[0] is Action.FATAL
    assert "join token" in classify(grpc.StatusCode.UNAUTHENTICATED)[1]


def test_a_sweep_routes_by_id_and_each_run_checks_the_secret(tmp_path: Path) -> None:
    base = tiny_spec(run={"rounds": 1}, sync={"codec": "fp32"}, coordinator={"lease_s": 60.0})
    spec = base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [8, 16]}})
    sweep = SweepCoordinator(spec, tmp_path / "state")
    running = RunningCoordinator(sweep, TOKEN).start()
    channel, stub = stub_to(f"127.0.0.1:{running.port}")
    try:
        a, b = (stub.Join(pb.JoinRequest(worker_name=name, device="cpu", pid=1), timeout=10, metadata=AUTH) for name in "ab")
        assert a.run_id != b.run_id
        run_a = next(run for run in sweep.runs if run.run_id == a.run_id)
        local_a = SimpleNamespace(service=run_a)
        assert refused(lambda: worker_call(stub, "Heartbeat", a.worker_id, b.worker_secret, local_a)).code() == \
            grpc.StatusCode.PERMISSION_DENIED
        assert refused(lambda: worker_call(stub, "Heartbeat", "r9w1-nobody", b"", local_a)).code() == \
            grpc.StatusCode.UNAUTHENTICATED
        worker_call(stub, "PullParameters", a.worker_id, a.worker_secret, local_a)
        # A's push finishes its run (one round), so the sweep moves A: REASSIGNED there, NOT_FOUND on its next call.
        assert worker_call(stub, "PushUpdate", a.worker_id, a.worker_secret, local_a).accepted
        assert run_a.workers[a.worker_id].state == pb.WORKER_STATE_REASSIGNED
        assert refused(lambda: worker_call(stub, "Heartbeat", a.worker_id, a.worker_secret, local_a)).code() == \
            grpc.StatusCode.NOT_FOUND
        # Its old run still takes its metrics, under its own secret only.
        assert worker_call(stub, "ReportMetrics", a.worker_id, a.worker_secret, local_a).stored == 1
        for secret, code in ((b.worker_secret, grpc.StatusCode.PERMISSION_DENIED), (b"", grpc.StatusCode.UNAUTHENTICATED)):
            assert refused(lambda: worker_call(stub, "ReportMetrics", a.worker_id, secret, local_a)).code() == code
        # A joins again, in the other run, with a new id and secret; the old secret is not the new id's.
        again = stub.Join(pb.JoinRequest(worker_name="a", device="cpu", pid=1), timeout=10, metadata=AUTH)
        assert again.run_id == b.run_id and again.worker_secret != a.worker_secret
        assert refused(lambda: worker_call(stub, "Heartbeat", again.worker_id, a.worker_secret, local_a)).code() == \
            grpc.StatusCode.PERMISSION_DENIED
        assert worker_call(stub, "Heartbeat", again.worker_id, again.worker_secret, local_a).version == 0
    finally:
        channel.close()
        running.stop(grace=0.5)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_join_tokens_reload_on_change_at_most_once_a_second_and_never_half(tmp_path: Path, caplog: Any) -> None:
    path, clock = tmp_path / "tokens", Clock()
    path.write_text("# team a\nalpha-token\n\n  beta-token  \nalpha-token\n")
    tokens = JoinTokens.from_file(path, clock=clock)
    assert len(tokens) == 2 and tokens.accepts(b"Bearer alpha-token") and tokens.accepts(b"Bearer beta-token")
    assert not tokens.accepts(b"Bearer alpha-toke") and not tokens.accepts(b"alpha-token")
    path.write_text("gamma-token-long\n")
    assert tokens.accepts(b"Bearer alpha-token"), "looked at the file again within the second"
    clock.now += 1.0
    assert tokens.accepts(b"Bearer gamma-token-long") and not tokens.accepts(b"Bearer alpha-token")
    caplog.set_level(logging.INFO, logger="rcswarm.coordinator")
    for bad, problem in (("", "holds no join token"), ("ok-token\nhas space\n", "line 2: expected one token"),
                         (None, "cannot read it")):
        if bad is None:
            path.unlink()
        else:
            path.write_text(bad)
        clock.now += 1.0
        assert tokens.accepts(b"Bearer gamma-token-long") and not tokens.accepts(b"Bearer ok-token"), problem
        assert problem in caplog.text and "the 1 tokens accepted before stay" in caplog.text
    path.write_text("delta-token\n")
    assert tokens.reload() and tokens.accepts(b"Bearer delta-token")
    assert "join tokens reloaded: 1 tokens" in caplog.text
    assert not any(t in caplog.text for t in ("alpha-token", "gamma-token-long", "delta-token", "has space"))


def test_the_token_file_flag_refuses_a_bad_file_or_a_second_token(tmp_path: Path, capsys: Any) -> None:
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    state_dir = tmp_path / "state"
    empty = tmp_path / "empty"
    empty.write_text("# no tokens yet\n")
    cases = [(["--token-file", str(tmp_path / "missing")], f"--token-file {tmp_path / 'missing'}: cannot read it"),
             (["--token-file", str(empty)], f"--token-file {empty} holds no join token"),
             (["--token-file", str(empty), "--token", "t"], "--token and --token-file exclude each other")]
    for flags, message in cases:
        assert coordinator_cli.main(["--config", str(config), "--state-dir", str(state_dir), "--port", "0", *flags]) == 2
        assert f"rcswarm coordinator: {message}" in capsys.readouterr().err
        assert not state_dir.exists()


def test_a_token_from_the_environment_or_a_flag_is_read_as_a_token_files_line(tmp_path: Path, capsys: Any,
                                                                               monkeypatch: Any) -> None:
    """A Secret written by `echo` ends in a newline: the coordinator took "tok\\n" as its token while every worker's
    metadata was refused ("Illegal header value") until its patience ran out (review of the Helm chart,
    2026-11-28). Both ends strip it; a token with a space or a control character inside is refused by name."""
    from rcswarm.cli.client_flags import client_token

    monkeypatch.setenv("RCSWARM_TOKEN", "tok-1\n")
    assert JoinTokens.from_cli(None, None, "tok-1\n").accepts(b"Bearer tok-1")
    assert client_token(argparse.Namespace(token=None)) == "tok-1"
    assert client_token(argparse.Namespace(token=" tok-2\r\n")) == "tok-2"
    for bad, source in (("tok en", "--token"), ("tok\x1b", "--token")):
        with pytest.raises(ValueError, match=f"the join token of {source}: expected one token of printable ASCII"):
            client_token(argparse.Namespace(token=bad))
    monkeypatch.setenv("RCSWARM_TOKEN", "two tokens\n")
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    assert coordinator_cli.main(["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0"]) == 2
    assert "the join token of $RCSWARM_TOKEN: expected one token" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()
