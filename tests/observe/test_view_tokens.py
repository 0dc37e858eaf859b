"""Read-only view tokens (`--view-token-file`): they open the dashboard and /metrics (bearer and login, sessions tied
to the token that logged in), never gRPC; the join token keeps opening the dashboard; a bad file is told as
`--token-file`'s is. Every server binds 127.0.0.1."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.cli import dht as dht_cli
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.tokens import JoinTokens, ViewTokens, parse_tokens, view_tokens_problem
from rcswarm.observe.dashboard.auth import VIEW_CREDENTIAL, decide_dashboard_auth, token_check
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.state.store import StateStore
from tests.helpers.dht_mirror import spec as mirror_spec
from tests.helpers.specs import tiny_spec, write_spec
from tests.helpers.tls import request

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
JOIN = "join-token-0123456789abcdef"
VIEW = "view-token-0123456789abcdef"
OTHER_VIEW = "view-token-second-0123456789"
GUARDED = ["/", "/api/status", "/metrics", "/api/metrics?since=0", "/plot/loss_step.png"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def login(port: int, token: str) -> dict[str, str]:
    """The session cookie header of a successful login with `token`."""
    status, headers, _ = request(port, "POST", "/login", FORM, f"token={token}")
    assert status == 303, status
    return {"Cookie": headers["Set-Cookie"].split(";", 1)[0]}


def rewrite(path: Path, text: str) -> None:
    """A new content whose stamp differs for sure (the file is looked at again at once: check_every_s=0)."""
    path.write_text(text)
    os.utime(path, ns=(time.time_ns() + 10**9,) * 2)


class Counted:
    """Counts the calls of a token set's `accepts` (the one every check of it goes through)."""

    def __init__(self, tokens: Any) -> None:
        self.calls = 0
        real = tokens.accepts

        def accepts(presented: bytes) -> bool:
            self.calls += 1
            return real(presented)

        tokens.accepts = accepts


@pytest.fixture
def served(tmp_path: Path) -> Any:
    """A coordinator on 127.0.0.1 with a join token file and a view token file, as `rcswarm coordinator
    --token-file J --view-token-file V --http-port 0` starts it (`RunningCoordinator(view_tokens=)`; its dashboard
    requires a token on loopback without being told)."""
    join_file, view_file = tmp_path / "join", tmp_path / "view"
    join_file.write_text(JOIN + "\n")
    view_file.write_text(f"# viewers\n{VIEW}\n{OTHER_VIEW}\n")
    tokens = JoinTokens.from_file(join_file, check_every_s=0.0)
    view_tokens = ViewTokens.from_file(view_file, check_every_s=0.0)  # as read_view_tokens, looked at on every call
    assert view_tokens_problem(view_tokens, tokens) is None
    view_tokens.keep_apart(tokens)
    counted = Counted(view_tokens)
    spec = tiny_spec()
    store = StateStore(tmp_path / "state", spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    running = RunningCoordinator(SwarmCoordinator(spec, store), tokens, http_port=0, view_tokens=view_tokens).start()
    try:
        yield running, view_file, counted
    finally:
        running.stop(grace=0.5)


def grpc_code(port: int, call: str, request_message: Any, token: str) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        try:
            getattr(stub, call)(request_message, timeout=10, metadata=(("authorization", f"Bearer {token}"),))
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def test_a_view_token_opens_the_dashboard_and_metrics_but_never_grpc(served: Any) -> None:
    running, _, counted = served
    port = running.dashboard.port
    for path in GUARDED:
        assert request(port, "GET", path)[0] == 401, path
        assert request(port, "GET", path, bearer(VIEW))[0] == 200, path
        assert request(port, "GET", path, bearer(JOIN))[0] == 200, f"{path}: the join token opens it as before"
        assert request(port, "GET", path, bearer(VIEW + "x"))[0] == 401, path
    session = login(port, VIEW)
    status, headers, body = request(port, "GET", "/metrics", session)
    assert status == 200 and b"rcswarm_" in body, "a view token's login session reads /metrics"
    assert request(port, "GET", "/api/status", login(port, JOIN))[0] == 200
    page = request(port, "GET", "/login")[2]
    assert b"View token or join token" in page and VIEW_CREDENTIAL.encode() in page
    asked = counted.calls
    assert asked > 0, "the dashboard asks the view tokens"

    # gRPC: the view token cannot join, nor read GetStatus, and the guard never even asks the view tokens.
    joined = pb.JoinRequest(worker_name="viewer", device="cpu", pid=1)
    assert grpc_code(running.port, "Join", joined, VIEW) == grpc.StatusCode.UNAUTHENTICATED
    assert grpc_code(running.port, "GetStatus", pb.GetStatusRequest(), VIEW) == grpc.StatusCode.UNAUTHENTICATED
    assert grpc_code(running.port, "GetStatus", pb.GetStatusRequest(), JOIN) == grpc.StatusCode.OK
    assert counted.calls == asked, "the gRPC token check saw a view token"


def test_a_view_token_removed_from_its_file_voids_its_session(served: Any) -> None:
    running, view_file, _ = served
    port = running.dashboard.port
    removed, kept, joined = login(port, VIEW), login(port, OTHER_VIEW), login(port, JOIN)
    for session in (removed, kept, joined):
        assert request(port, "GET", "/api/status", session)[0] == 200
    rewrite(view_file, f"# {VIEW[:4]}... revoked\n{OTHER_VIEW}\n")
    assert request(port, "GET", "/api/status", removed)[0] == 401, "the removed token's session outlived it"
    assert request(port, "GET", "/metrics", bearer(VIEW))[0] == 401
    assert request(port, "GET", "/api/status", kept)[0] == 200, "another view token's session lives on"
    assert request(port, "GET", "/api/status", joined)[0] == 200, "a join token's session is not the view file's"
    status, _, page = request(port, "POST", "/login", FORM, f"token={VIEW}")
    assert status == 401 and b"Wrong token" in page
    rewrite(view_file, "")  # an emptied file is not taken: the tokens before stay (as --token-file)
    assert request(port, "GET", "/api/status", kept)[0] == 200


def test_a_reload_that_would_put_a_token_in_both_files_is_refused(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Checked at start only, a token added to the other file later became a "view" token that joins (or a join
    token the view file also lists): now such a reload of either file (a change, or SIGHUP's `reload`) is refused as
    a bad file is, the tokens before kept, a WARNING naming the file and no token. A token moved from one file to
    the other in one go is taken whichever file is looked at first."""
    join_file, view_file = tmp_path / "join", tmp_path / "view"
    join_file.write_text(JOIN + "\n")
    view_file.write_text(f"{VIEW}\n{OTHER_VIEW}\n")
    join = JoinTokens.from_file(join_file, check_every_s=0.0)
    view = ViewTokens.from_file(view_file, check_every_s=0.0)  # both looked at on every call
    view.keep_apart(join)  # what `rcswarm coordinator` does (`read_view_tokens`)
    with caplog.at_level(logging.WARNING, logger="rcswarm.coordinator"):
        rewrite(view_file, f"{VIEW}\n{OTHER_VIEW}\n{JOIN}\n")  # the join token added to the view file
        assert view.accepts_token(VIEW) and not view.accepts_token(JOIN), "the join token became a view token"
        rewrite(join_file, f"{JOIN}\n{VIEW}\n")  # a view token added to the join file
        assert join.accepts_token(JOIN) and not join.accepts_token(VIEW), "a view token became a join token"
        assert not join.reload() and not view.reload(), "SIGHUP took a token into both"
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum(f"view tokens not reloaded: --view-token-file {view_file}: 1 of its tokens is also accepted as join "
               "tokens" in line for line in said) == 2, said
    assert sum(f"join tokens not reloaded: --token-file {join_file}: 1 of its tokens is also a view token "
               f"(--view-token-file {view_file})" in line for line in said) == 2, said
    assert not any(token in line for line in said for token in (JOIN, VIEW, OTHER_VIEW)), said
    assert (len(join), len(view)) == (1, 2)

    # VIEW moved to the join file, both files written at once, the join file looked at first: taken.
    rewrite(view_file, f"{OTHER_VIEW}\n")
    rewrite(join_file, f"{JOIN}\n{VIEW}\n")
    assert join.accepts_token(VIEW) and not view.accepts_token(VIEW) and view.accepts_token(OTHER_VIEW)
    # And back, the view file looked at first.
    rewrite(join_file, f"{JOIN}\n")
    rewrite(view_file, f"{OTHER_VIEW}\n{VIEW}\n")
    assert view.accepts_token(VIEW) and not join.accepts_token(VIEW)


def test_the_mirrors_view_tokens_never_take_its_join_token_in_a_reload(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RCSWARM_TOKEN", JOIN)
    view_file = tmp_path / "view"
    view_file.write_text(VIEW + "\n")
    view = dht_cli.read_view_tokens(view_file)
    rewrite(view_file, f"{VIEW}\n{JOIN}\n")
    assert not view.reload(), "$RCSWARM_TOKEN became a view token"
    assert view.accepts_token(VIEW) and not view.accepts_token(JOIN) and len(view) == 1
    rewrite(view_file, f"{OTHER_VIEW}\n")
    assert view.reload() and view.accepts_token(OTHER_VIEW)


def test_view_tokens_make_the_dashboard_require_a_token_and_contradict_an_open_one(tmp_path: Path) -> None:
    """`RunningCoordinator(view_tokens=)` builds the dashboard's check itself (it was swapped in afterwards by
    cli/coordinator.py); http_token_required=False with view tokens is a contradiction, not an open dashboard."""
    spec = tiny_spec()
    store = StateStore(tmp_path / "state", spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    coordinator = SwarmCoordinator(spec, store)
    with pytest.raises(ValueError, match="contradict"):
        RunningCoordinator(coordinator, JOIN, http_port=0, http_token_required=False, view_tokens=ViewTokens([VIEW]))
    with pytest.raises(ValueError, match="need http_port"):
        RunningCoordinator(coordinator, JOIN, view_tokens=ViewTokens([VIEW]))
    running = RunningCoordinator(coordinator, JOIN, http_port=0, view_tokens=ViewTokens([VIEW])).start()
    try:
        auth = running.dashboard.auth
        assert auth is not None and auth.credential == VIEW_CREDENTIAL
        assert auth.token_ok(VIEW) and auth.token_ok(JOIN) and not auth.token_ok("neither-0123456789")
        port = running.dashboard.port
        assert request(port, "GET", "/metrics")[0] == 401, "view tokens require a token on loopback too"
        assert request(port, "GET", "/metrics", bearer(VIEW))[0] == 200
        joined = pb.JoinRequest(worker_name="viewer", device="cpu", pid=1)
        assert grpc_code(running.port, "Join", joined, VIEW) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        running.stop(grace=0.5)
    assert not hasattr(coordinator_cli, "admit_view_tokens")


# -- the pure rules


@pytest.mark.parametrize(("host", "required", "insecure", "https", "expected", "warning"), [
    ("127.0.0.1", False, False, False, True, None),            # view tokens require a token on loopback too
    ("::1", True, False, False, True, None),
    ("0.0.0.0", False, False, True, True, None),
    ("0.0.0.0", False, False, False, True, "over plain HTTP"),
])
def test_view_tokens_require_a_token_wherever_the_dashboard_binds(host: str, required: bool, insecure: bool,
                                                                  https: bool, expected: bool,
                                                                  warning: str | None) -> None:
    needed, said = decide_dashboard_auth(host, required, insecure, https, view_tokens=True)
    assert needed is expected
    assert said is None if warning is None else warning in said
    assert decide_dashboard_auth("127.0.0.1", False, False) == (False, None), "without view tokens: as before"


def test_view_tokens_and_an_open_dashboard_contradict_each_other() -> None:
    with pytest.raises(ValueError, match="--view-token-file and --http-insecure contradict"):
        decide_dashboard_auth("0.0.0.0", False, True, view_tokens=True)


def test_the_dashboards_check_takes_either_kind_and_asks_both() -> None:
    asked: list[str] = []

    def kind(name: str, token: str) -> Any:
        def check(presented: str) -> bool:
            asked.append(name)
            return presented == token
        return check

    check = token_check(kind("join", JOIN), None, kind("view", VIEW))
    assert check(JOIN) and check(VIEW) and not check("neither")
    assert asked == ["join", "view"] * 3, "every kind is asked, none cut short"
    with pytest.raises(ValueError):
        token_check(None, None)


# -- bad files: told as --token-file's


def _coordinator_err(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    code = coordinator_cli.main(["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0",
                                 "--http-port", "0", *flags])
    assert not (tmp_path / "state").exists(), "nothing is created before the token files are read"
    return code, capsys.readouterr().err


def test_a_missing_or_empty_view_token_file_stops_the_coordinator_as_a_token_file_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    join_file, missing, empty = tmp_path / "join", tmp_path / "no-such-file", tmp_path / "empty"
    join_file.write_text(JOIN + "\n")
    empty.write_text("# none yet\n\n")
    code, err = _coordinator_err(tmp_path, capsys, "--token-file", str(missing))
    assert code == 2 and f"--token-file {missing}: cannot read it (No such file or directory)" in err, err
    code, err = _coordinator_err(tmp_path, capsys, "--token-file", str(join_file), "--view-token-file", str(missing))
    assert code == 2 and f"--view-token-file {missing}: cannot read it (No such file or directory)" in err, err
    code, err = _coordinator_err(tmp_path, capsys, "--token-file", str(join_file), "--view-token-file", str(empty))
    assert code == 2 and f"--view-token-file {empty} holds no view token: expected one token per line" in err, err
    # A view token that is also a join token could join: refused, naming no token.
    join_file.write_text(f"{JOIN}\n{VIEW}\n")
    (tmp_path / "view").write_text(VIEW + "\n")
    code, err = _coordinator_err(tmp_path, capsys, "--token-file", str(join_file), "--view-token-file",
                                 str(tmp_path / "view"))
    assert code == 2 and "1 of its tokens is also accepted as join tokens" in err and VIEW not in err, err


def test_the_view_token_flags_are_checked_before_anything_starts(tmp_path: Path) -> None:
    config = write_spec(tiny_spec(), tmp_path / "run.toml")

    def problem(*flags: str) -> str | None:
        args = coordinator_cli.parse_args(["--config", str(config), "--state-dir", str(tmp_path / "state"), *flags])
        return coordinator_cli._argument_problem(args)

    assert problem("--view-token-file", "v") == "--view-token-file: only with --http-port (view tokens open the " \
                                                "dashboard, nothing else)"
    assert problem("--view-token-file", "", "--http-port", "0") == "--view-token-file '': expected a path"
    assert "contradict" in (problem("--view-token-file", "v", "--http-port", "0", "--http-host", "0.0.0.0",
                                    "--http-insecure", "--host", "0.0.0.0", "--insecure") or "")
    assert problem("--view-token-file", "v", "--http-port", "0") is None
    # Off loopback a view token over plain HTTP is refused as the join token is (then --http-plaintext lets it).
    tls = ["--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem")]
    off = ["--host", "0.0.0.0", *tls, "--http-port", "8080", "--http-host", "0.0.0.0", "--view-token-file", "v"]
    assert "--http-plaintext" in (problem(*off) or "")
    assert problem(*off, "--http-plaintext") is None and problem(*off, "--http-tls") is None


def test_a_short_or_overlong_view_token_is_told_as_a_token_files(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    view_file = tmp_path / "view"
    view_file.write_text(f"# viewers\nabc\n{VIEW}\n")
    with caplog.at_level(logging.WARNING):
        tokens = ViewTokens.from_file(view_file)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and f"the view token of --view-token-file {view_file} line 2" in said[0], said
    assert "fewer than 16" in said[0] and "abc" not in said[0].replace("characters", "")
    assert tokens.accepts_token("abc") and tokens.accepts_token(VIEW) and len(tokens) == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the join token file's warning, for comparison: the same words
        parse_tokens("abc\n", "--token-file t")
    (joined,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert joined.replace("the join token of --token-file t", "X") == said[0].replace(
        f"the view token of --view-token-file {view_file}", "X").replace("line 2", "line 1")
    view_file.write_text("z" * 5000 + "\n")
    with pytest.raises(ValueError, match=r"--view-token-file .* line 1 has 5000 characters, more than 4096") as info:
        ViewTokens.from_file(view_file)
    assert "zzz" not in str(info.value)


def test_view_tokens_are_not_join_tokens() -> None:
    """The gRPC guard takes JoinTokens: a ViewTokens is none (no subclass), so it cannot be handed one by mistake."""
    view = ViewTokens([VIEW])
    assert not isinstance(view, JoinTokens)
    assert view_tokens_problem(view, JoinTokens([JOIN])) is None
    assert "also accepted as join tokens" in (view_tokens_problem(view, JoinTokens([JOIN, VIEW])) or "")


# -- rcswarm dht: view tokens alone, without $RCSWARM_TOKEN


def test_the_mirrors_dashboard_takes_view_tokens_without_the_join_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("RCSWARM_TOKEN", raising=False)
    view_file = tmp_path / "view"
    view_file.write_text(VIEW + "\n")
    config = str(write_spec(mirror_spec(), tmp_path / "run.toml"))
    flags = ["--config", config, "--state-dir", str(tmp_path / "state"), "--http-port", "0"]
    # Off loopback without $RCSWARM_TOKEN: refused unless view tokens are given (then the plain-HTTP rule applies).
    off = [*flags, "--http-host", "0.0.0.0"]
    assert "requires a token: set $RCSWARM_TOKEN or give --view-token-file" in (
        dht_cli._argument_problem(dht_cli.parser().parse_args(off)) or "")
    with_view = dht_cli.parser().parse_args([*off, "--view-token-file", str(view_file)])
    assert "would take its view tokens over plain HTTP" in (dht_cli._argument_problem(with_view) or "")
    assert dht_cli._argument_problem(dht_cli.parser().parse_args(
        [*off, "--view-token-file", str(view_file), "--http-plaintext"])) is None
    assert dht_cli.main(["--view-token-file", str(view_file)]) == 2
    assert "--view-token-file: only with --http-port" in capsys.readouterr().err
    assert dht_cli.main([*flags, "--view-token-file", str(tmp_path / "missing")]) == 2
    assert f"--view-token-file {tmp_path / 'missing'}: cannot read it" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()

    dht_cli.Mirror(mirror_spec(), tmp_path / "state").close()  # a mirrored state dir
    args = dht_cli.parser().parse_args([*flags, "--view-token-file", str(view_file)])
    view_tokens = dht_cli.read_view_tokens(args.view_token_file)
    dashboard = dht_cli.start_dashboard(args, view_tokens)
    try:
        port = dashboard.port
        assert request(port, "GET", "/metrics")[0] == 401, "view tokens require a token on loopback too"
        assert request(port, "GET", "/metrics", bearer(VIEW))[0] == 200
        assert request(port, "GET", "/api/status", login(port, VIEW))[0] == 200
        assert request(port, "GET", "/api/status", bearer(JOIN))[0] == 401
    finally:
        dashboard.stop()
        dashboard.coordinator.close()
    # $RCSWARM_TOKEN as a Secret writes it, with a newline: its token opens the mirror's dashboard (it was compared
    # with the newline and never matched, while the view tokens were kept apart from it stripped).
    monkeypatch.setenv("RCSWARM_TOKEN", JOIN + "\n")
    dashboard = dht_cli.start_dashboard(args, view_tokens)
    try:
        assert request(dashboard.port, "GET", "/api/status", bearer(JOIN))[0] == 200
        assert request(dashboard.port, "GET", "/api/status", bearer(VIEW))[0] == 200
    finally:
        dashboard.stop()
        dashboard.coordinator.close()


def test_the_mirror_refuses_a_view_token_that_is_its_join_token(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RCSWARM_TOKEN", VIEW + "\n")
    view_file = tmp_path / "view"
    view_file.write_text(VIEW + "\n")
    with pytest.raises(ValueError, match="also accepted as join tokens"):
        dht_cli.read_view_tokens(view_file)
    monkeypatch.setenv("RCSWARM_TOKEN", JOIN)
    assert dht_cli.read_view_tokens(view_file).accepts_token(VIEW)


def test_a_reload_refused_for_the_other_files_token_is_taken_once_that_file_lets_it_go(tmp_path: Path) -> None:
    """A token moved between the two files one edit at a time (two Secrets refreshed apart): the second file's reload
    was refused while the first still held the token, and its stamp recorded, so once the first let the token go the
    second file was never read again (a review, 2026-11-29): the moved token opened nothing until a SIGHUP."""
    join_file, view_file = tmp_path / "join", tmp_path / "view"
    join_file.write_text(JOIN + "\n")
    view_file.write_text(f"{VIEW}\n{OTHER_VIEW}\n")
    join = JoinTokens.from_file(join_file, check_every_s=0.0)
    view = ViewTokens.from_file(view_file, check_every_s=0.0)
    view.keep_apart(join)
    rewrite(join_file, f"{JOIN}\n{VIEW}\n")  # VIEW added to the join file first: refused, the view file holds it
    assert not join.accepts_token(VIEW) and view.accepts_token(VIEW)
    rewrite(view_file, f"{OTHER_VIEW}\n")  # then let go from the view file
    assert not view.accepts_token(VIEW)
    assert join.accepts_token(VIEW), "the join file's refused reload was never retried"
    # And the other way round: a join token moved to the view file, the view file edited first.
    rewrite(view_file, f"{OTHER_VIEW}\n{JOIN}\n")
    assert not view.accepts_token(JOIN)
    rewrite(join_file, f"{VIEW}\n")
    assert not join.accepts_token(JOIN)
    assert view.accepts_token(JOIN), "the view file's refused reload was never retried"
