"""A worker's membership file (`rcswarm worker --membership-file PATH`): what lets the process a supervisor starts
after this one was killed end the killed process's membership at once, and be ready to train when it joins.

A round waits for every active member that pulled its version. A SIGKILLed worker cannot send Leave, so without
this the swarm waits for its lease to expire (`coordinator.lease_s`) or the round's deadline, every time. With the
flag, the worker writes this file at each join (a temporary file, mode 0600, renamed over it) and removes it when it
leaves. Its successor, finding the file:

1. sends Leave for that membership ("restarted", one attempt within the unary deadline) before it imports torch, so
   the open round stops waiting for the killed process a fraction of a second after the successor starts;
2. builds the model and loads the data of the run spec the file holds before it joins, so that once it is a member
   (one the open round waits for) only the pull is left.

One process at a time per file: `rcswarm worker` holds a lock beside it (`<file>.lock`, cli/worker.py) for its life,
taken before step 1, so a second worker given the same file is refused instead of ending the first's live
membership. A process removes the file only while it records the membership this process wrote there last
(`remove_membership`), never one another process recorded since.

The file holds the coordinator's address, the run id, the worker id, its worker secret (hex) and the run spec JSON.
The secret is on disk only there: give the file a private directory (an `emptyDir` volume of the pod, which outlives
a container's restart). Without the flag the secret stays in memory only.

Import-light (grpc and the wire's stubs; no torch): the command sends the Leave before anything heavy is imported.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rcswarm.protos.transport import ClientTLS, open_channel
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS

log = logging.getLogger("rcswarm.worker")
FIELDS = ("coordinator", "run_id", "worker_id", "worker_secret", "run_spec_json")
# The (coordinator, worker id) of the membership this process last wrote to each membership file (`write_membership`),
# which `remove_membership` removes; nothing else.
_WRITTEN: dict[Path, tuple[str, str]] = {}


@dataclass(frozen=True)
class Membership:
    """One membership as its file records it (the secret stays out of the repr)."""

    coordinator: str
    run_id: str
    worker_id: str
    worker_secret: bytes = field(repr=False)
    run_spec_json: str = field(repr=False)


def read_membership(path: Path) -> Membership | None:
    """The membership `path` records; None when there is no file, or (one WARNING line) it is unreadable."""
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict) or any(not isinstance(raw.get(key), str) for key in FIELDS):
            raise ValueError(f"expected a JSON object with the strings {', '.join(FIELDS)}")
        return Membership(raw["coordinator"], raw["run_id"], raw["worker_id"], bytes.fromhex(raw["worker_secret"]),
                          raw["run_spec_json"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("--membership-file %s: ignored (%s)", path, exc)
        return None


def membership_file_problem(path: Path) -> str | None:
    """Why `path` cannot be this worker's membership file (it is written over and removed at the end): a
    directory, or a file that is not a membership a worker wrote (someone's config given by mistake); None when it
    does not exist or is one."""
    if path.is_dir():
        return f"--membership-file {path}: is a directory; expected a file path"
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        raw = None
    if not isinstance(raw, dict) or not set(FIELDS) <= set(raw):
        return (f"--membership-file {path}: exists and is not a membership file (a JSON object with "
                f"{', '.join(FIELDS)}): refusing to write over it and remove it; give another path")
    return None


def write_membership(path: Path, membership: Membership) -> None:
    """Record `membership` at `path`: a temporary file of mode 0600 beside it, renamed over it."""
    text = json.dumps({"coordinator": membership.coordinator, "run_id": membership.run_id,
                       "worker_id": membership.worker_id, "worker_secret": membership.worker_secret.hex(),
                       "run_spec_json": membership.run_spec_json})
    partial = path.with_name(f".{path.name}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(partial, path)
    _WRITTEN[Path(path)] = (membership.coordinator, membership.worker_id)


def _recorded(path: Path) -> tuple[str, str] | None:
    """The (coordinator, worker id) the file at `path` records; None when there is none or it cannot be read as one."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    return raw.get("coordinator"), raw.get("worker_id")


def remove_membership(path: Path) -> None:
    """Remove the file at `path` (a leave, a refused run, a stale file after a failed write) while it records the
    membership this process wrote there last; one INFO line and the file kept when it records another (a second
    worker given the same file without the lock of cli/worker.py: removing it would keep that worker's successor
    from ending its membership). OSError when it cannot be removed."""
    recorded, written = _recorded(path), _WRITTEN.get(Path(path))
    if recorded is not None and recorded != written:
        log.info("--membership-file %s: kept: it records membership %s, not this process's %s", path, recorded[1],
                 written[1] if written is not None else "(none written)")
        return
    path.unlink(missing_ok=True)
    _WRITTEN.pop(Path(path), None)


def end_membership(membership: Membership, coordinator: str, tls: ClientTLS | None, timeout_s: float) -> str:
    """Send Leave for a previous process's membership (one attempt); what happened, for the log. Nothing is sent when
    the file names another coordinator."""
    if membership.coordinator != coordinator:
        return f"its membership {membership.worker_id} was at {membership.coordinator}, not {coordinator}: not ended"
    channel = open_channel(coordinator, tls, list(MESSAGE_SIZE_OPTIONS))
    try:
        request = pb.LeaveRequest(worker_id=membership.worker_id, worker_secret=membership.worker_secret,
                                  reason="restarted: ended by the process that replaced it")
        pb_grpc.CoordinatorStub(channel).Leave(request, timeout=timeout_s)
        return f"ended its previous membership {membership.worker_id} of {membership.run_id}"
    except grpc.RpcError as err:
        return f"its previous membership {membership.worker_id} was not ended: {err.code().name}: {err.details()}"
    finally:
        channel.close()


def end_previous(path: Path, coordinator: str, tls: ClientTLS | None, timeout_s: float) -> Membership | None:
    """Read the membership file, end what it records (one INFO line) and remove it; the membership, or None."""
    membership = read_membership(path)
    if membership is not None:
        log.info("--membership-file %s: %s", path, end_membership(membership, coordinator, tls, timeout_s))
        path.unlink(missing_ok=True)
    return membership
