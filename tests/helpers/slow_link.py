"""The benchmarks' loopback link proxy (benchmarks/link_proxy.py: benchmarks/ is no package), loaded by path, and a
loopback sink that records when each byte arrived."""

from __future__ import annotations

import socket
import threading
import time

from tests.helpers.benchmarks import load_benchmark


def link_proxy_module():
    """benchmarks/link_proxy.py as a module (loaded once)."""
    return load_benchmark("link_proxy.py")


class Sink:
    """A loopback server taking one connection: it counts the bytes and notes when the last arrived, and answers each
    byte b"?" with b"!" (a ping)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.received = 0
        self.last_at = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.server.settimeout(30.0)
        conn, _ = self.server.accept()
        conn.settimeout(30.0)
        with conn:
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    break
                self.received += len(data)
                self.last_at = time.monotonic()
                if data == b"?":
                    conn.sendall(b"!")
        self.done.set()

    def close(self) -> None:
        self.server.close()
