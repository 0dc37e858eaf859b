"""The dashboard's defences found by the review of its server on 127.0.0.1: sessions that outlive their token, the
token over plain HTTP off loopback, one client holding every connection, missing security headers, unthrottled
token guessing, and /metrics' content type. Every server here binds 127.0.0.1; 127.0.0.2 is only a client's source
address (Linux routes all of 127/8 to loopback)."""

from __future__ import annotations

import http.client
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.tokens import JoinTokens
from rcswarm.observe.dashboard import Dashboard
from rcswarm.observe.dashboard.auth import COOKIE, SessionAuth, decide_dashboard_auth
from rcswarm.protos.wire import one_token
from rcswarm.state.store import StateStore
from tests.helpers.dashboard import held_open
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.tls import request
from tests.helpers.waiting import wait_for

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
# What the fix sends (observe/dashboard/server.py's CONTENT_SECURITY_POLICY, spelled out: what the page needs).
CSP = ("default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")


def login(port: int, token: str, **kwargs: Any) -> tuple[int, http.client.HTTPMessage, bytes]:
    return request(port, "POST", "/login", FORM, f"token={token}", **kwargs)


def session_of(headers: http.client.HTTPMessage) -> str:
    """The `name=value` of a login's Set-Cookie."""
    return headers["Set-Cookie"].split(";", 1)[0]


# -- 1. sessions live while their token is accepted; POST /logout

def test_a_session_dies_when_its_token_is_rotated_out_and_at_logout(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    old, new = "old-token-aaaaaaaaaaaaaaaa", "new-token-bbbbbbbbbbbbbbbbbbbb"
    token_file.write_text(old + "\n")
    tokens = JoinTokens.from_file(token_file, check_every_s=0.0)
    spec = tiny_spec()
    store = StateStore(tmp_path / "state", spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    running = RunningCoordinator(SwarmCoordinator(spec, store), tokens, http_port=0, http_token_required=True).start()
    try:
        port = running.dashboard.port
        status, headers, _ = login(port, old)
        assert status == 303
        cookie = {"Cookie": session_of(headers)}
        assert request(port, "GET", "/api/status", cookie)[0] == 200

        token_file.write_text(f"# rotated\n{new}\n")  # the old token removed, as docs/DEPLOY.md rotates it
        os.utime(token_file, ns=(time.time_ns() + 10**9,) * 2)
        assert request(port, "GET", "/api/status", cookie)[0] == 401, "the old token's session outlived its token"
        assert request(port, "GET", "/api/status", {"Authorization": f"Bearer {old}"})[0] == 401
        status, headers, _ = login(port, new)
        assert status == 303
        fresh = {"Cookie": session_of(headers)}
        assert request(port, "GET", "/api/status", fresh)[0] == 200
        status, _, page = request(port, "GET", "/", fresh)
        assert status == 200 and b'<form method="post" action="/logout"' in page, "a logged-in page offers logout"
        bearer_page = request(port, "GET", "/", {"Authorization": f"Bearer {new}"})[2]
        assert b'action="/logout"' not in bearer_page, "a bearer request has no session to end"

        assert request(port, "GET", "/logout", fresh)[0] == 405, "logging out takes a POST"
        foreign = {**fresh, "Origin": "https://attacker.example"}
        assert request(port, "POST", "/logout", foreign)[0] == 403
        assert request(port, "GET", "/api/status", fresh)[0] == 200, "another site's POST ended no session"
        status, headers, _ = request(port, "POST", "/logout", {"Origin": "null"})
        assert status == 303 and headers.get("Set-Cookie") is None, "a request without the cookie clears nothing"
        # The page's form: Referrer-Policy no-referrer makes a browser send `Origin: null` on its POST.
        status, headers, _ = request(port, "POST", "/logout", {**fresh, "Origin": "null"})
        assert status == 303 and headers["Location"] == "/login"
        assert headers["Set-Cookie"].startswith(f"{COOKIE}=;") and "Max-Age=0" in headers["Set-Cookie"]
        assert request(port, "GET", "/api/status", fresh)[0] == 401, "a logged-out session is void"
        status, headers, _ = login(port, new)
        again = {"Cookie": session_of(headers)}
        status, _, _ = request(port, "POST", "/logout", {**again, "Origin": f"http://127.0.0.1:{port}"})
        assert status == 303 and request(port, "GET", "/api/status", again)[0] == 401
    finally:
        running.stop(grace=0.5)


def test_sessions_are_bounded_and_bound_to_their_token() -> None:
    accepted = {"alpha-token-0123456789", "beta-token-0123456789"}
    auth = SessionAuth(lambda token: token in accepted, max_sessions=3)
    first = auth.new_cookie("alpha-token-0123456789")
    second = auth.new_cookie("beta-token-0123456789")
    assert auth.cookie_ok(first) and auth.cookie_ok(second)
    accepted.discard("alpha-token-0123456789")
    assert not auth.cookie_ok(first) and auth.cookie_ok(second)
    for _ in range(3):
        auth.new_cookie("beta-token-0123456789")
    assert auth.sessions == 3 and not auth.cookie_ok(second), "the oldest session is forgotten past the cap"
    third = auth.new_cookie("beta-token-0123456789")
    assert auth.end_session(third) and not auth.cookie_ok(third) and not auth.end_session(third)


# -- 2. the token over plain HTTP off loopback is refused unless the operator opts out

@pytest.mark.parametrize("host, required, https, grpc_plaintext, http_plaintext, refused", [
    ("127.0.0.1", True, False, False, False, False),      # loopback: the token never leaves the machine
    ("::1", True, False, False, False, False),
    ("0.0.0.0", False, False, False, False, False),       # --http-insecure: no token to steal (its own warning)
    ("0.0.0.0", True, True, False, False, False),         # --http-tls
    ("0.0.0.0", True, False, True, False, False),         # gRPC --insecure: plaintext already (the chart without TLS)
    ("0.0.0.0", True, False, False, True, False),         # --http-plaintext: a TLS proxy in front
    ("0.0.0.0", True, False, False, False, True),
    ("192.168.1.10", True, False, False, False, True),
    ("dashboard.example.com", True, False, False, False, True),
])
def test_the_dashboards_transport_rule(host: str, required: bool, https: bool, grpc_plaintext: bool,
                                       http_plaintext: bool, refused: bool) -> None:
    from rcswarm.observe.dashboard.auth import dashboard_transport_problem

    problem = dashboard_transport_problem(host, required, https, grpc_plaintext, http_plaintext)
    assert (problem is not None) is refused
    if refused:
        assert "--http-tls" in problem and "--http-plaintext" in problem and "\n" not in problem


def _flags_problem(tmp_path: Path, *flags: str) -> str | None:
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    args = coordinator_cli.parse_args(["--config", str(config), "--state-dir", str(tmp_path / "state"), *flags])
    return coordinator_cli._argument_problem(args)


def test_the_coordinator_refuses_the_token_over_plain_http_off_loopback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: nothing could be bound even by mistake.
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    quick = tmp_path / "tls"
    code = coordinator_cli.main(["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0",
                                 "--token", TOKEN, "--tls-self-signed", str(quick), "--http-port", "0",
                                 "--http-host", "192.0.2.1", "--port-file", str(tmp_path / "p.json")])
    assert code == 2
    err = capsys.readouterr().err
    assert "plain HTTP" in err and "--http-tls" in err and "--http-plaintext" in err
    assert not (tmp_path / "state").exists() and not (tmp_path / "p.json").exists() and not quick.exists()
    # The opt-outs and the chart's two set-ups (gRPC --insecure; TLS with --http-tls) pass the rule.
    tls = ["--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem")]
    dashboard = ["--http-port", "8080", "--http-host", "0.0.0.0"]
    assert _flags_problem(tmp_path, "--host", "0.0.0.0", "--insecure", *dashboard) is None
    assert _flags_problem(tmp_path, "--host", "0.0.0.0", *tls, *dashboard, "--http-tls") is None
    assert _flags_problem(tmp_path, "--host", "0.0.0.0", *tls, *dashboard, "--http-plaintext") is None
    assert _flags_problem(tmp_path, *dashboard, "--http-insecure") is None
    assert "--http-plaintext" in (_flags_problem(tmp_path, "--host", "0.0.0.0", *tls, *dashboard) or "")
    assert "contradict" in (_flags_problem(tmp_path, *tls, *dashboard, "--http-tls", "--http-plaintext") or "")
    # decide_dashboard_auth (which rcswarm dht shares) keeps its warning for an opted-out plain HTTP dashboard.
    assert "plain HTTP" in (decide_dashboard_auth("0.0.0.0", False, False, False)[1] or "")


# -- 3. one client address cannot hold every connection; a request must arrive within its own deadline

def _trickler(port: int, source: str) -> socket.socket | None:
    """A connection from `source` that sends a request line and then nothing more (a slowloris client)."""
    connection = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    connection.settimeout(5)
    try:
        connection.bind((source, 0))
        connection.connect(("127.0.0.1", port))
        connection.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
    except OSError:
        connection.close()
        return None
    return connection


def test_one_address_trickling_many_connections_leaves_others_served(
        swarm: Any, caplog: pytest.LogCaptureFixture) -> None:
    short = Dashboard(swarm.service, max_connections=6, max_connections_per_address=3, header_deadline_s=1.0,
                      request_deadline_s=30.0).start()
    held: list[socket.socket] = []
    try:
        with caplog.at_level(logging.INFO, logger="rcswarm.dashboard"):
            started = time.monotonic()
            for _ in range(10):
                connection = _trickler(short.port, "127.0.0.2")
                if connection is not None:
                    held.append(connection)
            took = time.monotonic()
            status, headers, body = request(short.port, "GET", "/healthz")
            assert status == 200 and body == b"ok\n" and time.monotonic() - took < 2.0, "a client from 127.0.0.1 waits"
            assert short.server._per_address.get("127.0.0.2", 0) <= 3
            # The attacker's connections are cut at the request's deadline (1 s), long before the connection's (30 s).
            wait_for(lambda: not any(held_open(connection) for connection in held), 10, "the trickling requests cut")
            assert time.monotonic() - started < 8.0
        refused = [r.getMessage() for r in caplog.records if "from 127.0.0.2 open already" in r.getMessage()]
        assert len(refused) == 1, refused  # 7 refused connections, one log line (LOG_EVERY_S)
        cut = [r.getMessage() for r in caplog.records if "passed its 1 s deadline" in r.getMessage()]
        assert len(cut) == 1, cut
    finally:
        for connection in held:
            connection.close()
        short.stop()


def test_the_log_limiter_counts_what_it_leaves_out() -> None:
    from rcswarm.observe.dashboard.server import LogLimiter

    now = [0.0]
    limiter = LogLimiter(10.0, clock=lambda: now[0])
    assert limiter.allow("401") == 0
    assert [limiter.allow("401") for _ in range(3)] == [None] * 3
    assert limiter.allow("refused") == 0, "each kind has its own allowance"
    now[0] = 10.0
    assert limiter.allow("401") == 3


# -- 4. security headers on every answer, no Python version in Server

def _raw(port: int, data: bytes) -> tuple[int, http.client.HTTPMessage, bytes]:
    """The answer to raw bytes (a request http.client will not send), as `request` gives it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(data)
        response = http.client.HTTPResponse(connection)
        response.begin()
        return response.status, response.headers, response.read()


def test_every_answer_carries_the_security_headers(start_coordinator: Any, tmp_path: Path) -> None:
    from rcswarm.coordinator import TLSFiles
    from rcswarm.coordinator.tls import ensure_quick_start
    from tests.helpers.tls import QUICK_NAMES

    local = start_coordinator(tiny_spec(), http_port=0, http_token_required=True)
    port = local.running.dashboard.port
    answers = {
        "/ (401)": request(port, "GET", "/"),
        "/login": request(port, "GET", "/login"),
        "/api/status (401)": request(port, "GET", "/api/status"),
        "/ (200)": request(port, "GET", "/", {"Authorization": f"Bearer {TOKEN}"}),
        "PUT (405)": request(port, "PUT", "/"),
        "an unknown method (501)": _raw(port, b"BREW / HTTP/1.0\r\n\r\n"),
    }
    assert answers["an unknown method (501)"][0] == 501
    assert answers["/ (401)"][0] == 401 and answers["/ (200)"][0] == 200 and answers["/login"][0] == 200
    for name, (_, headers, _) in answers.items():
        assert headers["Content-Security-Policy"] == CSP, name
        assert headers["X-Frame-Options"] == "DENY" and headers["Referrer-Policy"] == "no-referrer", name
        assert headers["X-Content-Type-Options"] == "nosniff", name
        assert headers["Server"] == "rcswarm-dashboard", name  # no "Python/3.x"
        assert "Strict-Transport-Security" not in headers, name
    # What the page needs is within the policy: an inline <style>, its own plots and forms, no script.
    page = answers["/ (200)"][2]
    assert b"<script" not in page and b"<style>" in page and b' src="/plot/' in page and b'src="http' not in page

    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    secure = start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key), http_port=0, http_tls=True,
                               http_token_required=True)
    for path in ("/", "/login"):
        _, headers, _ = request(secure.running.dashboard.port, "GET", path, ca=quick.ca)
        assert headers["Strict-Transport-Security"] == "max-age=31536000", path
        assert headers["Content-Security-Policy"] == CSP, path


# -- 5. failed token attempts back off per address; a short token draws a warning

def test_the_login_throttle_backs_off_per_address_and_stays_bounded() -> None:
    from rcswarm.observe.dashboard.auth import LoginThrottle, Verdict

    now = [1000.0]
    throttle = LoginThrottle(clock=lambda: now[0], free=3, first_s=2.0, max_s=16.0, forgotten_s=600.0,
                             max_addresses=4)
    assert [throttle.failed("10.0.0.1") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [throttle.failed("10.0.0.1") for _ in range(5)] == [2.0, 4.0, 8.0, 16.0, 16.0]
    assert throttle.wait_s("10.0.0.1") == 16.0 and throttle.wait_s("10.0.0.2") == 0.0
    now[0] += 16.0
    assert throttle.wait_s("10.0.0.1") == 0.0
    assert throttle.failed("10.0.0.1") == 16.0, "the backoff goes on until the failures are forgotten"
    now[0] += 600.0
    assert throttle.wait_s("10.0.0.1") == 0.0 and throttle.failed("10.0.0.1") == 0.0
    for index in range(100):
        throttle.failed(f"10.1.0.{index}")
    assert len(throttle) == 4, "the table is capped"

    auth = SessionAuth(lambda token: token == TOKEN, throttle=LoginThrottle(clock=lambda: now[0], free=2, first_s=5.0))
    assert [auth.attempt("wrong", "10.0.0.9") for _ in range(3)] == [Verdict.DENIED] * 3
    assert auth.attempt(TOKEN, "10.0.0.9") is Verdict.THROTTLED, "not even the right token is compared meanwhile"
    assert auth.attempt(TOKEN, "10.0.0.8") is Verdict.ALLOWED, "another address is not held back"
    now[0] += 5.0
    assert auth.attempt(TOKEN, "10.0.0.9") is Verdict.ALLOWED
    assert auth.attempt("wrong", "10.0.0.9") is Verdict.DENIED, "a success clears the address's failures"


def test_concurrent_guesses_of_one_address_get_no_more_comparisons_than_sequential_ones() -> None:
    """An address's connections at once (16 may be open) all checked the backoff before any recorded its failure:
    each got its guess compared whenever a backoff ended (16 of 16, a review 2026-11-29; sequentially 1). The
    attempt is now taken under the throttle's lock, counted as failed before the comparison."""
    import threading

    from rcswarm.observe.dashboard.auth import LoginThrottle, Verdict

    def slow_check(token: str) -> bool:  # a check that re-reads a token file: the comparison takes a while
        time.sleep(0.002)
        return token == TOKEN

    now = [0.0]
    auth = SessionAuth(slow_check, throttle=LoginThrottle(clock=lambda: now[0], free=5))

    def at_once(token: str, address: str, count: int = 16) -> list[Verdict]:
        barrier, verdicts = threading.Barrier(count), []

        def guess() -> None:
            barrier.wait()
            verdicts.append(auth.attempt(token, address))

        threads = [threading.Thread(target=guess) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10.0)
        assert len(verdicts) == count
        return verdicts

    # A fresh address: its first burst is compared (at most its 16 connections), and earns the longest backoff.
    first = at_once("guess", "10.0.0.9")
    assert first.count(Verdict.DENIED) + first.count(Verdict.THROTTLED) == 16 and first.count(Verdict.DENIED) >= 1
    assert auth.throttle.wait_s("10.0.0.9") > 0
    for _ in range(3):
        now[0] += 301.0  # the backoff (300 s at most) has passed
        verdicts = at_once("guess", "10.0.0.9")
        assert verdicts.count(Verdict.DENIED) == 1 and verdicts.count(Verdict.THROTTLED) == 15, verdicts
    now[0] += 301.0
    verdicts = at_once(TOKEN, "10.0.0.9")  # the right token, 16 times at once, after failures: one compared
    assert verdicts.count(Verdict.ALLOWED) == 1 and verdicts.count(Verdict.THROTTLED) == 15, verdicts
    assert auth.attempt("guess", "10.0.0.9") is Verdict.DENIED, "a success clears the address's failures"
    assert auth.throttle.wait_s("10.0.0.9") == 0.0
    # An address without failures is never held back: 16 right tokens at once are all allowed (counted as failures
    # before their comparison, 10 of 16 were throttled: a review, 2026-11-29), and leave no record behind.
    verdicts = at_once(TOKEN, "10.0.0.10")
    assert verdicts.count(Verdict.ALLOWED) == 16, verdicts
    assert auth.throttle.wait_s("10.0.0.10") == 0.0 and len(auth.throttle) == 1


def test_the_dashboard_answers_429_to_a_guessing_address(swarm: Any) -> None:
    from rcswarm.observe.dashboard.auth import LoginThrottle

    now = [0.0]
    auth = SessionAuth(JoinTokens([TOKEN]).accepts_token,
                       throttle=LoginThrottle(clock=lambda: now[0], free=3, first_s=30.0))
    guarded = Dashboard(swarm.service, auth=auth).start()
    try:
        port = guarded.port
        assert [login(port, f"guess{index}")[0] for index in range(3)] == [401] * 3
        assert request(port, "GET", "/api/status", {"Authorization": "Bearer guess3"})[0] == 401, "bearer guesses count"
        status, headers, page = login(port, TOKEN)
        assert status == 429 and int(headers["Retry-After"]) == 30 and b"Too many failed attempts" in page
        assert headers.get("Set-Cookie") is None
        status, headers, _ = request(port, "GET", "/api/status", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 429 and headers["Retry-After"] == "30"
        assert request(port, "GET", "/healthz")[0] == 200, "the probe is never throttled"
        now[0] += 30.0
        status, headers, _ = login(port, TOKEN)
        assert status == 303
        assert request(port, "GET", "/api/status", {"Cookie": session_of(headers)})[0] == 200
    finally:
        guarded.stop()


def test_a_short_token_draws_a_warning_not_a_refusal(caplog: pytest.LogCaptureFixture) -> None:
    MIN_TOKEN_CHARS = 16  # protos.wire.MIN_TOKEN_CHARS
    with caplog.at_level(logging.WARNING):
        assert one_token("abc\n", "--token") == "abc"
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "--token" in said[0] and f"fewer than {MIN_TOKEN_CHARS}" in said[0]
    assert "abc" not in said[0].replace("characters", ""), "the warning never holds the token"
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        one_token("x" * MIN_TOKEN_CHARS, "$RCSWARM_TOKEN")
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_short_token_in_a_token_file_draws_a_warning_naming_its_line(caplog: pytest.LogCaptureFixture) -> None:
    """--token-file (what the chart passes) warns as --token does: the file and line, never the token; once per
    token (before: no warning at all)."""
    from rcswarm.coordinator.tokens import parse_tokens

    long = "y" * 16
    with caplog.at_level(logging.WARNING):
        assert parse_tokens(f"# tokens\nabc\n{long}\nabc\n", "--token-file t.txt") == ("abc", long)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "--token-file t.txt line 2" in said[0] and "fewer than 16" in said[0], said
    assert "abc" not in said[0]


# -- 6. /metrics negotiates its format

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def test_metrics_negotiate_their_format_and_parse(swarm: Any) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    port = swarm.running.dashboard.port
    status, headers, body = request(port, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    plain = {family.name: family for family in parse_text(body.decode())}
    assert plain and any(family.samples for family in plain.values())
    status, headers, body = request(port, "GET", "/metrics", {"Accept": PROMETHEUS_ACCEPT})
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert text.endswith("# EOF\n")
    families = {family.name: family for family in parse_openmetrics(text)}
    assert set(families) and any(family.samples for family in families.values())
    status, headers, _ = request(port, "GET", "/metrics", {"Accept": "text/plain;version=0.0.4"})
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


def test_a_token_file_line_too_long_to_send_is_refused_naming_its_line() -> None:
    """A token no client can send (gRPC metadata holds 16 KiB) is refused from --token-file as from --token."""
    from rcswarm.coordinator.tokens import parse_tokens

    with pytest.raises(ValueError, match=r"--token-file t\.txt line 2 has 5000 characters, more than 4096") as info:
        parse_tokens("# tokens\n" + "z" * 5000 + "\n", "--token-file t.txt")
    assert "zzz" not in str(info.value)
