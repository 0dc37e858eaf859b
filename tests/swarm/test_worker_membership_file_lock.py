"""Two `rcswarm worker` processes given one --membership-file (without --state-dir): the second is refused (exit 2,
naming the first's pid) before it sends anything, and the first trains on. Before, nothing was locked but the state
dir: the second ended the first's live membership at its start (Leave "restarted: ended by the process that replaced
it"; the first met NOT_FOUND and joined again), and the first, stopping cleanly, removed the file, which by then
recorded the second's membership, so the second's successor could not end it.

A real coordinator on loopback (in-process) and real worker processes; and the rule a clean stop removes the file by
(`remove_membership`: only while it records this process's membership), with the file rewritten by another process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker.membership import Membership, read_membership, remove_membership, write_membership
from tests.helpers.processes import logs_of
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for


def log_of(proc: subprocess.Popen) -> str:
    return Path(proc.log_path).read_text(errors="replace")


def test_a_second_worker_on_the_same_membership_file_is_refused_and_the_first_trains_on(start_coordinator,
                                                                                         spawn_worker, tmp_path: Path):
    local = start_coordinator(tiny_spec(run={"rounds": 0, "workers": 1}, inner={"steps": 2}))
    client = local.client()
    membership = tmp_path / "member" / "m.json"
    membership.parent.mkdir()
    first = spawn_worker(local.target, "first", "--membership-file", str(membership))
    try:
        wait_for(lambda: "trains version" in log_of(first) and client.status().version >= 2, 120,
                 "the first process to train")
        first_id = json.loads(membership.read_text())["worker_id"]
        second = spawn_worker(local.target, "second", "--membership-file", str(membership))
        assert second.wait(timeout=60) == 2, logs_of([first, second])
        refusal = log_of(second).strip()
        assert refusal == (f"rcswarm worker: --membership-file {membership} is in use by another worker (pid "
                           f"{first.pid} on {refusal.split(' on ', 1)[1].split(')', 1)[0]}); stop it first, or give "
                           "this one another --membership-file"), refusal
        refused_at = client.status().version
        wait_for(lambda: client.status().version >= refused_at + 2, 60, "rounds after the refusal")
        leaves = read_state(local.state_dir, lambda store: store.events("leave"))
        assert not any("restarted" in event.reason for event in leaves), leaves
        assert "no longer a member" not in log_of(first), logs_of([first])
        states = {w.worker_id: w.state for w in client.status().workers}
        assert states == {first_id: pb.WORKER_STATE_ACTIVE}, states
        assert json.loads(membership.read_text())["worker_id"] == first_id
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0, logs_of([first])
        assert not membership.exists(), "the first worker, stopping, keeps its membership file"
    finally:
        client.close()


def test_a_stop_removes_the_membership_file_only_while_it_records_this_process(tmp_path: Path):
    """A process that wrote its membership and finds the file rewritten by another process (one that took no lock)
    keeps it: removing it took the other's membership from its successor. Its own it removes."""
    path = tmp_path / "m.json"
    mine = Membership("127.0.0.1:1", "run", "mine", b"s" * 32, "{}")
    write_membership(path, mine)
    theirs = Membership("127.0.0.1:1", "run", "theirs", b"t" * 32, "{}")
    writer = ("from pathlib import Path; from rcswarm.worker.membership import Membership, write_membership; "
              f"write_membership(Path({str(path)!r}), Membership('127.0.0.1:1', 'run', 'theirs', b't' * 32, '{{}}'))")
    subprocess.run([sys.executable, "-c", writer], check=True)
    remove_membership(path)
    assert read_membership(path) == theirs
    write_membership(path, mine)
    remove_membership(path)
    assert not path.exists()
    remove_membership(path)  # none left: nothing to do
