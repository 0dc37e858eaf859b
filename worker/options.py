"""The one declaration of a worker's options, validated once (`WorkerOptions`), and of a client's (`ClientOptions`).

`ClientOptions` is how any client reaches a coordinator (the `--coordinator` and `--tls-*` flags of
`rcswarm worker`, `rcswarm status` and `rcswarm launch ray`, cli/client_flags.py); `WorkerOptions` adds
what a worker process needs. The Ray actor's config (worker/ray_worker.py) and the launch plan
(launch/plan.py) compose a `WorkerOptions` and add only what is theirs.

Two rules:
- The join token is never a field of an options value. It travels beside one (`Worker(options, token)`,
  `CoordinatorClient(target, token)`), so an options value may go through Ray, a log or a repr as it is.
- A file is a `pathlib.Path` (None when not given) in every options value; text only at the edges (a
  command line, JSON). The files are read where they are used (a Ray node reads its own).

Import-light (no torch, no grpc at import): the launcher plans workers without them.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The most seconds a duration flag takes (--patience-s, --rpc-timeout-s, `rcswarm status --timeout`, `rcswarm dht
# --poll-s`, ...): 1e6 s, about 11.6 days. An infinite or huge one overflows a gRPC deadline (every call then fails
# DEADLINE_EXCEEDED at once) or a wait's timeout (OverflowError), or retries for ever.
MAX_SECONDS = 1e6
# The shortest a duration flag may be where a shorter one cannot work rather than tuning it (a review of the worker's
# command, 2026-11-29; as config/runspec.py's MIN_SECONDS for a run spec's keys), read by `seconds_problem`; a flag not
# named here takes any number of seconds > 0:
MIN_FLAG_SECONDS = {
    # one unary call's deadline: 0.0001 s failed every call DEADLINE_EXCEEDED before an answer could come, and the
    # worker gave up "without an answer from the coordinator", blaming it
    "--rpc-timeout-s": 0.1,
    # one parameter pull or push (and on the command line at least --rpc-timeout-s, `transfer_timeout_problem`):
    # 0.0001 s retried DEADLINE_EXCEEDED for 32.6 s pulling version 0
    "--transfer-timeout-s": 0.1,
}
# The most torch threads a worker takes: --threads at most this many, and at most THREADS_PER_CORE per core of the
# machine that checks it, though never fewer than FEW_THREADS (a launcher may plan for Ray nodes larger than itself).
# torch starting 100000 threads failed "can't start new thread", a traceback naming no flag.
MAX_THREADS = 1024
THREADS_PER_CORE = 4
FEW_THREADS = 64
# The --device values a worker trains on: auto, cpu, cuda, cpu:N or cuda:N (torch knows more types, e.g. mps or meta,
# on which rcswarm does not train).
DEVICE_FORM = re.compile(r"(cpu|cuda)(:(0|[1-9][0-9]*))?")


def seconds_problem(flag: str, value: float) -> str | None:
    """Why `value` is not a duration `flag` takes (pure): not a number of seconds > 0, infinite or NaN, more than
    MAX_SECONDS, or less than the flag's MIN_FLAG_SECONDS where it has one; None when it is one."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= MAX_SECONDS):
        return f"{flag} {value}: expected a finite number of seconds > 0 and at most {MAX_SECONDS:g}"
    least = MIN_FLAG_SECONDS.get(flag)
    if least is not None and value < least:
        return f"{flag} {value}: expected a number of seconds >= {least:g} and at most {MAX_SECONDS:g}"
    return None


def transfer_timeout_problem(transfer_s: float, rpc_s: float) -> str | None:
    """Why `--transfer-timeout-s TRANSFER_S` is too short beside `--rpc-timeout-s RPC_S` (pure): a pull or push, which
    carries the parameters, given less time than a unary call of a few bytes; None otherwise. The command line's check
    (cli/worker.py), where both are flags: an options value may pair them as it likes (a test's rpc deadline of
    MAX_SECONDS beside the default transfer deadline)."""
    if transfer_s >= rpc_s:
        return None
    return (f"--transfer-timeout-s {transfer_s}: expected at least --rpc-timeout-s {rpc_s} (a pull or push carries "
            "the parameters, a unary call a few bytes)")


def device_problem(name: str) -> str | None:
    """Why `--device NAME` is not a device a worker trains on, by its form alone (pure: no torch, so a launcher
    without CUDA checks it too); None for auto, cpu, cuda, cpu:N, cuda:N."""
    if name == "auto" or DEVICE_FORM.fullmatch(name):
        return None
    return f"--device {name!r}: expected auto, cpu, cuda or cuda:N"


def max_threads() -> int:
    """The most torch threads a worker takes on this machine: THREADS_PER_CORE per core (at least FEW_THREADS), at
    most MAX_THREADS."""
    return min(MAX_THREADS, max(FEW_THREADS, THREADS_PER_CORE * (os.cpu_count() or 1)))


def threads_problem(threads: int) -> str | None:
    """Why `--threads N` is not a number of torch threads (torch raises RuntimeError for too many, or "Overflow when
    unpacking long long" past 2**63, naming no flag); None for 0 (the worker's share of the cores) .. `max_threads`."""
    if 0 <= threads <= max_threads():
        return None
    return (f"--threads {threads}: expected 0..{max_threads()} (0 = the worker's share of the cores; at most "
            f"{THREADS_PER_CORE} per core or {FEW_THREADS}, at most {MAX_THREADS})")


@dataclass(frozen=True)
class ClientOptions:
    """Where a coordinator is (`coordinator`, HOST:PORT) and the TLS files to reach it with (none: plaintext)."""

    coordinator: str
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

    def __post_init__(self) -> None:
        from rcswarm.protos.transport import target_problem  # grpc, only once a client is made

        problem = target_problem(self.coordinator)
        if problem is not None:
            raise ValueError(problem)
        if ":" not in self.coordinator:
            raise ValueError(f"--coordinator {self.coordinator!r}: expected HOST:PORT")
        self.tls()

    def tls(self):
        """The `ClientTLS` of the TLS files (None for plaintext); ValueError for a client certificate without
        a CA or a certificate without its key. The files are read when a channel opens."""
        from rcswarm.protos.transport import ClientTLS  # grpc, only once a client is made

        return ClientTLS.from_flags(self.tls_ca, self.tls_cert, self.tls_key)


@dataclass(frozen=True)
class WorkerOptions(ClientOptions):
    """The options of one worker process (the `rcswarm worker` flags), validated: its coordinator and TLS files
    (`ClientOptions`), its device, name, torch threads (0: its share of the machine's cores), patience, the most
    model parameters it builds (0: what its device's memory holds, worker/limits.py), the file its membership is
    handed to its successor in (None: none, worker/membership.py) and the folder it reads git datasets from (None:
    none, worker/data_root.py)."""

    device: str = "auto"
    name: str = ""
    threads: int = 0
    patience_s: float = 300.0
    rpc_timeout_s: float = 10.0
    transfer_timeout_s: float = 300.0
    max_params: int = 0
    # The most positions (batch × seq_len) one step trains or evaluates; 0: DEFAULT_MAX_STEP_TOKENS (limits.py).
    max_step_tokens: int = 0
    membership_file: Path | None = None
    # Where the worker keeps its error-feedback residual across restarts (issue #28); None: in memory only.
    state_dir: Path | None = None
    # The folder a git dataset a run spec names must lie in (worker/data_root.py; a path where the worker runs, as
    # the TLS files are); None: the worker reads none.
    data_root: Path | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        problem = threads_problem(self.threads)
        if problem is not None:
            raise ValueError(problem)
        if self.max_params < 0:
            raise ValueError(f"--max-params {self.max_params}: expected >= 0 (0 = what the device's memory holds)")
        if self.max_step_tokens < 0:
            raise ValueError(f"--max-step-tokens {self.max_step_tokens}: expected >= 0 (0 = the default limit)")
        if self.membership_file is not None:
            from rcswarm.worker.membership import membership_file_problem  # grpc, only once a client is made

            problem = membership_file_problem(Path(self.membership_file))
            if problem is not None:
                raise ValueError(problem)
        if self.state_dir is not None and Path(self.state_dir).exists() and not Path(self.state_dir).is_dir():
            raise ValueError(f"--state-dir {self.state_dir}: is a file; expected a directory (created if missing)")
        for flag, value in (
            ("--patience-s", self.patience_s), ("--rpc-timeout-s", self.rpc_timeout_s),
            ("--transfer-timeout-s", self.transfer_timeout_s),
        ):
            problem = seconds_problem(flag, value)
            if problem is not None:
                raise ValueError(problem)

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> WorkerOptions:
        """The options of `dataclasses.asdict(options)` (how they travel through Ray), validated again."""
        paths = {"tls_ca", "tls_cert", "tls_key", "membership_file", "state_dir", "data_root"}
        return cls(**{k: Path(v) if k in paths and v is not None else v for k, v in fields.items()})
