"""The dashboard review of 2026-11-29 (`observe/dashboard/server.py`): a request's line and headers are read within a
byte budget (huge headers took the coordinator from 256 to 1477 MiB), 421 log lines are rate-limited, and another
site's page cannot spend the operator's login attempts through POST /login."""

from __future__ import annotations

import http.client
import io
import logging
import socket
import threading
import time
from typing import Any

import pytest

from rcswarm.coordinator.tokens import JoinTokens
from rcswarm.observe.dashboard import Dashboard
from rcswarm.observe.dashboard.auth import LoginThrottle, SessionAuth
from tests.helpers.specs import TOKEN
from tests.helpers.tls import request

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
# The review's request: 97 header lines of ~64 KB (the stdlib alone takes 100 of 65,536 bytes).
HUGE_LINE = b"X-A: " + b"a" * 65000 + b"\r\n"


def _answer(port: int, data: bytes, wait_s: float = 5.0) -> tuple[bytes, bool]:
    """Send `data` on a fresh connection from a sender thread while reading the answer: (its bytes up to the close or
    `wait_s`, whether the server closed the connection by then)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as connection:
        def send() -> None:
            try:
                for start in range(0, len(data), 64 * 1024):
                    connection.sendall(data[start:start + 64 * 1024])
            except OSError:
                pass  # the server closed the connection before the request was all sent

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        answer, closed, ends = b"", False, time.monotonic() + wait_s
        try:
            while time.monotonic() < ends:
                chunk = connection.recv(65536)
                if not chunk:
                    closed = True
                    break
                answer += chunk
        except TimeoutError:
            pass
        except OSError:
            closed = True
        sender.join(timeout=wait_s)
        return answer, closed


def _status(answer: bytes) -> int:
    """The status code of an answer's status line (0 without one)."""
    parts = answer.split(b"\r\n", 1)[0].split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else 0


# -- 1. a request's line and headers are read within a byte budget

def test_the_head_reader_reads_no_more_than_its_budget() -> None:
    """Deterministically: the review's 6.3 MB header block is cut after REQUEST_HEAD_BYTES (plus one buffer of
    read-ahead), a long line after REQUEST_LINE_BYTES; a request within both reads as the stdlib reads it."""
    from rcswarm.observe.dashboard.server import (
        REQUEST_HEAD_BYTES,
        REQUEST_LINE_BYTES,
        RequestTooLarge,
        _HeadReader,
    )

    source = io.BytesIO(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + HUGE_LINE * 97 + b"\r\n")
    reader = _HeadReader(io.BufferedReader(source))
    reader.limit(REQUEST_HEAD_BYTES, REQUEST_LINE_BYTES)
    assert reader.readline(65537) == b"GET / HTTP/1.1\r\n"
    with pytest.raises(RequestTooLarge) as raised:
        http.client.parse_headers(reader)  # type: ignore[arg-type]
    assert raised.value.status == 431 and "over 8192 bytes" in str(raised.value)
    assert source.tell() <= REQUEST_HEAD_BYTES + io.DEFAULT_BUFFER_SIZE, source.tell()

    many = io.BytesIO(b"GET / HTTP/1.1\r\n" + (b"X-B: " + b"b" * 4000 + b"\r\n") * 20)
    reader = _HeadReader(io.BufferedReader(many))
    reader.limit(REQUEST_HEAD_BYTES, REQUEST_LINE_BYTES)
    reader.readline(65537)
    with pytest.raises(RequestTooLarge) as raised:
        http.client.parse_headers(reader)  # type: ignore[arg-type]
    assert raised.value.status == 431 and f"over {REQUEST_HEAD_BYTES} bytes" in str(raised.value)
    assert many.tell() <= REQUEST_HEAD_BYTES + io.DEFAULT_BUFFER_SIZE, many.tell()

    long_line = _HeadReader(io.BufferedReader(io.BytesIO(b"GET /" + b"p" * 20000 + b" HTTP/1.1\r\n\r\n")))
    long_line.limit(REQUEST_HEAD_BYTES, REQUEST_LINE_BYTES)
    with pytest.raises(RequestTooLarge) as raised:
        long_line.readline(65537)
    assert raised.value.status == 414

    body = _HeadReader(io.BufferedReader(io.BytesIO(b"token=x" * 1000)))
    body.limit(4096)
    with pytest.raises(RequestTooLarge) as raised:
        body.read(5000)
    assert raised.value.status == 413

    fine = io.BytesIO(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: " + b"c" * 4000 + b"\r\n\r\nrest")
    reader = _HeadReader(io.BufferedReader(fine))
    reader.limit(REQUEST_HEAD_BYTES, REQUEST_LINE_BYTES)
    reader.readline(65537)
    headers = http.client.parse_headers(reader)  # type: ignore[arg-type]
    assert len(headers["Cookie"]) == 4000
    reader.unlimited()
    assert reader.read() == b"rest"


def test_a_header_block_over_the_budget_gets_431_and_is_not_read_whole(swarm: Any,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The review's requests (`bigheaders.py`): 431 at once and the connection closed, one log line for them all;
    before, the dashboard read all 6.3 MB of each and waited for more (only the 10 s request deadline cut it)."""
    dashboard = Dashboard(swarm.service, header_deadline_s=8.0).start()
    port = dashboard.port
    try:
        with caplog.at_level(logging.INFO, logger="rcswarm.dashboard"):
            unfinished = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + HUGE_LINE * 97 + b"X-B: unfinished"
            started = time.monotonic()
            answer, closed = _answer(port, unfinished)
            assert _status(answer) == 431 and closed, answer[:200]
            assert time.monotonic() - started < 4.0, "answered at once, not at the request's deadline"
            login = (b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n" + HUGE_LINE * 97 + b"\r\n")
            answer, closed = _answer(port, login)
            assert _status(answer) == 431 and closed, answer[:200]
            # Lines each within the stdlib's 65,536 bytes and the per-line budget, 40 KB together.
            many = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (b"X-C: " + b"c" * 8000 + b"\r\n") * 5 + b"\r\n"
            answer, closed = _answer(port, many)
            assert _status(answer) == 431 and closed and b"expected at most 32768" in answer, answer[:400]
            answer, closed = _answer(port, b"GET /" + b"p" * 20000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _status(answer) == 414 and closed, answer[:200]
        lines = [record.getMessage() for record in caplog.records if "refused (4" in record.getMessage()]
        assert len(lines) == 1, lines
        assert request(port, "GET", "/healthz")[0] == 200
    finally:
        dashboard.stop()


def test_a_request_with_a_browsers_headers_is_still_served(swarm: Any) -> None:
    """A few KB of cookies and the usual headers pass, and each request of a kept-alive connection has its own
    budget: two of ~20 KB in a row are both served."""
    dashboard = Dashboard(swarm.service).start()
    try:
        headers = {"Cookie": "; ".join(f"c{index}={'v' * 200}" for index in range(20)),
                   "User-Agent": "Mozilla/5.0 " + "x" * 300, "Accept": "text/html,*/*;q=0.8",
                   "Accept-Language": "en-GB,en;q=0.9", **{f"X-Extra-{index}": "e" * 4000 for index in range(4)}}
        connection = http.client.HTTPConnection("127.0.0.1", dashboard.port, timeout=10)
        try:
            for path in ("/api/status", "/healthz"):
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                response.read()
                assert response.status == 200, path
        finally:
            connection.close()
    finally:
        dashboard.stop()


# -- 2. 421 lines are rate-limited as the other lines a client causes at will

def test_misdirected_requests_are_logged_at_most_once_per_interval(swarm: Any,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """`flood421.py`: a page whose name was rebound to 127.0.0.1 sends 2000 requests, 2000 log lines (1 MB) in
    1.1 s before; now one line per LOG_EVERY_S, which counts those it left out."""
    dashboard = Dashboard(swarm.service, log_every_s=60.0).start()
    try:
        with caplog.at_level(logging.INFO, logger="rcswarm.dashboard"):
            statuses = {request(dashboard.port, "GET", "/api/status", {"Host": "attacker.example"})[0]
                        for _ in range(30)}
        assert statuses == {421}
        lines = [record.getMessage() for record in caplog.records if "not a loopback name" in record.getMessage()]
        assert len(lines) == 1, lines
    finally:
        dashboard.stop()


# -- 3. another site's page cannot spend the operator's login attempts

CROSS_SITE = ({"Origin": "https://attacker.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"},
              {"Origin": "https://attacker.example"},
              {"Origin": "null", "Sec-Fetch-Site": "cross-site"},  # a page of its own with no-referrer
              {"Sec-Fetch-Site": "same-site"})


def test_a_cross_site_login_is_refused_and_not_counted(swarm: Any) -> None:
    """`csrf_login.py`: form posts of wrong tokens from another site's page got 401s, then 429 for the operator's
    own login and a bearer scrape; now 403, and no attempt counted."""
    auth = SessionAuth(JoinTokens([TOKEN]).accepts_token, throttle=LoginThrottle(free=3, first_s=300.0))
    dashboard = Dashboard(swarm.service, auth=auth).start()
    port = dashboard.port
    try:
        for headers in CROSS_SITE * 3:
            status, _, body = request(port, "POST", "/login", {**FORM, **headers}, "token=wrong")
            assert status == 403 and b"another site" in body, (headers, status)
        assert auth.throttle.wait_s("127.0.0.1") == 0.0
        own_form = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
        behind_a_proxy = {"Origin": "https://dashboard.example", "Sec-Fetch-Site": "same-origin"}  # TLS ended there
        for headers in (own_form, {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"},
                        behind_a_proxy, {"Sec-Fetch-Site": "none"}, {}):
            status, answer_headers, _ = request(port, "POST", "/login", {**FORM, **headers}, f"token={TOKEN}")
            assert status == 303 and answer_headers["Set-Cookie"], (headers, status)
        assert request(port, "GET", "/metrics", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert request(port, "POST", "/logout", {"Sec-Fetch-Site": "cross-site"})[0] == 403
    finally:
        dashboard.stop()
