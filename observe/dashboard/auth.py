"""Who may read the dashboard: the join token as a bearer header, or a login cookie that is not the token.

`decide_dashboard_auth(host, required, insecure)` is the pure rule: a dashboard bound to a
non-loopback address requires the token unless the operator opts out (`--http-insecure`, with a
warning); `--http-token-required` requires it on loopback too.

`SessionAuth` checks a request. `Authorization: Bearer <token>` (what Prometheus'
`authorization`/`bearer_token_file` sends) is compared with the join token in constant time. A
browser POSTs the token once to /login and gets the cookie `rcswarm_session`, HttpOnly and
SameSite=Strict, whose value is `v1.<issued>.<nonce>.<HMAC-SHA256(key, "v1.<issued>.<nonce>")>`
with `key` random per coordinator process: the cookie never holds the token, expires after
`SESSION_S`, and every cookie is void once the coordinator restarts.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping

from rcswarm.protos.transport import is_loopback_host

COOKIE = "rcswarm_session"
SESSION_S = 12 * 3600
# A cookie issued up to this far "in the future" (a clock step) still counts.
CLOCK_SKEW_S = 60
MAX_LOGIN_BYTES = 4096


def decide_dashboard_auth(host: str, required: bool, insecure: bool, https: bool = False) -> tuple[bool, str | None]:
    """(whether the dashboard requires the join token, a warning for the log or None) (pure).

    Off loopback the warning names what is exposed: everything without the token (`insecure`), or
    the token itself when it travels over plain HTTP (no `https`). ValueError when both flags are
    given: they contradict each other.
    """
    if required and insecure:
        raise ValueError("--http-token-required and --http-insecure contradict each other: give one")
    if is_loopback_host(host):
        return required, None
    if insecure:
        return False, (f"the dashboard on {host} has no authentication (--http-insecure): anyone who reaches it "
                       "sees worker ids, names, devices, the parameters' digest and the metrics")
    if not https:
        return True, (f"the dashboard on {host} takes the join token over plain HTTP: anyone on the network path "
                      "can read it and join the swarm; add --http-tls, or reach it through a TLS proxy or a tunnel")
    return True, None


class SessionAuth:
    """Bearer and cookie checks of dashboard requests.

    Threads: every method runs on the dashboard's request threads; the key is set once in
    `__init__` and only read afterwards, so nothing is locked.
    """

    def __init__(self, check_token: Callable[[str], bool], clock: Callable[[], float] = time.time) -> None:
        self._check_token = check_token
        self._key = secrets.token_bytes(32)
        self._clock = clock

    def token_ok(self, presented: str) -> bool:
        """Whether `presented` is the join token (constant time)."""
        return bool(presented) and self._check_token(presented)

    def new_cookie(self) -> str:
        """A fresh session value: issue time, a random nonce and their HMAC under the process's key."""
        body = f"v1.{int(self._clock())}.{secrets.token_hex(16)}"
        return f"{body}.{self._mac(body)}"

    def cookie_ok(self, value: str) -> bool:
        """Whether `value` is a session this process issued within the last SESSION_S seconds."""
        body, _, mac = value.rpartition(".")
        parts = body.split(".")
        if len(parts) != 3 or parts[0] != "v1" or not parts[1].isdigit():
            return False
        if not hmac.compare_digest(mac.encode(), self._mac(body).encode()):
            return False
        age = self._clock() - int(parts[1])
        return -CLOCK_SKEW_S <= age <= SESSION_S

    def _mac(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    def authorized(self, headers: Mapping[str, str]) -> bool:
        """Whether a request with these headers carries the bearer token or a valid session cookie."""
        scheme, _, credential = (headers.get("Authorization") or "").strip().partition(" ")
        if scheme.lower() == "bearer" and self.token_ok(credential.strip()):
            return True
        return any(self.cookie_ok(value) for value in cookie_values(headers.get("Cookie") or "", COOKIE))

    def set_cookie_header(self, secure: bool = False) -> str:
        """The Set-Cookie value of a new session."""
        flags = "; Secure" if secure else ""
        return f"{COOKIE}={self.new_cookie()}; Path=/; Max-Age={SESSION_S}; HttpOnly; SameSite=Strict{flags}"


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
<label for="token">Join token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<input type="submit" value="Log in"></form>
<p>Scripts and Prometheus send <code>Authorization: Bearer &lt;join token&gt;</code> instead.</p>
</body></html>
"""


def login_page(message: str) -> bytes:
    """The login form with a fixed `message` (never user input)."""
    return LOGIN_PAGE.format(message=message).encode()
