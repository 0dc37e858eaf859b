"""A read-only HTTP dashboard next to the coordinator's gRPC server, for a run or a sweep.

    rcswarm coordinator --config RUN.toml --state-dir DIR --http-port 8080   (loopback by default)
    rcswarm dht --config RUN.toml --state-dir DIR --http-port 8080           (a mirrored hivemind swarm, read-only)

Endpoints (GET only but the login form's POST; everything is rendered on the server, no JavaScript):

    /[?smoothing=W]        HTML: the run or sweep, its runs (L, batch, version, workers assigned,
                           tokens/s, loss), workers, rounds, the fit with its intervals, R² and
                           caveats, the crossovers and the four plots (W: the curves' TensorBoard
                           smoothing weight, one of render.SMOOTHING_CHOICES)
    /plot/loss_step.png[?smoothing=W]  loss against step per seq_len, log axes, with the fitted curves
    /plot/loss_time.png[?smoothing=W]  loss against wall time per seq_len, log axes, labelled crossovers
    /plot/alpha.png        α(s) at matched steps with the fitted α∞(1 − e^(−s/τ)) and its caveats
    /plot/law.png          loss against L at the last matched step with the fitted A·L^(−α) and its band
    /plot/forecast.png     each run's training loss per round, the law E + A·x^(−β) to its budget, the band ahead
    /api/status            JSON: GetStatus plus `runs` (one entry per run), per-worker totals, each
                           worker's and round's run, and the fit summary
    /api/metrics?since=ROWID[&limit=N][&run=RUN_ID]   JSON: one run's metric rows with rowid > ROWID,
                           oldest first (each run has its own store: run= is needed when there are several)
    /metrics               Prometheus text exposition (prometheus_client, custom collector);
                           every sample labelled with its run_id, one set per run
    /healthz               "ok" (never needs the token)
    /login                 GET: a form; POST token=...: sets the session cookie (only when the token is required)
    /logout                POST: ends the request's session and clears its cookie (only when the token is required)

With a token required (`auth.py`: by default when bound to a non-loopback address, or
`--http-token-required`, or `--view-token-file`), every other path answers 401 without
`Authorization: Bearer <token>` (the join token, or a read-only view token of `--view-token-file`)
or the session cookie /login sets; the page's 401 carries the login form. A session lives while
the token it logged in with is accepted (12 h at most), until POST /logout; an address whose token
attempts failed too often gets 429 for a while (`auth.LoginThrottle`). With `--http-tls` the
dashboard serves HTTPS with the coordinator's certificate (the cookie is marked Secure, and
Strict-Transport-Security sent). Every answer carries SECURITY_HEADERS (a Content-Security-Policy
without scripts, no framing, no Referer); the Server header names no Python version. /metrics
answers in the format the scraper's Accept asks for (OpenMetrics, or the text format 0.0.4).

Unknown paths answer 404, bad query values 400 with a message. Every connection has a
socket timeout, a deadline for its request to arrive (HEADER_DEADLINE_S) and one for its whole life
(REQUEST_DEADLINE_S); at most MAX_CONNECTIONS are served at once, MAX_CONNECTIONS_PER_ADDRESS from
one client address (a trusted proxy's, `--http-trusted-proxy`, exempt: the global cap alone); the log lines a
client can cause at will are written at most every LOG_EVERY_S. Behind a trusted proxy a request's client, for the
login throttle and the log lines, is the one its X-Forwarded-For names (`proxies.forwarded_client`). A
dashboard bound to loopback answers only requests naming a loopback host (DNS rebinding: 421). The
server runs in daemon threads and never reaches outside the host.
The dashboard works on a list of runs (a single run is a list of one): the views are
`views.py`, the page and plots `render.py`, the Prometheus collector `prometheus.py`, the
fits `observe/analysis.py` over the stores' named reads. Those go through each store's
read-only connection (WAL) and its aggregate tables, so a request never holds the lock a round
close writes under, and its cost grows with workers and steps, not with metric rows. Per-worker
totals are cached until a run's newest metric rowid changes; so are the step means and fits (the
curves) and the plots while the curves are small. Curves of more than `LARGE_CURVES` step means (a
run of many steps: their build grows with the steps) are rebuilt, with the plots, in a background
thread, at most every `CURVES_REFRESH_S` or ten times their build time, whichever is longer, and
requests meanwhile get the previous ones: a request's cost does not grow with the run's steps, and
the rebuilds take at most about a tenth of a core.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from rcswarm.observe.analysis import FitReport, StepMean, WorkerTotals, fit_step_means, step_means, worker_totals
from rcswarm.observe.dashboard.auth import (
    COOKIE,
    JOIN_CREDENTIAL,
    MAX_LOGIN_BYTES,
    SessionAuth,
    Verdict,
    cookie_values,
    credential_names,
    login_page,
)
from rcswarm.observe.dashboard.prometheus import ROUND_BUCKETS, CollectorSource, CoordinatorCollector, RoundHistogram
from rcswarm.observe.dashboard.proxies import FORWARDED_FOR, Client, IPNetwork, TrustedProxies
from rcswarm.observe.dashboard.render import (
    DEFAULT_SMOOTHING,
    FORECAST_PLOT,
    PLOTS,
    SMOOTHING_CHOICES,
    render_forecast,
    render_page,
    render_plot,
)
from rcswarm.observe.dashboard.views import RunView, metrics_page, presentation, read_run, status_dict
from rcswarm.observe.forecast import ForecastCurve, forecast_curve
from rcswarm.protos.transport import host_port, is_loopback_host, target_host

log = logging.getLogger("rcswarm.dashboard")

REQUEST_TIMEOUT_S = 10.0
# A connection's whole life (TLS handshake, request, answer) and how many are served at once: a client that
# trickles its request a byte at a time, or opens connections by the thousand, holds neither a thread nor a
# file descriptor of the coordinator's process for long (the timeout above bounds each read only).
REQUEST_DEADLINE_S = 60.0
MAX_CONNECTIONS = 64
# The request itself (TLS handshake, request line, headers and a login form's body) must arrive within this long of
# the accept, and one client address holds at most this many connections at once: a client trickling its requests
# (slowloris) holds few places, and each briefly, so the others' requests and probes still get theirs.
HEADER_DEADLINE_S = 10.0
MAX_CONNECTIONS_PER_ADDRESS = 16
# What one request may send before the dashboard has read it (`_HeadReader`): its request line and headers together
# at most REQUEST_HEAD_BYTES, each line at most REQUEST_LINE_BYTES (a browser's cookies take a few KiB), then a
# login form's body (MAX_LOGIN_BYTES). Past either, 414 (the request line) or 431 (the headers) and the connection
# closed: BaseHTTPRequestHandler alone takes 100 header lines of 64 KiB each per connection (a review, 2026-11-29:
# 64 such connections took the coordinator from 256 to 1477 MiB). Before closing, at most LINGER_BYTES more of the
# request are read and dropped for at most LINGER_S, so that the client reads the answer instead of a reset.
REQUEST_HEAD_BYTES = 32 * 1024
REQUEST_LINE_BYTES = 8 * 1024
LINGER_BYTES = 64 * 1024
LINGER_S = 1.0
# A log line that a client can cause at will (a refused connection, a 401, a deadline) is written at most once per
# this many seconds per kind, with the count of those left out since.
LOG_EVERY_S = 10.0
# Headers of every answer: no script, frame, plugin or foreign resource (the page has none: an inline <style>, its
# own plots, its own forms), never framed, no Referer leaving the dashboard.
CONTENT_SECURITY_POLICY = ("default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; form-action 'self'; "
                           "frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Content-Type-Options", "nosniff"),
)
# Under --http-tls: browsers keep to HTTPS for this host (one year; not for its subdomains, which are not ours).
STRICT_TRANSPORT_SECURITY = "max-age=31536000"
# What a log line keeps of a request's path (escaped: a path is the client's bytes).
LOGGED_PATH_CHARS = 200
METRICS_PAGE_DEFAULT = 1000
METRICS_PAGE_MAX = 10_000
# Curves of more step means than this are refreshed in the background instead of per request, at most
# every CURVES_REFRESH_S seconds or CURVES_REFRESH_FACTOR times their build time.
LARGE_CURVES = 20_000
CURVES_REFRESH_S = 5.0
CURVES_REFRESH_FACTOR = 10.0


# Paths answered without the token even when it is required: a liveness probe, the login form and logging out.
OPEN_PATHS = ("/healthz", "/login", "/logout")
PAGE_PATHS = ("/", "/index.html")


@dataclass(frozen=True)
class Cached:
    """A built value: the newest metric rowids it shows (those its build saw, or, for a value drawn from another
    cached one, that one's stamp), when it was built (monotonic), how long that took, and how many points it holds
    (the curves: their step means; 0 otherwise)."""

    stamp: tuple[int, ...]
    value: Any
    built_at: float
    took: float
    points: int = 0


class LogLimiter:
    """At most one log line per `every_s` seconds per kind (any thread): `allow(kind)` is None when this line is
    to be left out, else how many of its kind were left out since the last one written."""

    def __init__(self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def allow(self, kind: str) -> int | None:
        now = self._clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.every_s:
                self._left_out[kind] = self._left_out.get(kind, 0) + 1
                return None
            self._last[kind] = now
            return self._left_out.pop(kind, 0)


def _limited_log(limiter: LogLimiter, kind: str, message: str, *args: Any) -> None:
    """`log.info(message, *args)` unless `limiter` leaves this kind out now; a line written says how many it left
    out since the last."""
    left_out = limiter.allow(kind)
    if left_out is None:
        return
    if left_out:
        message += f" (and {left_out} more like it in the last %.0f s, not logged)"
        args = (*args, limiter.every_s)
    log.info(message, *args)


class BadRequest(ValueError):
    """A query value the endpoint cannot use; answered with 400 and this message."""


class NotFound(Exception):
    """A path the dashboard does not serve; answered with 404 and this message."""


def _int_param(params: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = params.get(name)
    if not values:
        return default
    if len(values) > 1:
        raise BadRequest(f"{name}: given {len(values)} times, expected once")
    text = values[0].strip()
    if not text.isascii():
        raise BadRequest(f"{name}={values[0]!r}: expected an integer in ASCII digits")
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name}={values[0]!r}: expected an integer") from None
    if not low <= value <= high:
        raise BadRequest(f"{name}={value}: expected {low}..{high}")
    return value


def _str_param(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"{name}: given {len(values)} times, expected once")
    return values[0]


def _smoothing_param(params: dict[str, list[str]]) -> float:
    """`smoothing=W`: one of SMOOTHING_CHOICES (DEFAULT_SMOOTHING when absent)."""
    text = _str_param(params, "smoothing")
    if text is None:
        return DEFAULT_SMOOTHING
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if value not in SMOOTHING_CHOICES:
        raise BadRequest(f"smoothing={text!r}: expected one of {', '.join(f'{w:g}' for w in SMOOTHING_CHOICES)}")
    return value


def _logged(path: str) -> str:
    """A request path as a log line may hold it: at most LOGGED_PATH_CHARS, control and non-ASCII bytes escaped."""
    return ascii(path[:LOGGED_PATH_CHARS] + ("…" if len(path) > LOGGED_PATH_CHARS else ""))


def _only(params: dict[str, list[str]], allowed: Sequence[str]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        expected = ", ".join(allowed) if allowed else "none"
        raise BadRequest(f"unknown query parameter(s) {', '.join(unknown)}: expected {expected}")


class RequestTooLarge(Exception):
    """A request past `_HeadReader`'s budget: answered with `status` and this message, then the connection closed."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _HeadReader:
    """A connection's input stream (`raw`, a buffered reader) that lets a request's head through up to a byte
    budget: `limit(total, line)` arms it for a request (its request line and headers: `total` bytes at most in all,
    `line` per line), `limit(total)` for what is left of it (a login form's body), `unlimited()` once the request
    has been read. A read past the budget raises RequestTooLarge (414 for the request line, 431 for a header line,
    413 for a body) having read at most one byte past it. Used by its connection's thread alone (the deadline
    timers never read), so it takes no lock."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._left: int | None = None
        self._total = 0
        self._line: int | None = None
        self._lines = 0
        self.consumed = 0

    def limit(self, total: int, line: int | None = None) -> None:
        self._left, self._total, self._line, self._lines = total, total, line, 0

    def unlimited(self) -> None:
        self._left = self._line = None

    def readline(self, size: int | None = -1) -> bytes:
        if self._left is None:
            data = self.raw.readline(size)
            self.consumed += len(data)
            return data
        cap = min(self._left, self._line if self._line is not None else self._left) + 1
        if size is not None and size >= 0:
            cap = min(cap, size)
        data = self.raw.readline(cap)
        self.consumed += len(data)
        self._left -= len(data)
        first, self._lines = self._lines == 0, self._lines + 1
        if self._line is not None and len(data) > self._line:
            what = "the request line" if first else "a header line"
            raise RequestTooLarge(HTTPStatus.REQUEST_URI_TOO_LONG if first else
                                  HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                  f"{what} is over {self._line} bytes: expected at most {self._line}")
        if self._left < 0:
            raise self._over(first)
        return data

    def read(self, size: int | None = -1) -> bytes:
        if self._left is None:
            data = self.raw.read(size)
        else:
            cap = self._left + 1 if size is None or size < 0 else min(size, self._left + 1)
            data = self.raw.read(cap)
            self._left -= len(data)
            if self._left < 0:
                self.consumed += len(data)
                raise self._over(False)
        self.consumed += len(data)
        return data

    def _over(self, first: bool) -> RequestTooLarge:
        """The error for a read past the budget: of a body (armed without a line limit), of the request line, or of
        the headers."""
        if self._line is None:
            return RequestTooLarge(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                   f"the request's body is over {self._total} bytes: expected at most {self._total}")
        status = HTTPStatus.REQUEST_URI_TOO_LONG if first else HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
        return RequestTooLarge(status, f"the request line and headers are over {self._total} bytes: expected at "
                                       f"most {self._total} in all")

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed)


class _Handler(BaseHTTPRequestHandler):
    server_version = "rcswarm-dashboard"
    timeout = REQUEST_TIMEOUT_S  # socket timeout for every connection (slow clients are dropped)
    dashboard: Dashboard

    def setup(self) -> None:
        """The connection's deadlines (past one the socket is shut, which ends any read or write): the request's
        (HEADER_DEADLINE_S: until its line, headers and a login form's body are read) and the whole connection's
        (REQUEST_DEADLINE_S); then the stream setup (with the socket timeout) and the TLS handshake on this
        request's thread. The input stream goes through a `_HeadReader`, armed for each request in
        `handle_one_request`."""
        self._deadline = threading.Timer(self.dashboard.request_deadline_s, self._expire,
                                         ("connection", self.dashboard.request_deadline_s))
        self._header_deadline = threading.Timer(self.dashboard.header_deadline_s, self._expire,
                                                ("request", self.dashboard.header_deadline_s))
        for timer in (self._deadline, self._header_deadline):
            timer.daemon = True
            timer.start()
        try:
            super().setup()
            self._head = _HeadReader(self.rfile)
            self.rfile = cast(Any, self._head)
            if isinstance(self.connection, ssl.SSLSocket):
                self.connection.do_handshake()
        except BaseException:
            self._deadline.cancel()  # `finish` is not called when `setup` fails
            self._header_deadline.cancel()
            raise

    def _expire(self, what: str, seconds: float) -> None:
        _limited_log(self.dashboard.log_limiter, f"deadline:{what}",
                     "dashboard: the %s from %s passed its %.0f s deadline: closed", what, self.address_string(),
                     seconds)
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _request_read(self) -> None:
        """The request has arrived whole: only the connection's deadline is left, and no byte budget."""
        self._header_deadline.cancel()
        self._head.unlimited()

    def handle_one_request(self) -> None:
        """One request, its line and headers read within REQUEST_HEAD_BYTES (REQUEST_LINE_BYTES a line); one past
        it (or a login form past its MAX_LOGIN_BYTES) is answered 414, 431 or 413 and its connection closed."""
        self._head.limit(REQUEST_HEAD_BYTES, REQUEST_LINE_BYTES)
        try:
            super().handle_one_request()
        except RequestTooLarge as error:
            self._too_large(error)

    def _too_large(self, error: RequestTooLarge) -> None:
        """Answer a request past its byte budget with `error`'s status, one log line (limited), and close: what
        more the client sent is read and dropped for at most LINGER_S and LINGER_BYTES first (closing on unread
        bytes would reset the connection, and the client might never read the answer)."""
        self.close_connection = True
        if error.status == HTTPStatus.REQUEST_URI_TOO_LONG:  # no request line parsed: answered as the stdlib does
            self.requestline, self.request_version, self.command = "", "", ""
        _limited_log(self.dashboard.log_limiter, "too-large", "dashboard: a request from %s refused (%d): %s",
                     self.address_string(), int(error.status), error)
        try:
            self._error(error.status, f"{error}; the connection is closed")
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_S)
            ends, dropped = time.monotonic() + LINGER_S, 0
            while dropped < LINGER_BYTES and time.monotonic() < ends:
                data = self.connection.recv(min(16 * 1024, LINGER_BYTES - dropped))
                if not data:
                    break
                dropped += len(data)
        except OSError:
            pass

    def parse_request(self) -> bool:
        """The request line and headers as BaseHTTPRequestHandler reads them; they are all a request but a POST
        (whose form follows) has to send. Then the request's client (`_client`), per request, not per
        connection."""
        self._request_client: Client | None = None
        parsed = super().parse_request()
        if parsed:
            self._request_client = self.dashboard.trusted_proxies.client(
                str(self.client_address[0]), self.headers.get_all(FORWARDED_FOR))
            if self.command != "POST":
                self._request_read()
            else:
                self._head.limit(MAX_LOGIN_BYTES)  # a login form's body at most; other POSTs are not read
        return parsed

    def _client(self) -> Client:
        """Whom the request is from: through a trusted proxy (`--http-trusted-proxy`), the client its
        X-Forwarded-For names (`proxies.forwarded_client`); else, and before the request's headers are read, the
        TCP peer. Its `address` keys the login throttle; its text ("203.0.113.7 (via 10.0.0.5)") goes into log
        lines."""
        client = getattr(self, "_request_client", None)
        return client if client is not None else Client(str(self.client_address[0]))

    def address_string(self) -> str:
        """The client as log lines name it: its address, and the trusted proxy it came through (`_client`)."""
        return str(self._client())

    def finish(self) -> None:
        self._deadline.cancel()
        self._header_deadline.cancel()
        super().finish()

    def version_string(self) -> str:
        """The Server header: the dashboard's name, not the Python version."""
        return self.server_version

    def end_headers(self) -> None:
        """Every answer's security headers (`SECURITY_HEADERS`; under --http-tls also Strict-Transport-Security),
        then the blank line; BaseHTTPRequestHandler's own error answers included."""
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        if self.dashboard.scheme == "https":
            self.send_header("Strict-Transport-Security", STRICT_TRANSPORT_SECURITY)
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), ascii(format % args))

    def _host_refused(self) -> bool:
        """On a loopback dashboard, a Host header naming another host (a page of another site whose name was
        rebound to 127.0.0.1 in the browser): True after answering 421. Without a Host header, or on a
        dashboard bound elsewhere, False."""
        host = self.headers.get("Host")
        if not self.dashboard.loopback or host is None:
            return False
        name = target_host(host.strip())  # a Host header is HOST[:PORT], as a gRPC target
        if name is not None and is_loopback_host(name):
            return False
        _limited_log(self.dashboard.log_limiter, "misdirected",
                     "dashboard: %s %s from %s for host %s refused (not a loopback name)", self.command,
                     _logged(self.path), self.address_string(), _logged(host))
        self._error(HTTPStatus.MISDIRECTED_REQUEST,
                    f"Host {host[:LOGGED_PATH_CHARS]!r} is not this dashboard's: it serves loopback names only "
                    f"(open {self.dashboard.url})")
        return True

    def _send(self, status: int, body: bytes, content_type: str, extra: Sequence[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        for name, value in extra:
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, (json.dumps({"error": message, "status": int(status)}) + "\n").encode(), "application/json")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _unauthorized(self, path: str, message: str, status: HTTPStatus = HTTPStatus.UNAUTHORIZED,
                      extra: Sequence[tuple[str, str]] = ()) -> None:
        """401 with a Bearer challenge (or `status`, 429 with its Retry-After): the login form for the page, a JSON
        error for everything else."""
        headers = [("WWW-Authenticate", 'Bearer realm="rcswarm"'), *extra]
        if path in PAGE_PATHS or path == "/login":
            self._send(status, login_page(message, self._credential()), "text/html; charset=utf-8", headers)
            return
        body = (json.dumps({"error": message, "status": int(status)}) + "\n").encode()
        self._send(status, body, "application/json", headers)

    def _credential(self) -> str:
        """What the dashboard asks for: the join token, or a view token too (`SessionAuth.credential`)."""
        auth = self.dashboard.auth
        return JOIN_CREDENTIAL if auth is None else auth.credential

    def _throttled(self, path: str) -> None:
        """429: this address failed too often; its tokens are not compared until its backoff has passed."""
        auth = self.dashboard.auth
        assert auth is not None
        wait = max(1, math.ceil(auth.throttle.wait_s(self._client().address)))
        _limited_log(self.dashboard.log_limiter, "throttled", "dashboard: %s %s from %s refused: too many failed "
                     "token attempts (%d s to wait)", self.command, _logged(path), self.address_string(), wait)
        self._unauthorized(path, f"Too many failed attempts from your address: try again in {wait} s.",
                           HTTPStatus.TOO_MANY_REQUESTS, [("Retry-After", str(wait))])

    def _guarded(self, path: str) -> bool:
        """True when the request may go on; otherwise a 401 (or 429, `_throttled`) has been sent."""
        auth = self.dashboard.auth
        if auth is None or path in OPEN_PATHS:
            return True
        verdict = auth.authorize(self.headers, self._client().address)
        if verdict is Verdict.ALLOWED:
            return True
        if verdict is Verdict.THROTTLED:
            self._throttled(path)
            return False
        _limited_log(self.dashboard.log_limiter, "unauthorized", "dashboard: %s %s from %s without a valid token or "
                     "session", self.command, _logged(path), self.address_string())
        kind = credential_names(self._credential())[1]
        self._unauthorized(path, f"Authentication required: send Authorization: Bearer <{kind}>, or log in.")
        return False

    def do_GET(self) -> None:
        try:
            parts = urlsplit(self.path)
            if self._host_refused() or not self._guarded(parts.path):
                return
            if parts.path == "/logout" and self.dashboard.auth is not None:
                self._not_allowed("POST")
                return
            if parts.path == "/login" and self.dashboard.auth is not None:
                credential = self._credential()
                self._send(HTTPStatus.OK, login_page(f"Log in with {credential}.", credential),
                           "text/html; charset=utf-8")
                return
            try:
                params = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query), max_num_fields=20)
            except ValueError as error:
                raise BadRequest(f"malformed query string: {error}") from None
            auth = self.dashboard.auth
            session = auth is not None and parts.path in PAGE_PATHS and auth.has_session(self.headers)
            status, body, content_type = self.dashboard.handle(parts.path, params, accept=self.headers.get("Accept") or "",
                                                               logout=session)
            self._send(status, body, content_type)
        except BadRequest as error:
            self._error(HTTPStatus.BAD_REQUEST, str(error))
        except NotFound as error:
            self._error(HTTPStatus.NOT_FOUND, str(error))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        except Exception:
            log.exception("dashboard request %s failed", _logged(self.path))
            try:
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error; see the coordinator's log")
            except OSError:
                pass

    def _not_allowed(self, allow: str = "GET, HEAD") -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", allow)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        """POST /login with `token=<join token>` (a form): a session cookie and a redirect to the page; POST /logout:
        the session ended and its cookie cleared."""
        auth = self.dashboard.auth
        if self._host_refused():
            return
        path = urlsplit(self.path).path
        if auth is None or path not in ("/login", "/logout"):
            self._request_read()
            self._not_allowed()
            return
        if self._from_another_site():
            self._request_read()
            self.close_connection = True  # its body, if any, is not read
            origin, site = self.headers.get("Origin") or "-", self.headers.get("Sec-Fetch-Site") or "-"
            _limited_log(self.dashboard.log_limiter, "cross-site", "dashboard: POST %s from %s sent by another site's "
                         "page refused (Origin %s, Sec-Fetch-Site %s)", _logged(path), self.address_string(),
                         _logged(origin), _logged(site))
            self._error(HTTPStatus.FORBIDDEN, f"POST {path} from another site's page (Origin "
                        f"{origin[:LOGGED_PATH_CHARS]!r}, Sec-Fetch-Site {site[:LOGGED_PATH_CHARS]!r}): refused; "
                        f"expected this dashboard's own form ({self.dashboard.url}login)")
            return
        if path == "/logout":
            self._logout(auth)
            return
        try:
            length = int(self.headers.get("Content-Length") or "-1")
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_LOGIN_BYTES:
            self.close_connection = True
            self._error(HTTPStatus.BAD_REQUEST, f"POST /login: expected a form body of at most {MAX_LOGIN_BYTES} bytes")
            return
        try:
            form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"), max_num_fields=4)
        except (OSError, ValueError):
            self.close_connection = True
            self._error(HTTPStatus.BAD_REQUEST, "POST /login: expected a form with token=<join token>")
            return
        self._request_read()
        tokens = form.get("token") or [""]
        verdict = auth.attempt(tokens[0], self._client().address) if len(tokens) == 1 else Verdict.DENIED
        if verdict is Verdict.THROTTLED:
            self._throttled("/login")
            return
        if verdict is not Verdict.ALLOWED:
            _limited_log(self.dashboard.log_limiter, "login", "dashboard: a failed login from %s", self.address_string())
            self._unauthorized("/login", "Wrong token: try again.")
            return
        cookie = auth.set_cookie_header(secure=self.dashboard.scheme == "https", token=tokens[0])
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", [("Location", "/"), ("Set-Cookie", cookie)])

    def _logout(self, auth: SessionAuth) -> None:
        """POST /logout: every session the request's cookies name is ended, the cookie cleared, and the browser sent
        to the login form. CSRF: another site's page cannot make a browser send the SameSite=Strict cookie, so only
        a request that carries one clears anything; one another site's page sent (`_from_another_site`) was refused
        by `do_POST` already."""
        self._request_read()
        values = cookie_values(self.headers.get("Cookie") or "", COOKIE)
        for value in values:
            auth.end_session(value)
        extra = [("Location", "/login")]
        if values:
            extra.append(("Set-Cookie", auth.clear_cookie_header(secure=self.dashboard.scheme == "https")))
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", extra)

    def _from_another_site(self) -> bool:
        """Whether a POST came from another site's page (CSRF: the form posts of a page the operator's browser shows;
        at /login they would spend the operator's failed-attempt allowance and lock the operator out). A browser's
        own Sec-Fetch-Site, which no page can set, decides where it is sent: another site unless `same-origin` or
        `none` (typed, a bookmark). Without it (an older browser), an Origin that is there, not `null`, and not this
        dashboard's (`_same_origin`) is another site's. Sec-Fetch-Site decides first because the Origin a browser
        sends names the address it reached, which behind a TLS-terminating proxy or one that rewrites Host is not
        the scheme and Host this server sees (a review: the operator's own same-origin login was refused there). The
        page's own forms send `Origin: null` (its Referrer-Policy is no-referrer) and `Sec-Fetch-Site: same-origin`;
        a client that is no browser (curl, a script) sends neither."""
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None:
            return site.strip().lower() not in ("same-origin", "none")
        origin = self.headers.get("Origin")
        return origin is not None and origin.strip() != "null" and not self._same_origin(origin.strip())

    def _same_origin(self, origin: str) -> bool:
        """Whether an Origin header names this dashboard as the request's Host header does (scheme included)."""
        host = (self.headers.get("Host") or "").strip().lower()
        return bool(host) and origin.lower() == f"{self.dashboard.scheme}://{host}"

    do_PUT = do_DELETE = do_PATCH = _not_allowed


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most `max_connections` at once and `max_per_address` from one client address:
    a connection past either is closed at once. A trusted proxy's address (`trusted_proxies`) is exempt from the
    per-address cap (its connections carry many clients', which are only known once a request's X-Forwarded-For
    is read) and held by the global cap alone."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64
    # The context for the next accepted connection; None serves plain HTTP.
    ssl_context: Callable[[], ssl.SSLContext] | None = None
    max_connections = MAX_CONNECTIONS
    max_per_address = MAX_CONNECTIONS_PER_ADDRESS
    log_limiter: LogLimiter
    trusted_proxies = TrustedProxies()

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        # Connections open per client address (under _address_lock; an address with none is not kept).
        self._address_lock = threading.Lock()
        self._per_address: dict[str, int] = {}
        super().server_activate()

    def _take(self, address: str) -> tuple[str, str] | None:
        """A place for a connection from `address`, or (which limit refused it, why) when there is none."""
        proxy = self.trusted_proxies.trusts(address)
        with self._address_lock:
            held = self._per_address.get(address, 0)
            if held >= self.max_per_address and not proxy:
                return "address", f"{held} connections from {address} open already"
            if not self._slots.acquire(blocking=False):
                return "all", f"{self.max_connections} connections open already"
            if not proxy:
                self._per_address[address] = held + 1
            return None

    def _give_back(self, address: str) -> None:
        proxy = self.trusted_proxies.trusts(address)
        with self._address_lock:
            if proxy:
                self._slots.release()
                return
            held = self._per_address.get(address, 0) - 1
            if held > 0:
                self._per_address[address] = held
            else:
                self._per_address.pop(address, None)
            self._slots.release()

    def process_request(self, request: Any, client_address: Any) -> None:
        address = str(client_address[0])
        refused = self._take(address)
        if refused is not None:
            kind, why = refused
            _limited_log(self.log_limiter, f"refused:{kind}", "dashboard: %s: the one from %s closed", why, address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(address)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(str(client_address[0]))

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept a connection; with TLS, wrap it and leave the handshake to the request's thread."""
        connection, address = super().get_request()
        if self.ssl_context is not None:
            context = self.ssl_context()
            connection = context.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
        return connection, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed TLS handshake or a dropped connection is the client's business; anything else is logged."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("dashboard connection from %s: %s", client_address, error)
        else:
            log.exception("dashboard connection from %s failed", client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


# The dashboard package's name for the one loopback check (protos/transport.py).
is_loopback = is_loopback_host


class OneRun:
    """A single run as the group of one the dashboard shows: its `runs`, `sweep`, `run_id`, `status()` and
    `close()`, each the run's own."""

    sweep = False

    def __init__(self, run: Any) -> None:
        self.runs = [run]
        self.run_id = run.run_id
        self.status = run.status
        self.close = run.close

    def close(self) -> None:
        """Close the run (its store), as a coordinator's group closes its runs; once the dashboard has stopped."""
        for run in self.runs:
            run.close()


class Dashboard:
    """The HTTP dashboard of a live coordinator's runs, served from a background thread.

    `coordinator` is a group of runs with `runs`, `sweep`, `run_id` and `status()` (the coordinator's
    `RunGroup`), or a single run with `spec`, `run_id`, `store`, `status()` and `summary()` (a bare
    `SwarmCoordinator`, a mirrored hivemind swarm's `mirror_view.MirrorRun`), shown as a group of one
    (`OneRun`); its runs (each with its own store) are shown on one page. The fit and plots use each run's own steps and
    clock, a single run's too (`views.presentation`). With `auth` (a `SessionAuth`) every path
    but /healthz and /login needs a token it accepts (the join token, a view token) or a session cookie; with
    `ssl_context` it serves HTTPS
    (each connection's handshake on its own request thread, within the socket timeout): a context, or a function
    giving each accepted connection its context (a coordinator's `DashboardCertificates.current`, which follows
    renewed certificate files). `trusted_proxies` (--http-trusted-proxy: networks or addresses) are the reverse proxies
    whose X-Forwarded-For names a request's client for the login throttle and the log lines, and which the
    per-address connection cap exempts (`proxies.py`).
    """

    def __init__(
        self, coordinator: Any, host: str = "127.0.0.1", port: int = 0, refresh_s: int = 10,
        request_timeout_s: float = REQUEST_TIMEOUT_S, auth: SessionAuth | None = None,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
        request_deadline_s: float = REQUEST_DEADLINE_S,
        max_connections: int = MAX_CONNECTIONS,
        header_deadline_s: float = HEADER_DEADLINE_S,
        max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
        log_every_s: float = LOG_EVERY_S,
        trusted_proxies: Sequence[str | IPNetwork] = (),
    ) -> None:
        self.auth = auth
        # --http-trusted-proxy: whose X-Forwarded-For names the client (ValueError names a bad network).
        self.trusted_proxies = TrustedProxies(trusted_proxies)
        self.request_deadline_s = request_deadline_s
        self.header_deadline_s = min(header_deadline_s, request_deadline_s)
        self.log_limiter = LogLimiter(log_every_s)
        # Bound to loopback: requests must name a loopback host (`_Handler._host_refused`).
        self.loopback = is_loopback_host(host)
        self.scheme = "https" if ssl_context is not None else "http"
        self.coordinator = coordinator if hasattr(coordinator, "runs") else OneRun(coordinator)
        self.runs: list[Any] = list(self.coordinator.runs)
        self.kind, self.clock = presentation(self.coordinator.sweep, getattr(self.runs[0], "mirrored", False))
        self.refresh_s = refresh_s
        self._cache_lock = threading.Lock()
        self._cache: dict[str, Cached] = {}
        self._build_locks: dict[str, threading.Lock] = {}
        # Keys a background thread is rebuilding (under _cache_lock).
        self._refreshing: set[str] = set()
        # Per store: its round-duration histogram as the last scrape read it (under _cache_lock).
        self._round_histograms: dict[Any, RoundHistogram] = {}
        handler = type("DashboardHandler", (_Handler,), {"dashboard": self, "timeout": request_timeout_s})
        server_cls = _Server6 if ":" in host else _Server
        server_cls = type(server_cls.__name__, (server_cls,), {
            "max_connections": max_connections, "max_per_address": max_connections_per_address,
            "log_limiter": self.log_limiter, "trusted_proxies": self.trusted_proxies})
        self.server = server_cls((host, port), handler)
        if isinstance(ssl_context, ssl.SSLContext):
            fixed = ssl_context
            self.server.ssl_context = lambda: fixed
        else:
            self.server.ssl_context = ssl_context
        self.host = host
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="dashboard", daemon=True)
        self._registry: Any = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{host_port(self.host, self.port)}/"

    def start(self) -> Dashboard:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5.0)

    # -- data

    def _newest_rowids(self) -> tuple[int, ...]:
        return tuple(run.store.newest_metric_rowid() for run in self.runs)

    def _cached(self, key: str, build: Callable[..., Any], points: Callable[[Any], int] = lambda value: 0,
                drawn_from: str | None = None) -> Any:
        """Recompute `key` only when its inputs changed; concurrent requests share one build (takes `_cache_lock`
        briefly and the key's build lock around the build). The inputs: the metric rows (their newest rowids), or,
        for a value drawn from another cached one (`drawn_from`, built before), that value as it is cached now,
        passed to `build` and whose stamp the drawn value keeps: it says which rows the drawing shows."""
        with self._cache_lock:
            key_lock = self._build_locks.setdefault(key, threading.Lock())
        with key_lock:
            stamp, given = self._inputs(drawn_from)
            with self._cache_lock:
                hit = self._cache.get(key)
                if hit is not None and hit.stamp == stamp:
                    return hit.value
            started = time.monotonic()
            value = build(*given)
            with self._cache_lock:
                self._cache[key] = Cached(stamp, value, time.monotonic(), time.monotonic() - started, points(value))
            return value

    def _inputs(self, drawn_from: str | None) -> tuple[tuple[int, ...], tuple[Any, ...]]:
        """(stamp, build arguments) of a value: the newest rowids and none, or the stamp and value of the cached
        `drawn_from` (read together, so the stamp is that of the value the build gets)."""
        if drawn_from is None:
            return self._newest_rowids(), ()
        with self._cache_lock:
            source = self._cache[drawn_from]
        return source.stamp, (source.value,)

    def _refreshed(self, key: str, build: Callable[..., Any], points: Callable[[Any], int] = lambda value: 0,
                   drawn_from: str | None = None) -> Any:
        """`_cached`, except that while the curves are large (`LARGE_CURVES`) a built value is served as it is
        and rebuilt by a background thread once its inputs changed: rows arrived and it is older than its refresh
        interval, or (`drawn_from`) the value it was drawn from was rebuilt since, which that value's own refresh
        interval already spaces out."""
        with self._cache_lock:
            hit, curves = self._cache.get(key), self._cache.get("curves")
            source = None if drawn_from is None else self._cache.get(drawn_from)
        if hit is None or curves is None or curves.points <= LARGE_CURVES:
            return self._cached(key, build, points, drawn_from)
        if source is not None:
            due = source.stamp != hit.stamp
        else:
            due = (time.monotonic() - hit.built_at >= max(CURVES_REFRESH_S, CURVES_REFRESH_FACTOR * hit.took)
                   and self._newest_rowids() != hit.stamp)
        if due:
            with self._cache_lock:
                start = key not in self._refreshing
                self._refreshing.add(key)
            if start:
                threading.Thread(target=self._refresh, args=(key, build, points, drawn_from),
                                 name=f"dashboard-{key}", daemon=True).start()
        return hit.value

    def _refresh(self, key: str, build: Callable[..., Any], points: Callable[[Any], int],
                 drawn_from: str | None) -> None:
        """A background rebuild of `key` (its own thread); a failure is logged and the old value kept."""
        try:
            self._cached(key, build, points, drawn_from)
        except Exception:
            log.exception("dashboard: rebuilding %s failed; serving the previous one", key)
        finally:
            with self._cache_lock:
                self._refreshing.discard(key)

    def totals(self) -> list[dict[str, WorkerTotals]]:
        """Per run: its per-worker totals."""
        return self._cached("totals", lambda: [
            worker_totals(run.store.worker_rows(run.run_id)) for run in self.runs])

    def _build_curves(self) -> tuple[list[list[StepMean]], FitReport]:
        means = [step_means(run.store, self.clock, run.run_id, run.spec.inner.steps) for run in self.runs]
        lengths = [run.spec.data.seq_len for run in self.runs] if self.coordinator.sweep else []
        return means, fit_step_means(itertools.chain.from_iterable(means), lengths)

    def curves(self) -> tuple[list[list[StepMean]], FitReport]:
        """Per run its mean loss and time per (seq_len, step) on the dashboard's clock, and the fits over them."""
        return self._refreshed("curves", self._build_curves, lambda value: sum(len(means) for means in value[0]))

    def step_means(self) -> list[list[StepMean]]:
        """Per run: mean loss and time per (seq_len, step) on the dashboard's clock."""
        return self.curves()[0]

    def fits(self) -> FitReport:
        return self.curves()[1]

    def views(self) -> list[RunView]:
        return [read_run(index, run, totals) for index, (run, totals) in enumerate(zip(self.runs, self.totals()))]

    def plot(self, name: str, smoothing: float = DEFAULT_SMOOTHING) -> bytes:
        """The plot `name` drawn from the curves as `curves()` serves them, stamped with their stamp: redrawn once
        they are rebuilt (large curves: by a background thread, this request starting their own rebuild when due)."""
        self.curves()
        return self._refreshed(f"plot:{name}:{smoothing:g}", lambda curves: render_plot(name, curves[1], smoothing),
                               drawn_from="curves")

    def forecast_curves(self) -> list[ForecastCurve]:
        """Per run: its round losses and the law fitted to them up to its budget, with the band (issue #30)."""
        return [forecast_curve(f"L={run.spec.data.seq_len}", run.store.round_losses(), float(run.spec.run.rounds))
                for run in self.runs]

    def status_data(self) -> dict[str, Any]:
        status = self.coordinator.status()
        means, fits = self.curves()
        return status_dict(self.kind, self.clock, status, self.views(), means, fits)

    def _run_named(self, run_id: str | None) -> Any:
        """The run `run_id` names; without a name, the only run (several runs need one)."""
        if run_id is None:
            if len(self.runs) != 1:
                raise BadRequest(f"this {self.kind} keeps metrics per run: add run=RUN_ID (see runs in /api/status)")
            return self.runs[0]
        for run in self.runs:
            if run.run_id == run_id:
                return run
        known = ", ".join(run.run_id for run in self.runs)
        raise BadRequest(f"run={run_id!r}: no such run; expected one of {known}")

    def metrics_page(self, since: int, limit: int, run_id: str | None = None) -> dict[str, Any]:
        """One run's metric rows with rowid > since (rowids count per run)."""
        return metrics_page(self._run_named(run_id).store.metrics_since(since, limit), since, limit)

    def collector_source(self) -> CollectorSource:
        return CollectorSource(views=self.views,
                               round_histogram=lambda view: self.round_histogram(view.coordinator.store),
                               fits=self.fits, fit_label=self.coordinator.run_id, waiting=self.waiting_for_place)

    def round_histogram(self, store: Any) -> RoundHistogram:
        """`store`'s round-duration histogram: the one the last scrape read, followed by the rounds closed since
        (rounds are only added, each at a newer version), read by one aggregate query over those alone; the whole
        table at the first scrape, or when its newest version went back."""
        with self._cache_lock:
            known = self._round_histograms.get(store)
        after = 0 if known is None else known.through
        through, count, total, below, last = store.round_duration_histogram(ROUND_BUCKETS, after)
        if known is None or through < known.through:
            if after:
                through, count, total, below, last = store.round_duration_histogram(ROUND_BUCKETS)
            histogram = RoundHistogram(through, count, total, below, last)
        else:
            histogram = known.then(RoundHistogram(through, count, total, below, last))
        with self._cache_lock:
            newest = self._round_histograms.get(store)
            if newest is None or newest.through <= histogram.through:
                self._round_histograms[store] = histogram
        return histogram

    def waiting_for_place(self) -> int:
        """Workers waiting for a place: a coordinator's group counts them; a bare run or a mirror has none to count."""
        waiting = getattr(self.coordinator, "waiting", None)
        return 0 if waiting is None else waiting.count(time.monotonic())

    def prometheus(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition and its content type, in the format the scraper's Accept header asks for
        (prometheus_client's `choose_encoder`: OpenMetrics when asked, else the text format 0.0.4)."""
        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import choose_encoder

        if self._registry is None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(CoordinatorCollector(self.collector_source()))
            self._registry = registry
        encoder, content_type = choose_encoder(accept)
        return encoder(self._registry), content_type

    # -- routing

    def handle(self, path: str, params: dict[str, list[str]], accept: str = "",
               logout: bool = False) -> tuple[int, bytes, str]:
        """(status, body, content type) of a GET of `path`; `accept`: the Accept header (/metrics' format);
        `logout`: the page offers a logout button (the request came with a session)."""
        if path in PAGE_PATHS:
            _only(params, ("smoothing",))
            page = render_page(self.status_data(), self.refresh_s, _smoothing_param(params), logout=logout)
            return 200, page.encode(), "text/html; charset=utf-8"
        if path == "/api/status":
            _only(params, ())
            body = json.dumps(self.status_data(), allow_nan=False, indent=1)
            return 200, body.encode(), "application/json"
        if path == "/api/metrics":
            _only(params, ("run", "since", "limit"))
            since = _int_param(params, "since", 0, 0, 2**62)
            limit = _int_param(params, "limit", METRICS_PAGE_DEFAULT, 1, METRICS_PAGE_MAX)
            run_id = _str_param(params, "run")
            body = json.dumps(self.metrics_page(since, limit, run_id), allow_nan=False)
            return 200, body.encode(), "application/json"
        if path == f"/plot/{FORECAST_PLOT}.png":
            _only(params, ("v",))
            _int_param(params, "v", 0, 0, 2**62)  # cache buster, ignored
            return 200, self._refreshed("plot:forecast", lambda: render_forecast(self.forecast_curves())), "image/png"
        if path.startswith("/plot/") and path.endswith(".png"):
            name = path[len("/plot/"):-len(".png")]
            if name not in PLOTS:
                raise NotFound(f"no plot {name!r}: expected one of {', '.join(PLOTS)}")
            _only(params, ("v", "smoothing"))
            _int_param(params, "v", 0, 0, 2**62)  # cache buster, ignored
            return 200, self.plot(name, _smoothing_param(params)), "image/png"
        if path == "/metrics":
            _only(params, ())
            body, content_type = self.prometheus(accept)
            return 200, body, content_type
        if path == "/healthz":
            return 200, b"ok\n", "text/plain; charset=utf-8"
        raise NotFound(f"no such path {path!r}: try /, /api/status, /api/metrics?since=0[&run=RUN_ID], /metrics")
