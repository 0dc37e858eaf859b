"""A worker process SIGKILLed and started again with `--membership-file` ends the killed process's membership at once
(issue #31's goodput): the round it was in stops waiting for it within seconds, not a lease, and the new process built
its model and data before joining. A real coordinator on loopback, a steady in-process worker, and `rcswarm worker`
processes killed and restarted as a supervisor would."""

from __future__ import annotations

import stat
import threading
import time
from pathlib import Path

import pytest

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker import Worker
from tests.helpers.processes import logs_of
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for
from tests.helpers.worker import _options

# A lease and a deadline far longer than the test may wait: only the restarted process's Leave lets rounds go on.
LEASE_S, DEADLINE_S = 120.0, 240.0


@pytest.mark.parametrize("flag", ["--membership-file", "--state-dir"])
def test_a_restarted_worker_ends_its_killed_membership_and_trains(start_coordinator, spawn_worker, tmp_path: Path,
                                                                  flag: str):
    """With --state-dir alone the membership file is kept there (membership.json), and a second worker given the same
    state dir while the first runs is refused at once: it would have ended the first's membership at its start."""
    local = start_coordinator(tiny_spec(run={"rounds": 0}, inner={"steps": 2}, coordinator={"lease_s": LEASE_S},
                                        sync={"round_deadline_s": DEADLINE_S}))
    steady = Worker(_options(local.target, patience_s=60.0), TOKEN)
    thread = threading.Thread(target=steady.run, daemon=True)
    thread.start()
    client = local.client()
    membership = tmp_path / "member" / "membership.json"
    membership.parent.mkdir()
    where = str(membership) if flag == "--membership-file" else str(membership.parent)
    try:
        first = spawn_worker(local.target, "first", flag, where)
        wait_for(lambda: "trains version" in Path(first.log_path).read_text() and client.status().version >= 3, 120,
                 "the first process to train")
        assert stat.S_IMODE(membership.stat().st_mode) == 0o600
        if flag == "--state-dir":
            intruder = spawn_worker(local.target, "intruder", flag, where)
            assert intruder.wait(timeout=60) == 2, logs_of([intruder])
            refusal = Path(intruder.log_path).read_text()
            assert f"state dir {where} is in use by another worker (pid {first.pid} on " in refusal, refusal
        killed_id = [w.worker_id for w in client.status().workers if w.name == "first" and w.state == pb.WORKER_STATE_ACTIVE]
        first.kill()
        first.wait(timeout=10)
        stuck_at = client.status().version
        killed = time.monotonic()
        second = spawn_worker(local.target, "second", flag, where)
        # The killed membership ends when the new process starts (its Leave), and the swarm goes on training.
        wait_for(lambda: client.status().version >= stuck_at + 3, 60, "rounds after the restart")
        waited = time.monotonic() - killed
        assert waited < LEASE_S / 2, f"the rounds waited {waited:.0f}s"
        log = Path(second.log_path).read_text()
        assert "ended its previous membership" in log and killed_id and killed_id[0] in log, logs_of([second])
        wait_for(lambda: "trains version" in Path(second.log_path).read_text(), 60, "the second process to train")
        line = next(x for x in Path(second.log_path).read_text().splitlines() if "trains version" in x)
        assert "built ahead" in line, line
        states = {w.worker_id: w.state for w in client.status().workers}
        assert states.get(killed_id[0]) != pb.WORKER_STATE_ACTIVE, states  # no longer active
        second.terminate()
        assert second.wait(timeout=30) == 0, logs_of([second])
        assert not membership.exists(), "a worker that left keeps no membership file"
    finally:
        steady.stop.set()
        thread.join(timeout=30)
        client.close()
