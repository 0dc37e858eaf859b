"""`rcswarm coordinator` on the Ray head (`rcswarm launch ray --with-coordinator`): `CoordinatorActor`.

A detached actor pinned to the head node runs the coordinator as its child process, which gets
SIGTERM when the actor's process dies, so a restarted actor never runs beside an old coordinator
on the same state dir; the coordinator resumes from its state dir. A coordinator that ends on its own
(a crash, the kernel's out-of-memory killer) ends the actor's process too, so that Ray restarts the actor
(`max_restarts=-1`) and with it the coordinator, from its state dir, on the same port (give
`--coordinator-port` a fixed one, the default, for workers to find it again). It dies with the head.

What the actor runs is a `CoordinatorSpec` (checked before anything starts). The run spec it was sent,
the port file and the coordinator's log (appended at each start) live in `coordinator-actor/` of the state
dir, which outlives the actor: nothing is left in the head's temporary directory. A coordinator that
does not start leaves the actor alive, reporting the problem in `info()`; `start_coordinator` then removes
it and says why, as it removes one that does not answer in time (`unanswered_reason`). An existing coordinator actor
is reused only when it runs the same spec.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rcswarm.launch.actors import CALL_TIMEOUT_S, PENDING_STATES, STOP_TIMEOUT_S, call, gcs_record
from rcswarm.launch.plan import COORDINATOR, pending_reason, resource_problem

COORDINATOR_START_S = 120.0
FOLDER = "coordinator-actor"
LOG_TAIL_CHARS = 4000
# The flags of `rcswarm launch ray` that set each of `CoordinatorSpec.settings()`.
SETTING_FLAGS = {"config_sha256": "--config (the run spec)", "state_dir": "--state-dir", "host": "--coordinator-host",
                 "port": "--coordinator-port", "extra_args": "--coordinator-arg", "cpus": "--coordinator-cpus"}


@dataclass(frozen=True)
class CoordinatorSpec:
    """What the coordinator actor runs: the run spec's text, the state dir on the head node (absolute: the actor
    does not run in the launcher's directory), the address it binds, the extra `rcswarm coordinator`
    arguments, and the CPUs Ray reserves for it. No token: it is read from the head node's environment."""

    config_text: str
    state_dir: str
    host: str = "0.0.0.0"
    port: int = 50051
    extra_args: tuple[str, ...] = ()
    cpus: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if not Path(self.state_dir).is_absolute():
            raise ValueError(f"--state-dir {self.state_dir!r}: expected an absolute path on the head node (the "
                             "coordinator actor does not run in this directory)")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"--coordinator-port {self.port}: expected 0..65535")
        problem = resource_problem("--coordinator-cpus", self.cpus, positive=False)
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> CoordinatorSpec:
        """The spec of `dataclasses.asdict(spec)`, as the actor gets it through Ray, validated again."""
        return cls(**fields)

    def settings(self) -> dict[str, Any]:
        """What tells one coordinator actor from another (the run spec by its digest), JSON-able."""
        fields = {k: v for k, v in asdict(self).items() if k != "config_text"}
        return {"config_sha256": hashlib.sha256(self.config_text.encode()).hexdigest(), **fields,
                "extra_args": list(self.extra_args)}

    def argv(self, folder: Path) -> list[str]:
        """The `rcswarm coordinator` arguments, its run spec and port file in `folder`."""
        return ["--config", str(folder / "run.toml"), "--state-dir", self.state_dir, "--host", self.host,
                "--port", str(self.port), "--port-file", str(folder / "port.json"), *self.extra_args]


def settings_differ(running: dict[str, Any] | None, wanted: dict[str, Any]) -> str | None:
    """What differs between a running coordinator actor's settings and the wanted ones, naming the flags (pure);
    None when they are the same. `running` None: an actor that does not say (made by an older rcswarm)."""
    if running is None:
        return "it does not report its settings"
    changed = [f"{SETTING_FLAGS.get(k, k)} {running.get(k)!r} there, {wanted[k]!r} here"
               for k in wanted if running.get(k) != wanted[k]]
    return "; ".join(changed) or None


def _pdeathsig() -> None:
    """In the coordinator's child process: get SIGTERM when the actor process dies (Linux prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class CoordinatorActor:
    """`rcswarm coordinator` as the child process of a detached actor pinned to the head node.

    The child gets SIGTERM when the actor's process dies, so a restarted actor never runs beside
    an old coordinator on the same state dir; the coordinator resumes from its state dir. The token
    comes from the head node's environment, like the workers'. A coordinator that does not start leaves
    `problem` set (and no address) instead of raising: Ray's record of a failed constructor is a traceback.
    """

    def __init__(self, spec: dict) -> None:
        self.spec = CoordinatorSpec.from_dict(spec)
        self.folder = Path(self.spec.state_dir) / FOLDER
        self.log_path = self.folder / "coordinator.log"
        self.problem = ""
        self.port: int | None = None
        self._log_start = 0
        self.host = self.spec.host
        if self.host in ("0.0.0.0", "::"):
            import ray

            self.host = ray.util.get_node_ip_address()
        self._stopping = threading.Event()
        self.process: subprocess.Popen | None = None
        try:
            self.port = self._start()
        except (OSError, RuntimeError) as exc:
            self.problem = str(exc)
            return
        threading.Thread(target=self._watch, name="coordinator-watch", daemon=True).start()

    def _start(self) -> int:
        """Start the coordinator and wait for its port (RuntimeError with its log's end when it does not serve)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "run.toml").write_text(self.spec.config_text)
        port_file = self.folder / "port.json"
        port_file.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log_file:
            self._log_start = log_file.tell()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rcswarm.cli", "coordinator", *self.spec.argv(self.folder)],
                stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=_pdeathsig if sys.platform == "linux" else None,
            )
        deadline = time.monotonic() + COORDINATOR_START_S
        while not port_file.exists():
            code = self.process.poll()
            if code is not None or time.monotonic() > deadline:
                self.process.kill()
                self.process.wait(timeout=10)
                ended = f"exited with status {code}" if code is not None else f"did not serve within {COORDINATOR_START_S:g}s"
                raise RuntimeError(f"the coordinator {ended}; its log ({self.log_path}) ends:\n{self.log_tail()}")
            time.sleep(0.2)
        return json.loads(port_file.read_text())["port"]

    def _watch(self) -> None:
        """End the actor's process when the coordinator ends unasked: Ray restarts a dead actor, not a live one
        whose child died."""
        code = self.process.wait()
        if not self._stopping.is_set():
            print(f"rcswarm: the coordinator (pid {self.process.pid}) exited with status {code}: ending this actor "
                  f"for Ray to restart it; its log ends:\n{self.log_tail()}", file=sys.stderr, flush=True)
            os._exit(1)

    def log_tail(self) -> str:
        """The end of this start's part of the coordinator's log."""
        with open(self.log_path, "rb") as log_file:
            log_file.seek(max(self._log_start, log_file.seek(0, os.SEEK_END) - LOG_TAIL_CHARS))
            return log_file.read().decode(errors="replace").strip()

    def info(self) -> dict:
        process = self.process
        return {"address": f"{self.host}:{self.port}" if self.port is not None else None,
                "pid": process.pid if process is not None else None,
                "exit_code": process.poll() if process is not None else None,
                "problem": self.problem, "log": str(self.log_path), "settings": self.spec.settings()}

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict:
        self._stopping.set()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.info()


HEAD_RESOURCE = "node:__internal_head__"


def head_cpu_problem(cpus: float, nodes: list[dict[str, Any]]) -> str | None:
    """Why a coordinator actor of `cpus` CPUs can never start on the head node (pure; `nodes`: `ray.nodes()`), or
    None. Before, it stayed PENDING_CREATION until the launcher gave up after two minutes, and was left behind."""
    heads = [node["Resources"] for node in nodes if node.get("Alive") and HEAD_RESOURCE in node.get("Resources", {})]
    if not heads or cpus <= heads[0].get("CPU", 0.0):
        return None
    return (f"--coordinator-cpus {cpus:g}: the head node, where the coordinator actor runs, has "
            f"{heads[0].get('CPU', 0.0):g} CPUs; expected at most that")


def unanswered_reason(spec: CoordinatorSpec, record: dict[str, Any], nodes: list[dict[str, Any]],
                      available: dict[str, float]) -> str:
    """Why the coordinator actor of `spec` did not answer within COORDINATOR_START_S + CALL_TIMEOUT_S, in words (pure;
    `record`: its `gcs_record`, `nodes` and `available`: Ray's, for `pending_reason`): Ray never started it (naming
    --coordinator-cpus, which sets what it waits for), it died (Ray's cause), or it runs and does not answer."""
    state = record.get("State", "")
    if state in PENDING_STATES:
        waits = pending_reason({"CPU": spec.cpus, HEAD_RESOURCE: 0.001}, nodes, available, "--coordinator-cpus")
        return f"Ray never started it on the head node ({waits})"
    if state == "DEAD":
        return record.get("DeathCause", "") or "it died (Ray recorded no cause)"
    return f"it did not answer within {COORDINATOR_START_S + CALL_TIMEOUT_S:g}s (Ray state {state or 'unknown'})"


def start_coordinator(namespace: str, spec: CoordinatorSpec) -> str:
    """Find or create the coordinator actor on the head node; its HOST:PORT for the workers.

    RuntimeError when an existing one runs other settings (naming them: it is not replaced, since its
    workers train against it), when the head node cannot hold it (`head_cpu_problem`), or when the coordinator does
    not start. An actor that does not answer in time (never started, died, or alive but hung) is then removed, saying
    why (`unanswered_reason`), unless Ray is restarting it (its resume may outlast the wait): it did not tell its
    settings, and a detached actor left behind would come back to a corrected command through `get_if_exists`
    (before, an ALIVE one that did not answer was left in the namespace)."""
    import ray

    problem = head_cpu_problem(spec.cpus, ray.nodes())
    if problem is not None:
        raise RuntimeError(problem)
    handle = ray.remote(CoordinatorActor).options(
        name=COORDINATOR, namespace=namespace, lifetime="detached", get_if_exists=True, max_restarts=-1,
        num_cpus=spec.cpus, resources={"node:__internal_head__": 0.001}, max_concurrency=2,
    ).remote(asdict(spec))
    info = call(handle, "info", timeout_s=COORDINATOR_START_S + CALL_TIMEOUT_S)
    if info is None:
        record = gcs_record(handle)
        why = unanswered_reason(spec, record, ray.nodes(), ray.available_resources())
        if record.get("State") == "RESTARTING":  # Ray is bringing it back (a resumed coordinator takes its time)
            raise RuntimeError(f"the coordinator actor did not answer: {why}; Ray is restarting it, so it stays in "
                               f"namespace {namespace}: launch again once it serves (--status)")
        ray.kill(handle, no_restart=True)
        raise RuntimeError(f"the coordinator actor did not start: {why}; removed from namespace {namespace}, so that "
                           "a corrected command starts a new one")
    differ = settings_differ(info.get("settings"), spec.settings())
    if differ is not None:
        raise RuntimeError(f"a coordinator actor already runs in namespace {namespace} ({info.get('address')}) with "
                           f"other settings: {differ}. Stop it first (--stop), or use another --namespace")
    if info["problem"]:
        ray.kill(handle, no_restart=True)
        raise RuntimeError(f"the coordinator actor did not start: {info['problem']}")
    return info["address"]

