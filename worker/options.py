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

from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
        if self.threads < 0:
            raise ValueError(f"--threads {self.threads}: expected >= 0 (0 = the worker's share of the cores)")
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
            if not value > 0:
                raise ValueError(f"{flag} {value}: expected a number of seconds > 0")

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> WorkerOptions:
        """The options of `dataclasses.asdict(options)` (how they travel through Ray), validated again."""
        paths = {"tls_ca", "tls_cert", "tls_key", "membership_file", "state_dir", "data_root"}
        return cls(**{k: Path(v) if k in paths and v is not None else v for k, v in fields.items()})
