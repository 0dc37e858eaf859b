"""What an operator reads (issue #33): `rcswarm status` of a sweep (each run's version, a run column, tables within
100 columns), a round's log line naming its run, the bootstrap peer's multiaddr in one piece."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from rcswarm.cli import status as status_cli
from rcswarm.coordinator.sweep import open_group
from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.coordinator import deltas_of, push
from tests.helpers.specs import tiny_spec


def _sweep(tmp_path):
    base = tiny_spec(run={"rounds": 10000})
    return open_group(base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [2, 4, 8, 16]}}), tmp_path)


def test_a_sweeps_status_names_each_runs_version_and_fits_100_columns(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rcswarm.coordinator")
    sweep = _sweep(tmp_path)
    try:
        members = [sweep.join(pb.JoinRequest(worker_name=name, device="cuda:0"))
                   for name in ("gpu-node-17.cluster.example.org-4242", "b", "c", "d", "e")]
        run = sweep.runs[0]
        for member in (members[0], members[4]):  # both of the L = 2 run's workers: its round 0 closes
            push(run, member, deltas_of(run, 1e-3), 8)
        status = sweep.status()
        printed = io.StringIO()
        status_cli.report(status, Console(file=printed, width=status_cli.REPORT_WIDTH), totals={})
        text = printed.getvalue()
    finally:
        sweep.close()
    assert max(len(line) for line in text.splitlines()) <= 100, text
    # Each run's own version (one run at 1, the others at 0), not the sweep's lowest against run.rounds.
    assert "L=2: 1 / 10000, L=4: 0 / 10000, L=8: 0 / 10000, L=16: 0 / 10000" in text, text
    for member in members:
        assert member.worker_id in text
    # The rounds table and the workers table say which run a row belongs to.
    assert [r.run_id for r in status.rounds] == [sweep.runs[0].run_id] * 2 + [r.run_id for r in sweep.runs[1:]]
    rounds = text[text.index("rounds (newest last)"):]
    assert [line.split("│")[1].strip() for line in rounds.splitlines() if line.startswith("│ L=")] == [
        "L=2", "L=2", "L=4", "L=8", "L=16"]
    # The round's log line names its run and stays short.
    (closed,) = [r.getMessage() for r in caplog.records if "round 0 closed" in r.getMessage()]
    assert closed.startswith(f"run {sweep.runs[0].run_id}: round 0 closed, version 1 served: ") and len(closed) < 200


def test_the_bootstrap_multiaddr_is_printed_whole_on_a_narrow_console(tmp_path):
    from rcswarm.cli.run_hivemind import print_bootstrap

    maddr = "/ip4/127.0.0.1/tcp/41235/p2p/12D3KooWQ2hDpxRyDszYbiUGc5VqWmsBwFBhdhKm7ZmwKK9kLvbz"
    printed = io.StringIO()
    print_bootstrap(Console(file=printed, width=80), [maddr], tmp_path / "maddrs.txt")
    (line,) = printed.getvalue().splitlines()
    assert line == f"bootstrap peer (in {tmp_path / 'maddrs.txt'}): --initial-peers {maddr}"
