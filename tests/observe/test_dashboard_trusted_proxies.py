"""The dashboard behind a reverse proxy (`--http-trusted-proxy`, observe/dashboard/proxies.py).

Before: every request through a proxy had the proxy's address, so one client guessing tokens put the proxy, and every
user behind it, in the login throttle's backoff, and all of them shared 16 connections. Now a trusted proxy's
X-Forwarded-For names the client (walked from the right, past trusted entries), an untrusted peer's is ignored, and a
trusted proxy is exempt from the per-address connection cap (the global cap holds).

Every server here binds 127.0.0.1; 127.0.0.2 and 127.0.0.3 are only clients' source addresses (Linux routes all of
127/8 to loopback)."""

from __future__ import annotations

import http.client
import ipaddress
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.tokens import JoinTokens
from rcswarm.observe.dashboard import Dashboard
from rcswarm.observe.dashboard.auth import LoginThrottle, SessionAuth
from rcswarm.observe.dashboard.proxies import (
    MAX_FORWARDED_CHARS,
    MAX_FORWARDED_ENTRIES,
    Client,
    TrustedProxies,
    forwarded_client,
    parse_address,
    parse_trusted_proxies,
    parse_trusted_proxy,
)
from rcswarm.state.store import StateStore
from tests.helpers.dashboard import held_open
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for

TRUSTED = parse_trusted_proxies(["10.0.0.0/8", "fd00::/8", "127.0.0.1"])
PROXY = "10.0.0.5"
ALICE, MALLORY = "203.0.113.7", "198.51.100.66"


# -- the pure rule: which client a request is from


def test_an_untrusted_peer_is_its_own_client_whatever_its_header_says() -> None:
    assert forwarded_client("192.0.2.9", [ALICE], TRUSTED) == Client("192.0.2.9")
    assert forwarded_client("192.0.2.9", [f"{ALICE}, {PROXY}"], TRUSTED) == Client("192.0.2.9")
    assert forwarded_client("2001:db8::9", ["2001:db8::1"], TRUSTED) == Client("2001:db8::9")
    assert forwarded_client(PROXY, [ALICE], ()) == Client(PROXY), "nothing trusted: nothing read"


def test_a_trusted_proxy_names_its_client() -> None:
    client = forwarded_client(PROXY, [ALICE], TRUSTED)
    assert client == Client(ALICE, PROXY) and client.address == ALICE
    assert str(client) == f"{ALICE} (via {PROXY})", "log lines name the client and the proxy"
    assert str(forwarded_client("192.0.2.9", [ALICE], TRUSTED)) == "192.0.2.9"


def test_what_the_client_wrote_itself_is_never_believed() -> None:
    # The client sent "X-Forwarded-For: 10.0.0.1" (a trusted address) and "1.2.3.4"; the proxy appended its peer.
    assert forwarded_client(PROXY, [f"1.2.3.4, 10.0.0.1, {MALLORY}"], TRUSTED).address == MALLORY
    assert forwarded_client(PROXY, [f"{ALICE}, {MALLORY}"], TRUSTED).address == MALLORY


def test_a_chain_of_trusted_proxies_is_walked_from_the_right() -> None:
    # client -> 10.1.1.1 (edge) -> 10.2.2.2 (ingress) -> PROXY: each appends its peer.
    assert forwarded_client(PROXY, [f"6.6.6.6, {ALICE}, 10.1.1.1, 10.2.2.2"], TRUSTED) == Client(ALICE, PROXY)
    # Several headers are one list, in the order they came.
    assert forwarded_client(PROXY, [f"6.6.6.6, {ALICE}", "10.1.1.1", "10.2.2.2"], TRUSTED).address == ALICE
    # Every entry trusted (a request from the proxies' own network): the leftmost walked, a trusted address.
    assert forwarded_client(PROXY, ["10.3.3.3, 10.4.4.4"], TRUSTED) == Client("10.3.3.3", PROXY)


def test_no_header_or_an_empty_one_is_the_proxy_itself() -> None:
    assert forwarded_client(PROXY, [], TRUSTED) == Client(PROXY)
    assert forwarded_client(PROXY, [""], TRUSTED) == Client(PROXY)
    assert forwarded_client(PROXY, [" , ,"], TRUSTED) == Client(PROXY)
    assert TrustedProxies(TRUSTED).client(PROXY, None) == Client(PROXY)


@pytest.mark.parametrize("header, expected", [
    ("unknown", PROXY),                                    # the rightmost entry is not an address: the peer
    (f"{ALICE}, unknown", PROXY),
    (f"{ALICE}, _hidden, 10.1.1.1", "10.1.1.1"),           # the walk stops at it: the last trusted address walked
    (f"garbage, {ALICE}", ALICE),                          # left of the client: never read
    (f"{ALICE}\r\nX-Evil: 1", PROXY),                      # no control characters reach a log line or the table
    (f"{ALICE}%eth0", PROXY),
    ("fe80::1%eth0", PROXY),
    (f"{ALICE}:54321", ALICE),                             # a proxy that adds the client's port
    ("[2001:db8::7]:443", "2001:db8::7"),
    ("[2001:db8::7]", "2001:db8::7"),
    ("[2001:db8::7]x", PROXY),
    ("2001:DB8:0:0::7", "2001:db8::7"),                    # canonical text: one client, one key
    ("::ffff:203.0.113.7", ALICE),                         # IPv4-mapped: the IPv4 address
    (f"{ALICE}:port", PROXY),
    ("1.2.3.4.5", PROXY),
    (f"{ALICE},,, ", ALICE),                               # empty list elements are skipped
])
def test_entries_that_are_not_addresses(header: str, expected: str) -> None:
    assert forwarded_client(PROXY, [header], TRUSTED).address == expected


def test_ipv6_peers_and_clients() -> None:
    assert forwarded_client("fd00::5", ["2001:db8::1"], TRUSTED) == Client("2001:db8::1", "fd00::5")
    assert forwarded_client("fd00::5", ["2001:db8::1, fd12::1"], TRUSTED).address == "2001:db8::1"
    assert forwarded_client("fd00::5", [ALICE], TRUSTED).address == ALICE, "an IPv6 proxy forwarding IPv4 clients"
    # A dual-stack listener sees IPv4 peers as IPv4-mapped IPv6 addresses: trusted as their IPv4 address.
    assert forwarded_client("::ffff:10.0.0.5", [ALICE], TRUSTED) == Client(ALICE, "::ffff:10.0.0.5")
    assert forwarded_client("::ffff:192.0.2.9", [ALICE], TRUSTED) == Client("::ffff:192.0.2.9")


def test_an_oversized_header_is_read_from_its_right_end_only() -> None:
    # A client pads its own header: the proxy's entry at the right is still read.
    padded = "9.9.9.9, " * 10_000 + ALICE
    assert len(padded) > 50 * MAX_FORWARDED_CHARS
    assert forwarded_client(PROXY, [padded], TRUSTED).address == ALICE
    assert forwarded_client(PROXY, ["x" * 100_000 + f", {ALICE}"], TRUSTED).address == ALICE
    assert forwarded_client(PROXY, ["9" * 100_000], TRUSTED) == Client(PROXY), "a cut entry is dropped"
    assert forwarded_client(PROXY, ["1.1.1.1"] * 200 + [ALICE], TRUSTED).address == ALICE, "many headers"
    # More trusted entries than are read: the walk ends at the bound, on the leftmost trusted address it read.
    chain = [f"10.0.0.{index}" for index in range(1, 40)]
    client = forwarded_client(PROXY, [", ".join([ALICE, *chain])], TRUSTED)
    assert client.address == chain[-MAX_FORWARDED_ENTRIES] and client.address != ALICE


def test_parse_address() -> None:
    assert parse_address("127.0.0.1") == ipaddress.ip_address("127.0.0.1")
    assert parse_address(" ::1 ") == ipaddress.ip_address("::1")
    assert parse_address("") is None and parse_address("localhost") is None and parse_address("1" * 100) is None


# -- the option's values


@pytest.mark.parametrize("text, network", [
    ("10.0.0.0/8", "10.0.0.0/8"),
    ("10.1.2.3", "10.1.2.3/32"),
    (" 192.168.0.0/16 ", "192.168.0.0/16"),
    ("fd00::/8", "fd00::/8"),
    ("::1", "::1/128"),
    ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
])
def test_a_trusted_proxy_is_a_network_or_an_address(text: str, network: str) -> None:
    assert parse_trusted_proxy(text) == ipaddress.ip_network(network)


@pytest.mark.parametrize("text, said", [
    ("ingress-nginx", "'ingress-nginx' does not appear to be an IPv4 or IPv6 network"),
    ("10.1.2.3/16", "it has host bits set; did you mean 10.1.0.0/16?"),
    ("10.0.0.0/33", "expected an IP network"),
    ("", "got nothing"),
    ("0.0.0.0/0", "trusts every address"),
    ("::/0", "trusts every address"),
])
def test_a_bad_trusted_proxy_is_refused_naming_it(text: str, said: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_trusted_proxy(text)
    message = str(refused.value)
    assert message.startswith(f"--http-trusted-proxy {text!r}: ") and said in message and "\n" not in message
    with pytest.raises(ValueError, match="--http-trusted-proxy 'bogus'"):
        TrustedProxies(["10.0.0.0/8", "bogus"])


def test_trusts() -> None:
    proxies = TrustedProxies(["10.0.0.0/8", "fd00::/8"])
    assert proxies.trusts("10.9.9.9") and proxies.trusts("::ffff:10.9.9.9") and proxies.trusts("fd00::1")
    assert not proxies.trusts("11.0.0.1") and not proxies.trusts("::1") and not proxies.trusts("nonsense")
    assert not TrustedProxies().trusts("10.9.9.9") and not TrustedProxies()


# -- a real dashboard on 127.0.0.1 behind a "proxy"


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[SwarmCoordinator]:
    spec = tiny_spec()
    service = SwarmCoordinator(spec, StateStore(tmp_path / "state", spec.coordinator.keep_checkpoints,
                                                spec.coordinator.durable))
    yield service
    service.close()


def guarded(coordinator: SwarmCoordinator, now: list[float], **kwargs: Any) -> Dashboard:
    """A dashboard requiring TOKEN whose throttle gives 2 free failures: the third earns 60 s of backoff (at `now`)."""
    throttle = LoginThrottle(clock=lambda: now[0], free=2, first_s=60.0)
    return Dashboard(coordinator, auth=SessionAuth(JoinTokens([TOKEN]).accepts_token, throttle=throttle),
                     **kwargs).start()


def send(port: int, method: str, path: str, headers: dict[str, str] | None = None, body: str | None = None,
         source: str = "127.0.0.1") -> tuple[int, http.client.HTTPMessage]:
    """One request to the dashboard on 127.0.0.1 from the source address `source`: (status, headers)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        response.read()
        return response.status, response.headers
    finally:
        connection.close()


def login(port: int, token: str, client: str | None = None, source: str = "127.0.0.1") -> int:
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if client is not None:
        headers["X-Forwarded-For"] = client
    return send(port, "POST", "/login", headers, f"token={token}", source)[0]


def test_one_clients_guesses_through_a_trusted_proxy_throttle_only_that_client(
        coordinator: SwarmCoordinator, caplog: pytest.LogCaptureFixture) -> None:
    """Before: the three guesses put 127.0.0.1, the proxy, in backoff, and Alice's right token got 429."""
    now = [0.0]
    dashboard = guarded(coordinator, now, trusted_proxies=["127.0.0.1"])
    try:
        port = dashboard.port
        with caplog.at_level(logging.INFO, logger="rcswarm.dashboard"):
            assert [login(port, f"guess{index}", MALLORY) for index in range(3)] == [401] * 3
        assert login(port, TOKEN, MALLORY) == 429, "the guesser waits, even with the right token"
        bearer = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": MALLORY}
        assert send(port, "GET", "/api/status", bearer)[0] == 429
        assert login(port, TOKEN, ALICE) == 303, "another client behind the same proxy logs in"
        assert send(port, "GET", "/api/status", {**bearer, "X-Forwarded-For": ALICE})[0] == 200
        # A client cannot shed its backoff by claiming another address in front of the proxy's entry.
        assert login(port, TOKEN, f"{ALICE}, {MALLORY}") == 429
        failed = [r.getMessage() for r in caplog.records if "a failed login from" in r.getMessage()]
        assert failed == [f"dashboard: a failed login from {MALLORY} (via 127.0.0.1)"], failed
        assert dashboard.auth is not None and dashboard.auth.throttle.wait_s("127.0.0.1") == 0.0
        now[0] += 60.0
        assert login(port, TOKEN, MALLORY) == 303
    finally:
        dashboard.stop()


def test_an_untrusted_peers_forwarded_for_is_ignored(coordinator: SwarmCoordinator,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    dashboard = guarded(coordinator, now, trusted_proxies=["127.0.0.2"])
    try:
        port = dashboard.port
        # 127.0.0.1 is no trusted proxy: each guess claims another client, all count against 127.0.0.1.
        with caplog.at_level(logging.INFO, logger="rcswarm.dashboard"):
            assert [login(port, "guess", f"192.0.2.{index}") for index in range(3)] == [401] * 3
        assert login(port, TOKEN, ALICE) == 429, "a made-up X-Forwarded-For does not escape the backoff"
        failed = [r.getMessage() for r in caplog.records if "a failed login from" in r.getMessage()]
        assert failed == ["dashboard: a failed login from 127.0.0.1"], failed
        # Through the trusted proxy (source 127.0.0.2), Alice is herself.
        assert login(port, TOKEN, ALICE, source="127.0.0.2") == 303
        # Without trusted proxies, the header is never read (as before).
        plain = guarded(coordinator, [0.0])
        try:
            assert [login(plain.port, "guess", f"192.0.2.{index}") for index in range(3)] == [401] * 3
            assert login(plain.port, TOKEN, ALICE, source="127.0.0.2") == 303
            assert login(plain.port, TOKEN, ALICE) == 429
        finally:
            plain.stop()
    finally:
        dashboard.stop()


def _trickler(port: int, source: str) -> socket.socket:
    """A connection from `source` that sends a request line and then nothing more (the server holds it until the
    request's deadline)."""
    connection = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    connection.settimeout(5)
    connection.bind((source, 0))
    connection.connect(("127.0.0.1", port))
    connection.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
    return connection


def test_a_trusted_proxy_is_exempt_from_the_per_address_cap_not_the_global_one(
        coordinator: SwarmCoordinator) -> None:
    """Before: the proxy (all clients) held 2 connections here, as any one address."""
    dashboard = Dashboard(coordinator, max_connections=10, max_connections_per_address=2, header_deadline_s=30.0,
                          request_deadline_s=60.0, trusted_proxies=["127.0.0.2"]).start()
    held: list[socket.socket] = []
    try:
        port = dashboard.port
        proxied = [_trickler(port, "127.0.0.2") for _ in range(5)]
        other = [_trickler(port, "127.0.0.3") for _ in range(4)]
        held += proxied + other
        # The server takes connections in order: once this request is answered, those before it were placed.
        assert send(port, "GET", "/healthz")[0] == 200
        wait_for(lambda: sum(map(held_open, other)) == 2, 5, "the untrusted address held to 2 connections")
        assert all(map(held_open, proxied)), "the trusted proxy holds more than 2"
        assert "127.0.0.2" not in dashboard.server._per_address
        # 5 + 2 held; 3 more places of 10 in all, the proxy's included.
        more = [_trickler(port, "127.0.0.2") for _ in range(4)]
        held += more
        wait_for(lambda: not held_open(more[-1]), 5, "the connection past the global cap closed")
        assert all(map(held_open, more[:3])) and all(map(held_open, proxied))
    finally:
        for connection in held:
            connection.close()
        dashboard.stop()
