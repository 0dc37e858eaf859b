"""The slow-link emulator the overlap benchmark puts between workers and coordinator (benchmarks/link_proxy.py)."""

import socket
import time

import pytest

from tests.helpers.slow_link import Sink, link_proxy_module

proxy_module = link_proxy_module()


def _through(link):
    sink = Sink()
    proxy = proxy_module.LinkProxy(sink.port, link=link, seed=1)
    proxy.start()
    return sink, proxy, socket.create_connection(("127.0.0.1", proxy.port), timeout=30.0)


def test_the_link_s_bandwidth_is_within_ten_percent_of_its_setting():
    bandwidth, rtt = 8e6, 0.04
    sink, proxy, conn = _through(proxy_module.Link(bandwidth_bps=bandwidth, rtt_s=rtt, jitter_s=0.005))
    payload = bytes(2_000_000)
    try:
        started = time.monotonic()
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        assert sink.done.wait(30.0)
    finally:
        conn.close()
        proxy.close()
        sink.close()
    assert sink.received == len(payload) and proxy.bytes_up == len(payload)
    # The bytes took their serialization time on the link plus one one-way latency (± the jitter).
    measured = 8 * len(payload) / (sink.last_at - started - rtt / 2)
    assert abs(measured - bandwidth) <= 0.10 * bandwidth, f"{measured / 1e6:.2f} Mbit/s through an 8 Mbit/s link"


def test_a_round_trip_takes_at_least_the_link_s_rtt():
    rtt, jitter = 0.05, 0.01
    sink, proxy, conn = _through(proxy_module.Link(rtt_s=rtt, jitter_s=jitter))
    try:
        times = []
        for _ in range(5):
            started = time.monotonic()
            conn.sendall(b"?")
            assert conn.recv(1) == b"!"
            times.append(time.monotonic() - started)
    finally:
        conn.close()
        proxy.close()
        sink.close()
    assert min(times) >= rtt - 2 * jitter, times


def test_a_link_is_validated():
    with pytest.raises(ValueError, match="bandwidth_bps"):
        proxy_module.Link(bandwidth_bps=-1.0)
    with pytest.raises(ValueError, match="jitter_s"):
        proxy_module.Link(rtt_s=0.01, jitter_s=0.02)
