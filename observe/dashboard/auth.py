"""Who may read the dashboard: a token as a bearer header, or a login cookie that is not the token.

The tokens it takes: the swarm's join tokens (as before), and the read-only view tokens of
`--view-token-file` (coordinator/tokens.py `ViewTokens`), which open the dashboard and /metrics and
nothing else: the gRPC guard never sees them. `token_check` is the dashboard's check over both.

`decide_dashboard_auth(host, required, insecure, https, view_tokens)` is the pure rule: a dashboard bound
to a non-loopback address requires a token unless the operator opts out (`--http-insecure`, with a
warning); `--http-token-required`, or view tokens given (`--view-token-file`), require one on loopback
too. `dashboard_transport_problem` is the pure rule of how the token may travel: a dashboard off
loopback that requires it over plain HTTP is refused unless the operator says the network path is
protected otherwise (`--http-plaintext`: a TLS-terminating proxy in front) or already plaintext (gRPC
`--insecure`); view tokens change nothing there (the join token is still accepted).

`SessionAuth` checks a request. `Authorization: Bearer <token>` (what Prometheus'
`authorization`/`bearer_token_file` sends) is compared with the accepted tokens in constant time. A
browser POSTs the token once to /login and gets the cookie `rcswarm_session`, HttpOnly and
SameSite=Strict, whose value is `v1.<issued>.<nonce>.<HMAC-SHA256(key, "v1.<issued>.<nonce>")>`
with `key` random per coordinator process: the cookie never holds the token, expires after
`SESSION_S`, and every cookie is void once the coordinator restarts. The process also remembers
which token each session logged in with (`MAX_SESSIONS` at most, the oldest forgotten first), and a
session is valid only while that token is still accepted: a token removed from `--token-file`
voids its sessions at the next request (the file is re-read as for gRPC; a view token removed from
`--view-token-file` likewise), and POST /logout voids one.
Failed token attempts (a wrong bearer token, a wrong login) are throttled per client address
(`LoginThrottle`; through a `--http-trusted-proxy`, the address its X-Forwarded-For names: proxies.py); an
address with failures on record gets its attempts compared one at a time, so its concurrent connections get no
more guesses than one connection after another, while right tokens sent at once are never throttled.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rcswarm.protos.transport import is_loopback_host

COOKIE = "rcswarm_session"
SESSION_S = 12 * 3600
# A cookie issued up to this far "in the future" (a clock step) still counts.
CLOCK_SKEW_S = 60
MAX_LOGIN_BYTES = 4096
# Sessions a process remembers (each: its nonce, issue time and the token it logged in with); past this the oldest
# is forgotten (its browser logs in again).
MAX_SESSIONS = 4096
# The login throttle: failed attempts an address gets free, the delay after the next ones (doubling up to the
# most), how long an address's failures are remembered, and how many addresses are remembered at most.
FREE_FAILURES = 5
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 300.0
FAILURES_FORGOTTEN_S = 3600.0
# What an address with failures on record waits while one of its attempts is being compared (`LoginThrottle.reserve`).
IN_FLIGHT_WAIT_S = 1.0
MAX_THROTTLED_ADDRESSES = 4096


def decide_dashboard_auth(host: str, required: bool, insecure: bool, https: bool = False,
                          view_tokens: bool = False) -> tuple[bool, str | None]:
    """(whether the dashboard requires a token, a warning for the log or None) (pure).

    `view_tokens`: the dashboard takes read-only view tokens (--view-token-file); they require a token wherever it
    binds, loopback included (view tokens on a dashboard that asks for none would guard nothing). Off loopback the
    warning names what is exposed: everything without the token (`insecure`), or the token itself when it travels
    over plain HTTP (no `https`). ValueError when `insecure` comes with `required` or `view_tokens`: they
    contradict each other.
    """
    if required and insecure:
        raise ValueError("--http-token-required and --http-insecure contradict each other: give one")
    if view_tokens and insecure:
        raise ValueError("--view-token-file and --http-insecure contradict each other: view tokens guard the "
                         "dashboard, --http-insecure opens it to anyone; give one")
    required = required or view_tokens
    if is_loopback_host(host):
        return required, None
    if insecure:
        return False, (f"the dashboard on {host} has no authentication (--http-insecure): anyone who reaches it "
                       "sees worker ids, names, devices, the parameters' digest and the metrics")
    if not https:
        return True, (f"the dashboard on {host} takes the join token over plain HTTP: anyone on the network path "
                      "can read it and join the swarm; add --http-tls, or reach it through a TLS proxy or a tunnel")
    return True, None


def dashboard_transport_problem(host: str, required: bool, https: bool, grpc_plaintext: bool,
                                http_plaintext: bool) -> str | None:
    """Why a dashboard may not start as configured, in one line, or None (pure).

    `required`: whether it requires the join token (`decide_dashboard_auth`). Refused: bound off loopback, requiring
    the token, over plain HTTP (no `https`, i.e. no --http-tls): the token (a login form, a bearer header) and the
    session cookies would cross the network in the clear, as gRPC refuses to let them without TLS
    (`coordinator.tls.bind_problem`). Allowed anyway when the operator opts out explicitly: `http_plaintext`
    (--http-plaintext: TLS is terminated by a proxy in front, or the network is trusted) or `grpc_plaintext` (gRPC
    itself serves plaintext under --insecure, so the token crosses the network in the clear there already).
    """
    if not required or https or is_loopback_host(host) or http_plaintext or grpc_plaintext:
        return None
    return (f"the dashboard on {host} would take the join token over plain HTTP: add --http-tls (HTTPS with the "
            "coordinator's certificate), or --http-plaintext if a TLS-terminating proxy is in front of it or the "
            "network is trusted")


def token_check(*checks: Callable[[str], bool] | None) -> Callable[[str], bool]:
    """The dashboard's token check: a token is accepted when any of `checks` accepts it (None: a kind of token not
    configured, e.g. no view tokens, or `rcswarm dht` without $RCSWARM_TOKEN). Every check is asked, none cut
    short, so the time taken does not tell which kind a token is. The gRPC guard is given the join tokens alone,
    never this."""
    given = tuple(check for check in checks if check is not None)
    if not given:
        raise ValueError("a dashboard that requires a token needs one to accept")

    def accepts(token: str) -> bool:
        matched = False
        for check in given:
            matched |= bool(check(token))
        return matched

    return accepts


# What the dashboard asks for, in its login form and its 401s: the join token alone, or a view token too.
JOIN_CREDENTIAL = "the swarm's join token"
VIEW_CREDENTIAL = "a view token (or the swarm's join token)"


# What `dict.pop` returns for a session not remembered (a session's token may be None).
_GONE = object()


class Verdict(enum.Enum):
    """What `SessionAuth.authorize` says of a request."""

    ALLOWED = "allowed"
    # No credential, a wrong or stale cookie, or a wrong bearer token: 401.
    DENIED = "denied"
    # A bearer token from an address in its backoff after failed attempts: 429, the token not even compared.
    THROTTLED = "throttled"


@dataclass
class _Failures:
    count: int
    last: float
    blocked_until: float
    # Attempts taken (`reserve`) whose token is being compared now.
    in_flight: int = 0


class LoginThrottle:
    """Failed token attempts per client address, and the backoff they earn (any thread; one lock).

    An address gets FREE_FAILURES failed attempts free; after each further one it must wait BACKOFF_FIRST_S,
    doubling up to BACKOFF_MAX_S, before a token of its is compared again. An address whose last failure is
    FAILURES_FORGOTTEN_S old starts afresh, and a success clears its record. At most `max_addresses` are
    remembered, the one whose last failure is oldest forgotten first: memory stays bounded whatever the
    attacker's addresses (one with more addresses than that gets its first attempts free on each, as it would
    with that many addresses anyway). `SessionAuth.attempt` takes each attempt with `reserve` before the token is
    compared and reports its outcome with `finished`: an address with failures on record gets its attempts compared
    one at a time once those and the ones in flight reach its free ones (the rest wait a second, 429), so
    concurrent attempts get no more comparisons than sequential ones would; an address with none (every right
    token, and a fresh guesser's first burst, at most its connections at once) is not held back.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, free: int = FREE_FAILURES,
                 first_s: float = BACKOFF_FIRST_S, max_s: float = BACKOFF_MAX_S,
                 forgotten_s: float = FAILURES_FORGOTTEN_S, max_addresses: int = MAX_THROTTLED_ADDRESSES) -> None:
        self._clock = clock
        self.free, self.first_s, self.max_s, self.forgotten_s = free, first_s, max_s, forgotten_s
        self.max_addresses = max_addresses
        self._lock = threading.Lock()
        self._failures: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def wait_s(self, address: str) -> float:
        """Seconds `address` must still wait before its next attempt counts (0: it may try now)."""
        with self._lock:
            record = self._current(address)
            return 0.0 if record is None else max(0.0, record.blocked_until - self._clock())

    def reserve(self, address: str) -> float:
        """Take the next attempt of `address`, or say how long it must still wait: 0 when it may try now (the
        attempt is then in flight until `finished`); else the seconds to wait, nothing recorded. In its backoff it
        waits; with failures on record, when they and the attempts in flight reach its free ones while one is in
        flight, it waits IN_FLIGHT_WAIT_S: once its backoff ends one attempt is compared, as sequential ones would
        be, not each that looked before any failure was recorded. Without failures nothing holds it back (a right
        token is never throttled for being sent on several connections at once)."""
        with self._lock:
            now = self._clock()
            record = self._current(address)
            if record is not None and record.blocked_until > now:
                return record.blocked_until - now
            if record is not None and record.count and record.in_flight \
                    and record.count + record.in_flight >= self.free:
                return IN_FLIGHT_WAIT_S
            if record is None:
                record = self._failures[address] = _Failures(0, now, now)
                self._forget_beyond_limit()
            record.in_flight += 1
            return 0.0

    def finished(self, address: str, ok: bool) -> None:
        """The outcome of an attempt `reserve` let through: a right token clears the address's failures, a wrong
        one is counted (`failed`)."""
        with self._lock:
            record = self._failures.get(address)
            if record is not None:
                record.in_flight = max(0, record.in_flight - 1)
            if not ok:
                self._fail(address)
            elif record is not None:
                record.count, record.blocked_until = 0, 0.0
                if not record.in_flight:
                    del self._failures[address]

    def failed(self, address: str) -> float:
        """Record a failed attempt of `address`; the seconds it must now wait (0 while within its free ones)."""
        with self._lock:
            return self._fail(address)

    def _fail(self, address: str) -> float:
        """`failed` with the lock held."""
        now = self._clock()
        record = self._current(address) or _Failures(0, now, now)
        record.count += 1
        record.last = now
        beyond = record.count - self.free
        wait = 0.0 if beyond <= 0 else min(self.max_s, self.first_s * 2.0 ** min(beyond - 1, 64))
        record.blocked_until = now + wait
        self._failures[address] = record
        self._failures.move_to_end(address)
        self._forget_beyond_limit()
        return wait

    def _forget_beyond_limit(self) -> None:
        """Forget the addresses whose last failure is oldest beyond `max_addresses` (lock held)."""
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)

    def _current(self, address: str) -> _Failures | None:
        """`address`'s record, dropped when it is old enough to forget (lock held)."""
        record = self._failures.get(address)
        if record is not None and not record.in_flight and self._clock() - record.last >= self.forgotten_s:
            del self._failures[address]
            return None
        return record


class SessionAuth:
    """Bearer and cookie checks of dashboard requests, the sessions and the login throttle.

    Threads: every method runs on the dashboard's request threads. The key is set once in `__init__` and only
    read afterwards; the session table is guarded by `_lock` (held only around dict operations: the token check,
    which may re-read a token file, runs outside it); the throttle has its own lock.
    """

    def __init__(self, check_token: Callable[[str], bool], clock: Callable[[], float] = time.time,
                 throttle: LoginThrottle | None = None, max_sessions: int = MAX_SESSIONS,
                 credential: str = JOIN_CREDENTIAL) -> None:
        self._check_token = check_token
        # What the login form and the 401s ask for (fixed text: JOIN_CREDENTIAL or VIEW_CREDENTIAL).
        self.credential = credential
        self._key = secrets.token_bytes(32)
        self._clock = clock
        self.throttle = throttle if throttle is not None else LoginThrottle()
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        # nonce -> the token the session logged in with, None for one bound to no token (insertion order: the
        # oldest first).
        self._sessions: OrderedDict[str, str | None] = OrderedDict()

    def token_ok(self, presented: str) -> bool:
        """Whether `presented` is an accepted token (a join token, or a view token where given; constant time)."""
        return bool(presented) and self._check_token(presented)

    def new_cookie(self, token: str | None = None) -> str:
        """A fresh session value for a login with `token`: issue time, a random nonce and their HMAC under the
        process's key; the session lives while `token` is accepted (and SESSION_S at most). The server always
        names the token; without one the session is bound to none and lives its SESSION_S whatever the tokens."""
        nonce = secrets.token_hex(16)
        body = f"v1.{int(self._clock())}.{nonce}"
        with self._lock:
            self._sessions[nonce] = token
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return f"{body}.{self._mac(body)}"

    def _session(self, value: str) -> str | None:
        """The nonce of `value` when it is a well-formed cookie this process issued within SESSION_S, else None."""
        body, _, mac = value.rpartition(".")
        parts = body.split(".")
        if len(parts) != 3 or parts[0] != "v1" or not parts[1].isdigit():
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(body).encode()):
            return None
        age = self._clock() - int(parts[1])
        return parts[2] if -CLOCK_SKEW_S <= age <= SESSION_S else None

    def cookie_ok(self, value: str) -> bool:
        """Whether `value` is a session this process issued within the last SESSION_S seconds, not logged out,
        whose token is still accepted (a token removed from the token file voids its sessions)."""
        nonce = self._session(value)
        if nonce is None:
            return False
        with self._lock:
            if nonce not in self._sessions:
                return False
            token = self._sessions[nonce]
        return token is None or self.token_ok(token)

    def end_session(self, value: str) -> bool:
        """Log the session `value` out (it is void from now on); whether it was one."""
        nonce = self._session(value)
        with self._lock:
            return nonce is not None and self._sessions.pop(nonce, _GONE) is not _GONE

    @property
    def sessions(self) -> int:
        """How many sessions are remembered now."""
        return len(self._sessions)

    def _mac(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    def authorize(self, headers: Mapping[str, str], address: str) -> Verdict:
        """Whether a request from `address` with these headers may go on: a valid session cookie, or the bearer
        token; a wrong bearer token counts as a failed attempt of `address`, and while `address` waits out its
        backoff its bearer tokens are not compared at all (THROTTLED; its cookies still count)."""
        if any(self.cookie_ok(value) for value in cookie_values(headers.get("Cookie") or "", COOKIE)):
            return Verdict.ALLOWED
        scheme, _, credential = (headers.get("Authorization") or "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return Verdict.DENIED
        return self.attempt(credential.strip(), address)

    def attempt(self, token: str, address: str) -> Verdict:
        """A token presented by `address` (a bearer header, a login form), under the throttle: the attempt is taken
        before the token is compared (`LoginThrottle.reserve`) and its outcome recorded after (`finished`), so
        concurrent attempts of one address with failures get no more comparisons than sequential ones, and right
        tokens sent at once are never throttled."""
        if self.throttle.reserve(address) > 0:
            return Verdict.THROTTLED
        ok = False
        try:
            ok = self.token_ok(token)
        finally:
            self.throttle.finished(address, ok)
        return Verdict.ALLOWED if ok else Verdict.DENIED

    def authorized(self, headers: Mapping[str, str]) -> bool:
        """Whether a request with these headers carries the bearer token or a valid session cookie (unthrottled:
        `authorize` is what the server calls)."""
        scheme, _, credential = (headers.get("Authorization") or "").strip().partition(" ")
        if scheme.lower() == "bearer" and self.token_ok(credential.strip()):
            return True
        return any(self.cookie_ok(value) for value in cookie_values(headers.get("Cookie") or "", COOKIE))

    def has_session(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries a valid session cookie (the page then offers to log out)."""
        return any(self.cookie_ok(value) for value in cookie_values(headers.get("Cookie") or "", COOKIE))

    def set_cookie_header(self, secure: bool = False, token: str | None = None) -> str:
        """The Set-Cookie value of a new session logged in with `token`."""
        flags = "; Secure" if secure else ""
        return f"{COOKIE}={self.new_cookie(token)}; Path=/; Max-Age={SESSION_S}; HttpOnly; SameSite=Strict{flags}"

    @staticmethod
    def clear_cookie_header(secure: bool = False) -> str:
        """The Set-Cookie value that makes a browser drop its session cookie."""
        flags = "; Secure" if secure else ""
        return f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{flags}"


def cookie_values(header: str, name: str) -> list[str]:
    """Every value of cookie `name` in a Cookie header (a browser may send several)."""
    values = []
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            values.append(value.strip())
    return values


LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rcswarm dashboard: log in</title>
<style>body{{font-family:system-ui,sans-serif;margin:4em auto;max-width:28em}}
input{{font-size:1em;padding:.3em;width:100%;box-sizing:border-box;margin:.5em 0}}</style></head>
<body><h1>rcswarm dashboard</h1><p>{message}</p>
<form method="post" action="/login">
<label for="token">{label}</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<input type="submit" value="Log in"></form>
<p>Scripts and Prometheus send <code>Authorization: Bearer &lt;{kind}&gt;</code> instead.</p>
</body></html>
"""


def login_page(message: str, credential: str = JOIN_CREDENTIAL) -> bytes:
    """The login form with a fixed `message` (never user input), asking for `credential` (JOIN_CREDENTIAL or
    VIEW_CREDENTIAL)."""
    label, kind = credential_names(credential)
    return LOGIN_PAGE.format(message=message, label=label, kind=kind).encode()


def credential_names(credential: str) -> tuple[str, str]:
    """(the login form's label, the bearer header's placeholder) of what the dashboard asks for (pure)."""
    if credential == VIEW_CREDENTIAL:
        return "View token or join token", "view token"
    return "Join token", "join token"
