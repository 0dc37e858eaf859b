"""A loopback TCP proxy for benchmarks and tests: a slow link (bandwidth, latency, jitter) with faults on command.

`LinkProxy(upstream_port, link=Link(...))` listens on a free 127.0.0.1 port and forwards every
connection to `upstream_port`. Each connection gets its own link, full duplex: in each direction a
chunk of n bytes occupies the link for 8n / `bandwidth_bps` seconds after the previous one (the
reader waits while the link is busy, so the sender feels the back-pressure of a real bottleneck),
then arrives `rtt_s` / 2 ± a uniform `jitter_s` later, never before the chunk sent ahead of it
(TCP delivers in order). `Link()` forwards at once. The chaos soak (benchmarks/chaos_soak.py)
also cuts, refuses and delays connections (`cut`, `refuse_for`, `delay_for`); the overlap benchmark
(benchmarks/overlap_bench.py) puts the workers' gRPC traffic through a 100 Mbit/s or 1 Gbit/s link
with 50 ms RTT. With a bandwidth set, at most one latency's worth of a direction's bytes waits in
flight (the reader sleeps while the link is busy); every connect has a timeout.

The proxy runs an asyncio loop on its own thread; `cut`, `refuse_for`, `delay_for` and `close` are
called from the driver's thread and hand their work to that loop. The window ends are written under
`_lock` and read by the loop under it; the connections, the `refused` count and the byte counters
are touched only on the loop's thread (a driver reads them once traffic stopped).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"
CONNECT_TIMEOUT_S = 5.0
PUMP_BYTES = 1 << 16
# A direction's reader sleeps once it is this far ahead of its link (fewer, longer sleeps), and a direction that fell
# behind its link's schedule catches up at most this much (a token bucket of BURST_S seconds of bytes).
BURST_S = 0.004


@dataclass(frozen=True)
class Link:
    """One connection's link, each direction: `bandwidth_bps` bits per second (0 = unlimited), round-trip
    latency `rtt_s`, and a uniform jitter of ± `jitter_s` on each chunk's one-way latency."""

    bandwidth_bps: float = 0.0
    rtt_s: float = 0.0
    jitter_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth_bps >= 0:
            raise ValueError(f"bandwidth_bps = {self.bandwidth_bps!r} is invalid: expected bits per second >= 0")
        if not self.rtt_s >= 0:
            raise ValueError(f"rtt_s = {self.rtt_s!r} is invalid: expected seconds >= 0")
        if not 0 <= self.jitter_s <= self.rtt_s / 2:
            raise ValueError(f"jitter_s = {self.jitter_s!r} is invalid: expected seconds in [0, rtt_s / 2 = {self.rtt_s / 2}]")

    @property
    def shaped(self) -> bool:
        return self.bandwidth_bps > 0 or self.rtt_s > 0

    def describe(self) -> str:
        rate = "unlimited" if self.bandwidth_bps <= 0 else f"{self.bandwidth_bps / 1e6:g} Mbit/s"
        return f"{rate}, RTT {self.rtt_s * 1e3:g} ms ± {self.jitter_s * 1e3:g} ms"


class LinkProxy:
    """A loopback TCP proxy to `upstream_port` through a `Link` per connection; cuts, refuses and delays on command."""

    def __init__(self, upstream_port: int, link: Link = Link(), seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.link = link
        self.port = 0
        self.refused = 0
        # Bytes forwarded upstream (client → server) and downstream, over every connection.
        self.bytes_up = 0
        self.bytes_down = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._refuse_until = 0.0
        self._delay_until = 0.0
        self._delay_s = 0.0
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="link-proxy", daemon=True)

    def start(self) -> int:
        """Listen on a free loopback port; returns it."""
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, HOST, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=CONNECT_TIMEOUT_S)

    def cut(self) -> int:
        """Abort every open connection (both sides); the number cut."""
        return self._call(self._cut())

    async def _cut(self) -> int:
        links, self._links = self._links, set()
        for client, upstream in links:
            client.transport.abort()
            upstream.transport.abort()
        return len(links)

    def refuse_for(self, seconds: float) -> None:
        """Close every new connection at once for `seconds`."""
        with self._lock:
            self._refuse_until = time.monotonic() + seconds

    def delay_for(self, seconds: float, delay_s: float) -> None:
        """Hold every chunk `delay_s` before forwarding it, for `seconds`."""
        with self._lock:
            self._delay_until, self._delay_s = time.monotonic() + seconds, delay_s

    def _current_delay(self) -> float:
        with self._lock:
            return self._delay_s if time.monotonic() < self._delay_until else 0.0

    def _refusing(self) -> bool:
        with self._lock:
            return time.monotonic() < self._refuse_until

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing():
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(HOST, self.upstream_port),
                                                          CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            writer.transport.abort()
            return
        link = (writer, up_writer)
        self._links.add(link)
        await asyncio.gather(self._pump(reader, up_writer, "up"), self._pump(up_reader, writer, "down"),
                             return_exceptions=True)
        self._links.discard(link)
        writer.transport.abort()
        up_writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        """Copy bytes one way until EOF or an error: through the link when it is shaped, else at once (holding each
        chunk while a delay window is open)."""
        if self.link.shaped:
            await self._shaped_pump(reader, writer, direction)
            return
        while True:
            chunk = await reader.read(PUMP_BYTES)
            if not chunk:
                writer.transport.abort()
                return
            delay = self._current_delay()
            if delay:
                await asyncio.sleep(delay)
            self._count(direction, len(chunk))
            writer.write(chunk)
            await writer.drain()

    def _count(self, direction: str, size: int) -> None:
        if direction == "up":
            self.bytes_up += size
        else:
            self.bytes_down += size

    async def _shaped_pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        """The link's one direction (module docstring): the reader serializes chunks onto the link, a deliverer
        writes each at its arrival time, in order."""
        link = self.link
        in_flight: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliverer = asyncio.ensure_future(self._deliver(in_flight, writer, direction))
        busy_until = 0.0  # when the link finishes sending what it was given (monotonic seconds)
        arrives_last = 0.0
        try:
            while True:
                chunk = await reader.read(PUMP_BYTES)
                if not chunk:
                    break
                now = time.monotonic()
                # A token bucket of BURST_S: a link behind its schedule (an oversleep, a slow loop) catches up that much.
                sent = max(busy_until, now - BURST_S) + (8 * len(chunk) / link.bandwidth_bps if link.bandwidth_bps > 0 else 0.0)
                busy_until = sent
                jitter = self._random.uniform(-link.jitter_s, link.jitter_s) if link.jitter_s > 0 else 0.0
                # Never before it was read plus the one-way latency (the bucket's credit is bandwidth, not time).
                arrives_last = max(arrives_last, max(sent, now) + link.rtt_s / 2 + jitter + self._current_delay())
                in_flight.put_nowait((arrives_last, chunk))
                if busy_until - now > BURST_S:
                    await asyncio.sleep(busy_until - now)
        finally:
            in_flight.put_nowait((0.0, b""))
            await deliverer

    async def _deliver(self, in_flight: asyncio.Queue, writer: asyncio.StreamWriter, direction: str) -> None:
        while True:
            arrives, chunk = await in_flight.get()
            if not chunk:
                writer.transport.abort()
                return
            wait = arrives - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._count(direction, len(chunk))
            writer.write(chunk)
            await writer.drain()

    async def _cancel_all(self) -> None:
        """Cancel the connections' tasks and wait for them, so that none is pending when the loop stops."""
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _close_server(self) -> None:
        assert self._server is not None
        self._server.close()

    def close(self) -> None:
        """Stop listening, cut every connection and stop the loop's thread."""
        if self._server is not None:
            # asyncio's Server is not thread-safe: close it on its loop (a connection ending there races with it).
            self._call(self._close_server())
            self.cut()
            self._call(self._cancel_all())
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=CONNECT_TIMEOUT_S)
