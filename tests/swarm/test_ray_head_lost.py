"""A following `rcswarm launch ray` whose Ray head dies, on a real Ray head of its own, bound to loopback only.

The head is a `ray start --head --node-ip-address 127.0.0.1` of this test (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, as
tests/swarm/test_ray.py, so that Ray binds no other address; its own temp dir and ports; token authentication off, the
test's processes being its only clients), the coordinator the in-process one of conftest (outside Ray, as in
production). The launcher follows two training workers; then every process of the head is SIGKILLed, as
`ray stop --force` does (that command would also stop any other Ray instance of this machine): the processes with the
head's temp dir on their command line or among their open files, but not the launcher's. Before, the launcher waited
inside Ray's call to the GCS until Ray ended it a minute later with its own "Failed to connect to GCS within 60
seconds" (status 1); now it ends within seconds with status 3 and one line. The processes of the head left at the end
are killed by pid. About 20 s (the default suite; on the old code it failed after 60 s).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rcswarm.launch import HEAD_LOST_STATUS
from rcswarm.protos.wire import TOKEN_ENV
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for

RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           TOKEN_ENV: TOKEN}


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            sockets.append(probe)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1:
        found.add(pid)
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return found


def head_processes(temp_dir: str, spare: set[int]) -> set[int]:
    """The processes of the Ray head whose temp dir is `temp_dir` (on their command line, or a file of it open: Ray's
    agents and log monitor name it only so), less this process, its ancestors and `spare`."""
    found, mine = set(), ancestors() | spare
    for folder in Path("/proc").glob("[0-9]*"):
        pid = int(folder.name)
        if pid in mine:
            continue
        try:
            hit = temp_dir.encode() in (folder / "cmdline").read_bytes() or any(
                os.readlink(fd).startswith(temp_dir + "/") for fd in (folder / "fd").iterdir())
        except OSError:
            continue
        if hit:
            found.add(pid)
    return found


def running(pid: int) -> bool:
    """Whether `pid` runs (a killed process stays in /proc, a zombie, until it is reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def ray_head():
    """A Ray head on loopback (2 CPUs, 2 fake GPUs), started by `ray start`; (its GCS address, its temp dir)."""
    if sys.platform != "linux":
        pytest.skip("finding the head's processes reads /proc")
    if importlib.util.find_spec("ray") is None:  # not imported here: test_ray.py's Ray must see RAY_ENV first
        pytest.skip("Ray is not installed (pip install -e '.[dev]')")
    ray_cli = Path(sys.executable).with_name("ray")
    temp_dir = tempfile.mkdtemp(prefix="rcsrhl-")  # short: Ray's socket paths live under it
    ports = free_ports(8)
    env = {**os.environ, **RAY_ENV}
    started = subprocess.run(
        [str(ray_cli), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(ports[0]),
         "--temp-dir", temp_dir, "--num-cpus", "2", "--num-gpus", "2", "--include-dashboard", "false",
         "--disable-usage-stats", "--node-manager-port", str(ports[1]), "--object-manager-port", str(ports[2]),
         "--ray-client-server-port", str(ports[3]), "--dashboard-agent-listen-port", str(ports[4]),
         "--dashboard-agent-grpc-port", str(ports[5]), "--runtime-env-agent-port", str(ports[6]),
         "--metrics-export-port", str(ports[7])],
        env=env, capture_output=True, text=True, timeout=120,
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield f"127.0.0.1:{ports[0]}", temp_dir
    finally:
        left = head_processes(temp_dir, set())
        kill(left)
        wait_for(lambda: not any(map(running, left)), 20, "the Ray head's processes to end")
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_a_follower_whose_ray_head_dies_ends_in_seconds_with_one_line(ray_head, start_coordinator):
    address, temp_dir = ray_head
    local = start_coordinator(tiny_spec(run={"rounds": 100000}, inner={"steps": 4}, sync={"codec": "fp32"}))
    argv = ["launch", "ray", "--address", address, "--namespace", "head-lost", "--coordinator", local.target,
            "--workers", "2", "--gpus-per-worker", "1", "--cpus-per-worker", "0.5", "--device", "cpu", "--poll-s", "1"]
    out_path, err_path = Path(temp_dir + "-out"), Path(temp_dir + "-err")
    with out_path.open("w") as out, err_path.open("w") as err:
        follower = subprocess.Popen([sys.executable, "-m", "rcswarm.cli.main", *argv], stdout=out, stderr=err,
                                    env={**os.environ, **RAY_ENV})
    try:
        wait_for(lambda: local.service.version >= 2 or follower.poll() is not None, 120, "two rounds of the Ray workers")
        assert follower.poll() is None, out_path.read_text() + err_path.read_text()

        killed = time.monotonic()
        kill(head_processes(temp_dir, {follower.pid}))  # `ray stop --force` on the head, for this head only
        try:
            status = follower.wait(timeout=90)
        except subprocess.TimeoutExpired:
            status = None
        took = time.monotonic() - killed
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(timeout=10)
    stdout, stderr = out_path.read_text(), err_path.read_text()
    out_path.unlink()
    err_path.unlink()
    assert status == HEAD_LOST_STATUS == 3, (status, took, stdout, stderr)
    assert took < 30, (took, stderr)  # the grace (10 s), a poll and a probe; Ray itself waits 60 s
    assert "Traceback" not in stdout + stderr and "Failed to connect to GCS" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if "rcswarm launch ray:" in line]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"rcswarm launch ray: the Ray head at {address} is unreachable (its GCS: "), lines
    assert f"the coordinator at {local.target} is outside Ray and keeps the run" in lines[0]
    assert lines[0].endswith("resume with: rcswarm " + " ".join(argv)), lines
    assert local.service.version >= 2  # the coordinator, outside Ray, still holds the run
