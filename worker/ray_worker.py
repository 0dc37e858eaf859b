"""One rcswarm worker inside a Ray actor (`rcswarm launch ray`, issue #16).

`RayWorker` is a plain class; the launcher (launch/actors.py) makes it a detached, named Ray actor
with `num_gpus`/`num_cpus` and `max_restarts=-1`. Its constructor builds the ordinary `Worker`
from the `WorkerOptions` of its `RayWorkerConfig` and runs its loop on a thread, so the actor
answers `info()` and `stop()` while it trains. Ray sets `CUDA_VISIBLE_DEVICES` to the actor's own
GPUs, so `--device auto` finds its GPU as `cuda:0`.

The join token is read here, from the environment of the Ray node (`RCSWARM_TOKEN`, a Kubernetes
Secret on KubeRay), never passed as an argument: actor arguments and a job's runtime_env are
recorded by Ray's GCS and shown by its dashboard.

A restarted actor (its process died; Ray runs the constructor again) is a new process: it joins as a
new worker. Each actor keeps a membership file on its node (`worker/membership.py`, in a private
directory per user, named by coordinator and actor, `membership_file`), so a successor started on the same node ends
the dead process's membership at once instead of the open round waiting out its lease; one started on
another node finds no file, and the coordinator evicts the dead membership when its lease runs out.
A run that finishes, a refused token or a spec this node cannot build end the loop; the actor then stays alive and reports the outcome (`state`, `exit_code`) instead of exiting, so Ray does not
restart it into the same refusal. The other ends are started again in the same actor after `retry_delay_s` (30 s,
doubling to 10 minutes), its state "starting" meanwhile with the reason; `start_again_reason` decides from the kind of
end the worker reports (`Worker.end`): a worker that gave up on a coordinator silent or unreachable past its patience
for as long as it takes, one whose loop ended in an error a new start might not meet again (a gRPC status other than a
refusal, training that kept diverging, an exception out of its loop) at most MAX_ERROR_RETRIES times, then "failed"
for good. Before, each stayed "failed", holding its resources, though the coordinator came back or the error was
passing (review of the Ray launcher, 2026-11-29). `info()` counts these starts (`retries`: Ray's restarts do not) and
says why the last one came (`last_retry`).

Threads: the worker loop runs on its own thread ("rcswarm-worker"); `info` and `stop` run on Ray's
task threads (the actor is created with `max_concurrency` > 1). `_lock` guards `_state`, `_exit_code`, `_problem`,
`retries` and `_last_retry`; `errors` and `_stop` are the loop thread's (`stop` sets the event it finds); the worker's
own fields are read without it (a snapshot for status).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rcswarm.protos.wire import TOKEN_ENV, one_token
from rcswarm.worker.log_lines import log_to_stderr
from rcswarm.worker.options import WorkerOptions

if TYPE_CHECKING:  # worker/worker.py loads torch and grpc: imported inside the functions that use it, so that the
    from rcswarm.worker.worker import End  # launcher's plan (launch/plan.py imports this module) loads neither

log = logging.getLogger("rcswarm.worker.ray")

# The states `info()` reports: the worker loop's, not Ray's (the launcher adds Ray's actor state).
STARTING, TRAINING, FINISHED, STOPPED, FAILED = "starting", "training", "finished", "stopped", "failed"
# Seconds before the first start again of a worker (`start_again_reason`), doubling up to the most.
FIRST_RETRY_S, MOST_RETRY_S = 30.0, 600.0
# How many times a worker whose loop ended in error (`End.ERROR`) is started again in its actor before it is FAILED.
MAX_ERROR_RETRIES = 5


def retry_delay_s(retries: int) -> float:
    """Seconds before start `retries` (1, 2, ...) again of a worker: FIRST_RETRY_S doubling to MOST_RETRY_S."""
    return min(FIRST_RETRY_S * 2 ** min(retries - 1, 32), MOST_RETRY_S)


def start_again_reason(end: End, reason: str, errors: int) -> str | None:
    """Why a worker whose loop ended as `end` (`reason`: its words, `Worker.exit_reason`) is started again in its
    actor, or None: it ended for good (pure). `errors`: its starts again after an error so far.

    A coordinator silent past the patience may come back (GAVE_UP): started again for as long as it takes; an error a
    new start might not meet again (ERROR) at most MAX_ERROR_RETRIES times; a finished run, a stop, and a refusal a
    new start would meet again (REFUSED: the join token, a run spec this node cannot train) never."""
    from rcswarm.worker.worker import End

    if end is End.GAVE_UP:
        return reason
    if end is End.ERROR and errors < MAX_ERROR_RETRIES:
        return f"{reason} (error {errors + 1} of at most {MAX_ERROR_RETRIES} started again)"
    return None


@dataclass(frozen=True)
class RayWorkerConfig:
    """What one worker actor needs: the worker's options (no token: they travel through Ray as the actor's
    argument) and the Ray resources the actor was made with, kept so that the launcher sees an actor of
    another shape than its plan's (and replaces it)."""

    worker: WorkerOptions
    num_gpus: float = 0.0
    num_cpus: float = 1.0

    def __post_init__(self) -> None:
        if self.worker.threads < 1:
            raise ValueError(f"threads {self.worker.threads}: expected >= 1")

    @property
    def name(self) -> str:
        return self.worker.name

    @classmethod
    def from_dict(cls, fields: dict) -> RayWorkerConfig:
        """The config of `dataclasses.asdict(config)`, as it arrives through Ray, validated again."""
        return cls(**{**fields, "worker": WorkerOptions.from_dict(fields["worker"])})


def membership_file(options: WorkerOptions) -> Path:
    """Where the actor `options.name` keeps its membership on this node: a file named by its coordinator's digest and
    its name in one directory of mode 0700 per user under the temporary directory (the file holds the worker secret;
    another coordinator's actor of the same name never reads it). One directory for every coordinator, so a finished
    run leaves no directory of its own behind (the worker removes its file as it leaves)."""
    directory = Path(tempfile.gettempdir()) / f"rcswarm-ray-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    coordinator = hashlib.sha256(options.coordinator.encode()).hexdigest()[:16]
    return directory / f"{coordinator}-{options.name}.membership.json"


class RayWorker:
    """A worker training on its own thread inside a Ray actor; `info()` for status, `stop()` to Leave."""

    def __init__(self, config: dict) -> None:
        log_to_stderr("worker")
        self.config = RayWorkerConfig.from_dict(config)
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._state, self._exit_code, self._problem = STARTING, None, ""
        # `_stop` is the current worker's own stop event, which it also sets as it leaves (a new one per start);
        # `stop()` alone sets `_stop_requested`.
        self._stop = threading.Event()
        self._stop_requested = threading.Event()
        self.worker = None
        self.retries = 0  # starts again inside this actor (`start_again_reason`)
        self._last_retry = ""  # why the last one came
        self.errors = 0  # of which after an error (End.ERROR), at most MAX_ERROR_RETRIES
        self._thread = threading.Thread(target=self._run, name="rcswarm-worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """The worker loop's thread: start the worker, and again for as long as `_run_once` says why
        (`_start_again`). Whatever escapes them ends the actor FAILED (status 1) with its words: before, a thread that
        died left it "starting" with no problem for ever (review of the Ray launcher, 2026-11-29)."""
        try:
            while (reason := self._run_once()) is not None and self._start_again(reason):
                pass
        except BaseException as exc:  # noqa: BLE001 - the actor must say why its worker thread ended
            log.exception("%s: the worker thread ended", self.config.name)
            self._finish(FAILED, 1, f"{type(exc).__name__}: {exc}")

    def _start_again(self, reason: str) -> bool:
        """After a start that ended for `reason` (`start_again_reason`): wait `retry_delay_s` (state STARTING, the
        reason in `problem`); False when a stop came meanwhile (then STOPPED)."""
        with self._lock:
            self.retries += 1
            retries, self._last_retry = self.retries, reason
            delay = retry_delay_s(retries)
            self._state, self._exit_code = STARTING, None
            self._problem = f"{reason}; starting again in {delay:g}s (retry {retries})"
        log.warning("%s: %s; starting again in %gs", self.config.name, reason, delay)
        if self._stop_requested.wait(delay):
            self._finish(STOPPED, None, "")
            return False
        self._stop = threading.Event()
        if self._stop_requested.is_set():  # a stop between the wait and the new event
            self._stop.set()
        return True

    def _run_once(self) -> str | None:
        """Build and run one worker; why it is started again (`_ended`), else None with the outcome recorded. A
        worker this node cannot build (no token, a device it does not have, torch or an rcswarm it cannot import, ...)
        is not started again."""
        try:
            import torch

            from rcswarm.worker.worker import End, Worker
        except BaseException as exc:  # noqa: BLE001 - a node without torch, or with a mismatched install
            log.exception("%s cannot import the worker", self.config.name)
            self._finish(FAILED, 1, f"{type(exc).__name__}: {exc}")
            return None
        try:
            token = one_token(os.environ[TOKEN_ENV], f"${TOKEN_ENV}") if os.environ.get(TOKEN_ENV) else ""
            if not token:
                raise ValueError(f"no join token on this Ray node: set ${TOKEN_ENV} in the environment of "
                                 f"`ray start` (a Kubernetes Secret on KubeRay); it is never passed through Ray")
            torch.set_num_threads(self.config.worker.threads)
            options = self.config.worker
            if options.membership_file is None:
                options = replace(options, membership_file=membership_file(options))
            self.worker = Worker(options, token, stop=self._stop)
        except ValueError as exc:
            log.error("%s cannot start: %s", self.config.name, exc)
            self._finish(FAILED, 2, str(exc))
            return None
        except BaseException as exc:  # noqa: BLE001 - the actor stays alive and says why (Ray restarts no live actor)
            log.exception("%s cannot start", self.config.name)
            self._finish(FAILED, 1, f"{type(exc).__name__}: {exc}")
            return None
        self._finish(TRAINING, None, "")  # a start again no longer shows the reason it waited for
        try:
            code = self.worker.run()
        except Exception as exc:
            log.exception("%s: the worker loop raised", self.config.name)
            return self._ended(End.ERROR, 1, f"{type(exc).__name__}: {exc} (see this actor's log)")
        if self._stop_requested.is_set() and not self.worker.finished:
            self._finish(STOPPED, code, "")
            return None
        if code == 0:
            self._finish(FINISHED, code, "")
            return None
        # A loop that ended in error without saying how (none of Worker.run's own ends) counts as an error.
        return self._ended(self.worker.end or End.ERROR, code, self.worker.exit_reason or (
            f"the worker loop ended with exit status {code} (see this actor's log)"))

    def _ended(self, end: End, code: int, problem: str) -> str | None:
        """A start whose loop ended as `end` with exit status `code`: why it is started again (`start_again_reason`),
        or None with FAILED and `problem` recorded (a refusal, too many errors, or a stop came meanwhile)."""
        from rcswarm.worker.worker import End

        reason = None if self._stop_requested.is_set() else start_again_reason(end, problem, self.errors)
        if reason is None:
            self._finish(FAILED, code, problem)
        elif end is End.ERROR:
            self.errors += 1
        return reason

    def _finish(self, state: str, code: int | None, problem: str) -> None:
        with self._lock:
            self._state, self._exit_code, self._problem = state, code, problem

    def outcome(self) -> tuple[str, int | None, str]:
        """(state, exit code once the loop ended, the problem that ended it, if any)."""
        with self._lock:
            return self._state, self._exit_code, self._problem

    def info(self) -> dict:
        """What this actor is doing: its worker's membership, device, step and outcome (JSON-able)."""
        import ray

        context = ray.get_runtime_context()
        state, code, problem = self.outcome()
        with self._lock:
            retries, last_retry = self.retries, self._last_retry
        worker = self.worker
        return {
            "name": self.config.name,
            "state": state,
            "exit_code": code,
            "problem": problem,
            "worker_id": worker.worker_id if worker is not None else "",
            "step": worker.step if worker is not None else 0,
            "device": str(worker.device) if worker is not None else self.config.worker.device,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node_id": context.get_node_id(),
            "reconstructed": context.was_current_actor_reconstructed,
            "started_at": self.started_at,
            "retries": retries,
            "last_retry": last_retry,
            "config": asdict(self.config),
        }

    def stop(self, timeout_s: float = 30.0) -> dict:
        """Stop training: the worker finishes its step, reports its metrics and Leaves; then `info()`, with the state
        it was in before (`was`: a worker that had failed or never joined has no membership to leave)."""
        was, _, _ = self.outcome()
        self._stop_requested.set()
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        report = self.info()
        report["left"] = not self._thread.is_alive()
        report["was"] = was
        return report
