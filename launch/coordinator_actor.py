"""`rcswarm coordinator` on the Ray head (`rcswarm launch ray --with-coordinator`): `CoordinatorActor`.

A detached actor pinned to the head node runs the coordinator as its child process, which gets
SIGTERM when the actor's process dies, so a restarted actor never runs beside an old coordinator
on the same state dir; the coordinator resumes from its state dir. A coordinator that ends on its own
(a crash, the kernel's out-of-memory killer) ends the actor's process too, so that Ray restarts the actor
(`max_restarts=-1`) and with it the coordinator, from its state dir, on the same port (give
`--coordinator-port` a fixed one, the default, for workers to find it again). It dies with the head.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rcswarm.launch.actors import CALL_TIMEOUT_S, STOP_TIMEOUT_S, call, gcs_record
from rcswarm.launch.plan import COORDINATOR

COORDINATOR_START_S = 120.0


def _pdeathsig() -> None:
    """In the coordinator's child process: get SIGTERM when the actor process dies (Linux prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class CoordinatorActor:
    """`rcswarm coordinator` as the child process of a detached actor pinned to the head node.

    The child gets SIGTERM when the actor's process dies, so a restarted actor never runs beside
    an old coordinator on the same state dir; the coordinator resumes from its state dir. The token
    comes from the head node's environment, like the workers'.
    """

    def __init__(self, config_text: str, state_dir: str, host: str, port: int, extra_args: list[str]) -> None:
        import ray

        self.folder = Path(tempfile.mkdtemp(prefix="rcswarm-coordinator-"))
        config = self.folder / "run.toml"
        config.write_text(config_text)
        port_file = self.folder / "port.json"
        self.log_path = self.folder / "coordinator.log"
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir", state_dir,
                 "--host", host, "--port", str(port), "--port-file", str(port_file), *extra_args],
                stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=_pdeathsig if sys.platform == "linux" else None,
            )
        deadline = time.monotonic() + COORDINATOR_START_S
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the coordinator did not start (exit {self.process.poll()}):\n{self.log_tail()}")
            time.sleep(0.2)
        self.port = json.loads(port_file.read_text())["port"]
        self.host = host if host not in ("0.0.0.0", "::") else ray.util.get_node_ip_address()
        self._stopping = threading.Event()
        threading.Thread(target=self._watch, name="coordinator-watch", daemon=True).start()

    def _watch(self) -> None:
        """End the actor's process when the coordinator ends unasked: Ray restarts a dead actor, not a live one
        whose child died."""
        code = self.process.wait()
        if not self._stopping.is_set():
            print(f"rcswarm: the coordinator (pid {self.process.pid}) exited with status {code}: ending this actor "
                  f"for Ray to restart it; its log ends:\n{self.log_tail()}", file=sys.stderr, flush=True)
            os._exit(1)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def info(self) -> dict:
        return {"address": f"{self.host}:{self.port}", "pid": self.process.pid, "exit_code": self.process.poll()}

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict:
        self._stopping.set()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.info()


def start_coordinator(namespace: str, config_text: str, state_dir: str, host: str, port: int, extra_args: list[str],
                      cpus: float) -> str:
    """Find or create the coordinator actor on the head node; its HOST:PORT for the workers."""
    import ray

    handle = ray.remote(CoordinatorActor).options(
        name=COORDINATOR, namespace=namespace, lifetime="detached", get_if_exists=True, max_restarts=-1,
        num_cpus=cpus, resources={"node:__internal_head__": 0.001}, max_concurrency=2,
    ).remote(config_text, state_dir, host, port, extra_args)
    info = call(handle, "info", timeout_s=COORDINATOR_START_S + CALL_TIMEOUT_S)
    if info is None:
        cause = str(gcs_record(handle).get("DeathCause", "")).strip()[-2000:]
        raise RuntimeError(f"the coordinator actor did not start: {cause or 'no answer'}")
    return info["address"]
