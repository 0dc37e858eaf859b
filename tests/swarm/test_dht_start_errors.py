"""`rcswarm dht` with a --host-maddrs its p2pd cannot listen on (a port over 65535, an address not on this machine):
the daemon's P2PDaemonError ended the command in a traceback (CLI fuzz review, 2026-11-29). Now: one ERROR line
naming what p2pd said, exit 1. Real p2pd processes, so here among the tests that start processes."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("maddr, said", [("/ip4/127.0.0.1/tcp/70000", "failed to parse multiaddr"),
                                         ("/ip4/192.0.2.1/tcp/0", "failed to listen on any addresses")])
def test_a_host_maddr_p2pd_cannot_listen_on_is_one_line_and_exit_1(maddr: str, said: str) -> None:
    done = subprocess.run([sys.executable, "-m", "rcswarm.cli", "dht", "--host-maddrs", maddr],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "bootstrap peer cannot start" in line]
    assert len(errors) == 1 and said in errors[0], done.stderr
