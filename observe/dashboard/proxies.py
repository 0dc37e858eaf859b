"""Which client a dashboard request is from when it arrives through a trusted reverse proxy (`--http-trusted-proxy`).

Behind a proxy (an ingress controller, nginx, a load balancer) every connection comes from the proxy's address, and
the dashboard keys its login throttle (`auth.LoginThrottle`) and its log lines on the client's address: one person
guessing tokens would put the proxy, i.e. every user behind it, in backoff. `--http-trusted-proxy CIDR` (repeatable:
IPv4 or IPv6 networks, or single addresses) names the proxies whose `X-Forwarded-For` header the dashboard believes.

`forwarded_client(peer, forwarded_for, trusted)` is the pure rule:

* A peer outside every trusted network: the peer itself. Its `X-Forwarded-For` is never read (anyone can send one).
* A trusted peer: `X-Forwarded-For` (every such header, in order, as one comma-separated list) is walked from the
  right, the end the nearest proxy appended to; entries that are trusted addresses themselves (a chain of proxies)
  are skipped, and the first untrusted entry is the client. Only the entries right of it were written by trusted
  proxies, so only they are believed: whatever a client put in the header itself lies further left and is never
  read.
* Every entry walked trusted (a request from a proxy's own network, e.g. its health check): the leftmost one walked,
  as nginx's `real_ip_recursive` takes it. It is a trusted address, written by a trusted proxy.
* An entry that is not an IP address (`unknown`, an obfuscated RFC 7239 name, garbage) ends the walk: the client is
  the last trusted address walked (the peer when the rightmost entry is one). An address is the key of a throttle
  table and goes into log lines, so nothing but a parsed address (its canonical text) is ever used. Empty list
  elements are skipped (HTTP list syntax); `1.2.3.4:5678` and `[2001:db8::1]:5678` (a proxy that adds the client's
  port) are taken without the port; a zone (`fe80::1%eth0`) is refused; an IPv4-mapped IPv6 address is its IPv4
  address.
* Bounded: only the rightmost MAX_FORWARDED_CHARS characters and MAX_FORWARDED_ENTRIES entries are read (a longer
  header is cut at the left, the cut entry dropped). A client cannot make the header unusable by padding it: its own
  part is at the left, cut first. When the walk reaches that bound with every entry trusted, the leftmost walked is
  taken, as above.

No header but `X-Forwarded-For` is read (not RFC 7239 `Forwarded`, not `X-Real-IP`). The per-address connection cap
cannot know a connection's client at accept time (the header comes later); a trusted peer is exempt from it and
held by the global cap alone (`server._Server`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

FORWARDED_FOR = "X-Forwarded-For"
# How much of X-Forwarded-For is read, from its right end: a real chain is a handful of proxies.
MAX_FORWARDED_CHARS = 1024
MAX_FORWARDED_ENTRIES = 16
FLAG = "--http-trusted-proxy"
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def parse_trusted_proxy(text: str, flag: str = FLAG) -> IPNetwork:
    """The network of one `--http-trusted-proxy` value: an IPv4 or IPv6 network (`10.0.0.0/8`, `fd00::/8`) or a single
    address (`10.1.2.3`, `::1`); an IPv4-mapped IPv6 network is its IPv4 network. ValueError naming the value (and
    `flag`) when it is not one, has host bits set, or is a /0 (every address: any client could then choose the
    address it is throttled and logged as)."""
    value = text.strip()
    if not value:
        raise ValueError(f"{flag} {text!r}: expected an IP network (10.0.0.0/8, fd00::/8) or address, got nothing")
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        hint = ""
        try:
            hint = f"; did you mean {ipaddress.ip_network(value, strict=False)}?"
        except ValueError:
            pass
        reason = "it has host bits set" if hint else str(exc)
        raise ValueError(f"{flag} {text!r}: expected an IP network (10.0.0.0/8, fd00::/8) or address: {reason}"
                         f"{hint}") from None
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96 and network.subnet_of(_MAPPED):
        mapped = network.network_address.ipv4_mapped
        assert mapped is not None
        network = ipaddress.IPv4Network(f"{mapped}/{network.prefixlen - 96}")
    if network.prefixlen == 0:
        raise ValueError(f"{flag} {text!r}: trusts every address, so any client could send X-Forwarded-For and "
                         "choose the address it is throttled and logged as; name the proxies' network")
    return network


def parse_trusted_proxies(values: Iterable[str], flag: str = FLAG) -> tuple[IPNetwork, ...]:
    """Every value's network (`parse_trusted_proxy`; ValueError names the first bad one)."""
    return tuple(parse_trusted_proxy(value, flag) for value in values)


def parse_address(text: str) -> IPAddress | None:
    """One address as a peer or an X-Forwarded-For entry gives it, or None: `1.2.3.4`, `2001:db8::1`, `[2001:db8::1]`,
    with a port `1.2.3.4:5678` or `[2001:db8::1]:5678`; an IPv4-mapped IPv6 address as its IPv4 address; no zone."""
    value = text.strip()
    if not value or len(value) > 64 or "%" in value:
        return None
    if value.startswith("["):
        close = value.find("]")
        rest = value[close + 1:] if close > 0 else "x"
        if rest and not (rest.startswith(":") and rest[1:].isdigit() and rest[1:].isascii()):
            return None
        value = value[1:close]
    elif value.count(":") == 1:  # IPv4:port (an IPv6 address has at least two colons)
        value, _, port = value.partition(":")
        if not (port.isdigit() and port.isascii()):
            return None
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: IPAddress, trusted: Sequence[IPNetwork]) -> bool:
    return any(address.version == network.version and address in network for network in trusted)


def _rightmost_entries(forwarded_for: Sequence[str]) -> list[str]:
    """The header's entries, rightmost first: at most MAX_FORWARDED_ENTRIES non-empty ones from its last
    MAX_FORWARDED_CHARS characters (several headers read as one list, joined by commas; an entry cut by the bound
    dropped)."""
    entries: list[str] = []
    budget = MAX_FORWARDED_CHARS
    for value in reversed(forwarded_for):
        if budget <= 0 or len(entries) >= MAX_FORWARDED_ENTRIES:
            break
        part = value[-budget:]
        cut = len(value) > budget
        budget -= len(value) + 1  # the comma joining it to the header before
        pieces = part.split(",")
        if cut:
            pieces = pieces[1:]
        entries.extend(piece.strip() for piece in reversed(pieces) if piece.strip())
    return entries[:MAX_FORWARDED_ENTRIES]


@dataclass(frozen=True)
class Client:
    """Whom a request is from: `address` (the throttle's key and what the log says), and `proxy`, the peer it came
    through when that is not the client itself (None for a direct connection)."""

    address: str
    proxy: str | None = None

    def __str__(self) -> str:
        return self.address if self.proxy is None else f"{self.address} (via {self.proxy})"


def forwarded_client(peer: str, forwarded_for: Sequence[str], trusted: Sequence[IPNetwork]) -> Client:
    """The client of a request from the TCP peer `peer` with these X-Forwarded-For header values (in the order they
    came), given the trusted proxies' networks (pure; the rule is the module's docstring)."""
    peer_address = parse_address(peer)
    if not trusted or peer_address is None or not _trusted(peer_address, trusted) or not forwarded_for:
        return Client(peer)
    client = peer_address
    for entry in _rightmost_entries(forwarded_for):
        address = parse_address(entry)
        if address is None:
            break
        client = address
        if not _trusted(address, trusted):
            break
    return Client(peer) if client == peer_address else Client(str(client), peer)


class TrustedProxies:
    """The dashboard's trusted proxies (`--http-trusted-proxy`): `trusts(peer)` (the connection cap's exemption) and
    `client(peer, headers)` (`forwarded_client`). Immutable; any thread."""

    def __init__(self, networks: Iterable[str | IPNetwork] = ()) -> None:
        self.networks: tuple[IPNetwork, ...] = tuple(
            network if isinstance(network, ipaddress.IPv4Network | ipaddress.IPv6Network)
            else parse_trusted_proxy(network) for network in networks)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, peer: str) -> bool:
        """Whether `peer` (a TCP peer's address) is inside a trusted network."""
        if not self.networks:
            return False
        address = parse_address(peer)
        return address is not None and _trusted(address, self.networks)

    def client(self, peer: str, forwarded_for: Sequence[str] | None) -> Client:
        return forwarded_client(peer, forwarded_for or (), self.networks)


def trusted_proxies_problem(values: Sequence[str], http_port: int | None, flag: str = FLAG) -> str | None:
    """What is wrong with the `--http-trusted-proxy` values of a command line, in one line, or None (pure): one that
    is not a network (`parse_trusted_proxy`'s message, naming it), or any without the dashboard (`http_port` None)."""
    if not values:
        return None
    if http_port is None:
        return f"{flag}: only with --http-port (it names the reverse proxies in front of the dashboard)"
    try:
        parse_trusted_proxies(values, flag)
    except ValueError as exc:
        return str(exc)
    return None


def trusted_proxies_line(values: Sequence[str]) -> str:
    """The start-up log line's words about the trusted proxies (`values` parsed already)."""
    networks = ", ".join(str(network) for network in parse_trusted_proxies(values))
    return (f"X-Forwarded-For names the client of requests from {networks} (--http-trusted-proxy): for the login "
            "throttle and the log lines; the per-address connection cap does not apply to those addresses")
