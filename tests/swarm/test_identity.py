"""Join-token rotation while a real worker process keeps training (issue 14): `rcswarm coordinator --token-file`."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker.client import CoordinatorClient, RetryPolicy
from tests.helpers.coordinator import free_port
from tests.helpers.processes import logs_of, worker_env
from tests.helpers.specs import tiny_spec, write_spec
from tests.helpers.waiting import wait_for
from tests.helpers.wire import refused


def coordinator_with_token_file(tmp_path: Path, token_file: Path) -> tuple[subprocess.Popen, str, Path]:
    """A real `python -m rcswarm.cli coordinator --token-file` process on a free port: (process, target, log)."""
    config = write_spec(tiny_spec(run={"rounds": 0, "workers": 1}, inner={"steps": 3}), tmp_path / "run.toml")
    port, log_path, port_file = free_port(), tmp_path / "coordinator.log", tmp_path / "port.json"
    env = {k: v for k, v in worker_env().items() if k != "RCSWARM_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir", str(tmp_path / "state"),
         "--port", str(port), "--port-file", str(port_file), "--token-file", str(token_file)],
        env=env, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT,
    )
    wait_for(lambda: port_file.exists() or proc.poll() is not None, 60, "the coordinator to serve")
    assert proc.poll() is None, log_path.read_text()
    return proc, f"127.0.0.1:{port}", log_path


def accepted(client: CoordinatorClient) -> bool:
    """Whether a GetStatus with the client's join token is answered (False when refused UNAUTHENTICATED)."""
    try:
        client.status()
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNAUTHENTICATED:
            raise
        return False
    return True


@pytest.mark.slow
def test_the_join_token_rotates_while_a_worker_keeps_training(tmp_path: Path, spawn_worker: Any) -> None:
    old, new = "rotate-old-token-1", "rotate-new-token-22"
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# accepted join tokens\n{old}\n")
    proc, target, log_path = coordinator_with_token_file(tmp_path, token_file)
    old_client = CoordinatorClient(target, old, retry=RetryPolicy(max_elapsed_s=10.0))
    new_client = CoordinatorClient(target, new, retry=RetryPolicy(max_elapsed_s=10.0))
    try:
        worker = spawn_worker(target, "rotated", "--token", old)
        wait_for(lambda: old_client.status().version >= 2, 90, "two rounds with the old token", interval=0.1)
        token_file.write_text(f"{new}\n")
        # The file is looked at (at most once a second) by the next call that needs a join token.
        wait_for(lambda: accepted(new_client), 10, "the new token to be accepted")
        assert "join tokens reloaded: 1 tokens" in log_path.read_text()
        joined_before = Path(worker.log_path).read_text().count(" joined ")
        assert refused(lambda: old_client.join("late-old", "cpu", 1)).code() == grpc.StatusCode.UNAUTHENTICATED
        late = new_client.join("late-new", "cpu", 1)
        new_client.leave(late, "only checking the new token")
        rotated_at = new_client.status().version
        wait_for(lambda: new_client.status().version >= rotated_at + 3, 60, "three more rounds after the rotation", interval=0.1)
        # A bad reload keeps the tokens accepted before and says so.
        token_file.write_text("# nothing here yet\n")
        wait_for(lambda: accepted(new_client) and "join tokens not reloaded" in log_path.read_text(), 10, "the refused reload")
        assert new_client.status().version >= rotated_at + 3
        version = new_client.status().version
        wait_for(lambda: new_client.status().version >= version + 2, 60, "rounds after the bad reload", interval=0.1)
        # SIGHUP reloads at once, without waiting for a call that needs a token.
        token_file.write_text(f"{new}\nrotate-third-token-333\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "join tokens reloaded: 2 tokens" in log_path.read_text(), 10, "the reload on SIGHUP")
        assert worker.poll() is None, logs_of([worker])
        status = new_client.status()
        active = [w for w in status.workers if w.state == pb.WORKER_STATE_ACTIVE]
        assert [w.name for w in active] == ["rotated"] and len(status.workers) == 2, status.workers
        assert Path(worker.log_path).read_text().count(" joined ") == joined_before == 1, logs_of([worker])
        log = log_path.read_text()
        assert "holds no join token" in log and not any(t in log for t in (old, new, "rotate-third-token-333"))
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, logs_of([worker])
    finally:
        old_client.close()
        new_client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
