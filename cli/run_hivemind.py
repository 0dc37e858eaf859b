"""`rcswarm run` for `[sync] backend = "hivemind"`: a local hivemind swarm, with a coordinator only where needed.

Starts `rcswarm dht` on loopback (the bootstrap peer, mirroring the metric records into
RUN_DIR/state, so `rcswarm fit RUN_DIR/state` works) and N `rcswarm worker --backend hivemind`
processes that dial it, all listening and announcing on 127.0.0.1 only. A run whose curriculum
the coordinator decides (`curriculum.worker_seq_lens`, `curriculum.policy = "adaptive"`;
`needs_coordinator`) also gets a coordinator on loopback as its control plane (the workers join
it with `--coordinator`; it keeps RUN_DIR/state and serves the dashboard; the bootstrap peer then
mirrors nothing), still off the data path. It waits until every worker has trained run.rounds
versions (or the budget or a signal ends the run), then stops the workers, then the coordinator
and the bootstrap peer. Each worker writes RUN_DIR/peers/<name>/ (final.safetensors, summary.json
with its per-round history: loss, group size, skipped step, measured drift); the run directory
gets final.safetensors (worker-0's replica), summary.json (per peer: version, first and last
round loss; the largest difference between replicas; held-out loss before and after) and the logs.

A launch in a run directory an earlier one used resumes neither its replicas nor their state (a fresh swarm starts
from θ_0 of `run.seed`): the earlier launch's summary.json, final.safetensors, peers/ and state/ (the mirrored
metrics, or the coordinator's run where the curriculum needs one) are moved to RUN_DIR/earlier/<time they were
written>/ first (`set_aside_earlier_results`: into a folder of that name with `.partial` added, renamed once all are
in; said in one line), so the summary, `rcswarm status --state-dir RUN_DIR/state` and the curriculum are this launch's
alone and nothing of the earlier one is lost; logs/ is kept and appended to, and the earlier bootstrap peer's
maddrs.txt is removed before this one's starts. Before anything is moved or written, a run directory that cannot take
the launch is refused with one line, exit status 1 (`run_dir_problem`, `state_dir_held`): its state/ holds a
coordinator's run (a launch without `[sync] backend = "hivemind"`, as that launch refuses a hivemind launch's state/)
or is in use (its lock held: a bootstrap peer an earlier launch left running), or earlier/ holds a `.partial` folder
that a failed move left. run.toml is written once the first process started with it serves
(`Swarm.stage_config`), and a process that does not start ends the launch with one `rcswarm run:` message, exit 1.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from safetensors import SafetensorError
from safetensors.torch import load_file

from rcswarm.cli.run import (
    POLL_S,
    START_TIMEOUT_S,
    Outcome,
    SummarySignals,
    Swarm,
    held_out_losses,
    held_out_text,
    interrupted_outcome,
    number,
    skippable_evaluation,
    summary_status,
    write_summary,
)
from rcswarm.cli.signals import StopSignal
from rcswarm.config.runspec import RunSpec
from rcswarm.state.errors import StoreError
from rcswarm.state.lock import StateDirBusy, StateDirLock, holder_role, holder_text
from rcswarm.state.store import StateStore
from rcswarm.worker.data_root import data_root_args

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
PRINT_S = 10.0


def needs_coordinator(spec: RunSpec) -> str:
    """Why the run needs a coordinator (its curriculum is decided there), or "" when the swarm trains alone."""
    curriculum = spec.curriculum
    if curriculum.worker_seq_lens:
        return f"curriculum.worker_seq_lens = {curriculum.worker_seq_lens} is assigned per worker"
    if curriculum.adaptive:
        return f"the adaptive curriculum over {curriculum.seq_lens} climbs as the workers report rounds"
    return ""


class HivemindSwarm(Swarm):
    """The bootstrap peer, the coordinator where the curriculum needs one, and the workers; `stop` ends the
    workers first (they Leave), then the coordinator and the bootstrap peer."""

    bootstrap: subprocess.Popen | None = None

    def services(self) -> list[subprocess.Popen]:
        return [p for p in (self.coordinator, self.bootstrap) if p is not None]

    @property
    def maddrs_file(self) -> Path:
        """Where the bootstrap peer writes its multiaddrs, one per line."""
        return self.run_dir / "maddrs.txt"

    def start_bootstrap(self, mirror: bool) -> list[str]:
        """Start `rcswarm dht` (mirroring the metrics into RUN_DIR/state with `mirror`: its config staged, and run.toml
        once it serves, `Swarm.stage_config`); its multiaddrs. RuntimeError (`Swarm.start_failure`) when it exits
        or does not write them within START_TIMEOUT_S."""
        maddrs = self.maddrs_file
        maddrs.unlink(missing_ok=True)  # an earlier launch's, naming a peer that no longer exists
        state = ["--config", str(self.stage_config()), "--state-dir", str(self.run_dir / "state")] if mirror else []
        self.bootstrap = self._spawn(
            ["-m", "rcswarm.cli", "dht", "--host-maddrs", LOOPBACK, "--maddrs-file", str(maddrs), *state], "dht.log",
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if maddrs.is_file() and maddrs.read_text().split():
                if mirror:
                    self.adopt_config()
                return maddrs.read_text().split()
            if self.bootstrap.poll() is not None:
                break
            time.sleep(0.1)
        raise self.start_failure("the bootstrap peer", self.bootstrap, "dht.log")

    def start_peers(self, maddrs: list[str], coordinator: str = "") -> None:
        """The workers, dialing `maddrs`; joining `coordinator` (HOST:PORT) for the control plane when given."""
        threads = max(1, (os.cpu_count() or 1) // self.n_workers)
        control = ["--coordinator", coordinator] if coordinator else []
        for rank in range(self.n_workers):
            self.workers.append(self._spawn(
                ["-m", "rcswarm.cli", "worker", "--backend", "hivemind", "--config", str(self.run_dir / "run.toml"),
                 *control, "--initial-peers", *maddrs, "--host-maddrs", LOOPBACK, "--name", f"worker-{rank}",
                 "--threads", str(threads), "--out", str(self.run_dir / "peers" / f"worker-{rank}"),
                 *data_root_args(self.spec), *self.limit_args],
                f"worker-{rank}.log",
            ))


def wait(swarm: HivemindSwarm, console: Console, stop: threading.Event, deadline: float) -> bool:
    """Until every worker exited, a stop, or the deadline; True when the deadline ended it."""
    printed = time.monotonic()
    while not stop.wait(POLL_S):
        now = time.monotonic()
        if now >= deadline:
            return True
        running = swarm.workers_running()
        if running == 0:
            return False
        if now - printed >= PRINT_S:
            console.print(f"{running} of {swarm.n_workers} workers training")
            printed = now
    return False


# What a launch leaves in its run directory as its results, which the next launch there would replace or mix with its
# own (`set_aside_earlier_results`): a hivemind launch resumes neither the replicas nor the state.
RESULT_NAMES = ("summary.json", "final.safetensors", "peers", "state")
EARLIER = "earlier"
# The suffix of the folder the results are moved into before it takes its name (`move_into`).
PARTIAL = ".partial"


class SetAsideFailed(Exception):
    """The earlier results were not all moved aside; the message says which moved where and which stayed."""


def run_dir_problem(run_dir: Path) -> str | None:
    """Why `run_dir` cannot take a hivemind launch, before anything in it is moved or written: its state/ holds a
    coordinator's run (`coordinator_run_problem`) or earlier/ a folder a failed move left (`partial_problem`); None
    when it can."""
    return coordinator_run_problem(run_dir / "state") or partial_problem(run_dir)


def coordinator_run_problem(state_dir: Path) -> str | None:
    """Why `state_dir` is not a hivemind launch's to move aside: it holds a coordinator's run (its spec's
    sync.backend is not "hivemind": a launch without it, or `rcswarm coordinator`), which a hivemind launch neither
    resumes nor may set aside, as that launch refuses a hivemind launch's state dir; or its state.sqlite cannot be
    read. None without a state.sqlite, or for a hivemind launch's (its mirror's, or its coordinator's where the
    curriculum needs one). Read-only: nothing in it changes."""
    if not (state_dir / "state.sqlite").is_file():
        return None
    try:
        store = StateStore.open_read_only(state_dir)
        try:
            stored, run_id = store.get("spec_json"), store.get("run_id")
        finally:
            store.close()
    except (OSError, StoreError) as exc:
        return f"its state dir {state_dir} cannot be read ({exc}); move it away, or give this launch another --run-dir"
    if stored is None:
        return None
    try:
        backend = RunSpec.from_json(stored).sync.backend
    except ValueError as exc:
        return (f"its state dir {state_dir} holds a run spec that cannot be read ({exc}); move it away, or give this "
                "launch another --run-dir")
    if backend == "hivemind":
        return None
    return (f"its state dir {state_dir} holds a coordinator's run {run_id!r} (sync.backend = {backend!r}), which a "
            "hivemind launch does not resume; give the hivemind launch a --run-dir of its own")


def partial_problem(run_dir: Path) -> str | None:
    """Why `run_dir` cannot take a launch while RUN_DIR/earlier holds a folder a failed move left (`move_into`: its
    name ends in PARTIAL), which holds part of an earlier launch's results and the run dir maybe the rest; None
    when it holds none."""
    earlier = run_dir / EARLIER
    left = sorted(path for path in earlier.glob(f"*{PARTIAL}") if path.is_dir()) if earlier.is_dir() else []
    if not left:
        return None
    held = ", ".join(sorted(path.name for path in left[0].iterdir())) or "nothing"
    return (f"{left[0]} holds part of an earlier launch's results ({held}) that a failed move left there; move what "
            f"it holds back into the run directory (or the rest of the results into {left[0].name} and rename that to "
            f"{left[0].name[:-len(PARTIAL)]}), then launch again")


def written_at(path: Path) -> float:
    """When `path` was last written: a file's modification time; a folder's newest file's (its own where it holds
    none), but for empty files and SQLite's `-shm` index, which a reader of a state dir creates or writes too (as
    `coordinator_run_problem` does)."""
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_mtime
    times = [file.stat().st_mtime for file in path.rglob("*")
             if file.is_file() and not file.name.endswith("-shm") and file.stat().st_size > 0]
    return max(times, default=path.stat().st_mtime)


def earlier_folder(run_dir: Path, found: list[Path]) -> Path:
    """RUN_DIR/earlier/<when the newest of `found` was written> (`written_at`; a suffix -2, -3... where that name, or
    that name with PARTIAL, is taken)."""
    written = max(written_at(path) for path in found)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(written))
    target, suffix = run_dir / EARLIER / stamp, 1
    while target.exists() or target.with_name(target.name + PARTIAL).exists():
        suffix += 1
        target = run_dir / EARLIER / f"{stamp}-{suffix}"
    return target


@contextlib.contextmanager
def state_dir_held(state_dir: Path) -> Iterator[None]:
    """The lock of `state_dir` (a folder, when there is one) held while it is moved: SetAsideFailed naming the
    process that holds it (a bootstrap peer or coordinator an earlier launch left running, `rcswarm dht` or
    `rcswarm coordinator` started by hand on it), nothing moved."""
    if not state_dir.is_dir() or state_dir.is_symlink():
        yield
        return
    try:
        lock = StateDirLock.acquire(state_dir, role="launcher")
    except StateDirBusy:
        lock_file = state_dir / "coordinator.lock"
        raise SetAsideFailed(f"{state_dir} is in use by a {holder_role(lock_file)} ({holder_text(lock_file)}); stop "
                             "it first; nothing moved") from None
    except OSError as exc:
        raise SetAsideFailed(f"{state_dir} cannot be locked ({exc}); nothing moved") from None
    try:
        yield
    finally:
        lock.release()


def move_into(found: list[Path], target: Path) -> None:
    """Move `found` into `target` with PARTIAL added to its name (made first), then rename that folder to `target`
    once: a move that fails midway leaves the results in one folder whose name says so (`partial_problem`).
    SetAsideFailed saying which moved where and which stayed."""
    partial = target.with_name(target.name + PARTIAL)
    try:
        partial.mkdir(parents=True)
    except OSError as exc:
        raise SetAsideFailed(f"{partial} cannot be made ({exc}); nothing moved") from None
    moved: list[str] = []
    for path in found:
        try:
            os.replace(path, partial / path.name)
        except OSError as exc:
            if not moved:
                with contextlib.suppress(OSError):
                    partial.rmdir()  # empty: no folder is left for a next launch to misread
            raise SetAsideFailed(moved_problem(found, moved, path, partial, exc)) from None
        moved.append(path.name)
    try:
        os.rename(partial, target)
    except OSError as exc:
        raise SetAsideFailed(f"{', '.join(moved)} moved to {partial}, which cannot be renamed to {target.name} "
                             f"({exc}); rename it before launching here again") from None


def moved_problem(found: list[Path], moved: list[str], failed: Path, partial: Path, exc: OSError) -> str:
    """What a move of `found` that failed at `failed` (`exc`) did: which moved to `partial` (`moved`), which stayed
    in the run directory, and how to make them whole again."""
    if not moved:
        return f"{failed.name} cannot be moved to {partial.parent} ({exc}); nothing moved"
    stayed = [path.name for path in found if path.name not in moved]
    return (f"{', '.join(moved)} moved to {partial}, but {failed.name} cannot be ({exc}): {', '.join(stayed)} "
            f"stayed in {failed.parent}; move {', '.join(moved)} back into the run directory (or {', '.join(stayed)} "
            f"into {partial.name} and rename that to {partial.name[:-len(PARTIAL)]}) before launching here again")


def set_aside_earlier_results(run_dir: Path) -> Path | None:
    """Move the RESULT_NAMES an earlier launch left in `run_dir` to RUN_DIR/earlier/<when the newest of them was
    written>/ (`earlier_folder`, `move_into`), state/ under its lock (`state_dir_held`); that folder, or None when
    there were none. SetAsideFailed saying what moved where when they cannot all be moved."""
    found = [run_dir / name for name in RESULT_NAMES if os.path.lexists(run_dir / name)]
    if not found:
        return None
    target = earlier_folder(run_dir, found)
    with state_dir_held(run_dir / "state"):
        move_into(found, target)
    return target


def announce_earlier_results(run_dir: Path, console: Console) -> bool:
    """`set_aside_earlier_results`, and a line naming what moved where; False (said on stderr, which moved where and
    which stayed) when they cannot all be moved: the launch then stops before it starts anything."""
    names = [name for name in RESULT_NAMES if os.path.lexists(run_dir / name)]
    try:
        earlier = set_aside_earlier_results(run_dir)
    except SetAsideFailed as exc:
        print(f"rcswarm run: --run-dir {str(run_dir)!r}: the earlier launch's {', '.join(names)}, which this launch "
              f"would replace or mix with its own, were not all moved aside: {exc}", file=sys.stderr)
        return False
    if earlier is not None:
        console.print(f"--run-dir {escape(str(run_dir))} holds an earlier launch's {', '.join(names)}: moved to "
                      f"{escape(str(earlier))} (a hivemind launch resumes neither the earlier replicas nor their "
                      "state: its workers start from θ_0, its metrics go to a new state/)", soft_wrap=True)
    return True


def read_peer(out: Path) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """A worker's --out `out`: its name, the entry of the summary (`summarize`) its summary.json makes, and its
    final.safetensors. ValueError naming the file that cannot be read and why (a torn summary.json a SIGKILLed
    worker left, a missing final.safetensors)."""
    path = out / "summary.json"
    try:
        summary = json.loads(path.read_text())
        history = summary["history"]
        entry = {
            "version": summary["version"], "first_round_loss": history[0]["loss"] if history else None,
            "last_round_loss": history[-1]["loss"] if history else None,
            "skipped_rounds": sum(1 for h in history if h["skipped"]),
            "max_drift": max((h["drift"] for h in history), default=0.0),
        }
        name = summary["name"]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from None
    path = out / "final.safetensors"
    try:
        final = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise ValueError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from None
    return name, entry, final


def summarize(spec: RunSpec, run_dir: Path, workers: int, evaluated: bool = True) -> dict:
    """Per peer its version and round losses; the replicas' largest difference; held-out loss before and after
    (`held_out_losses`: None with the reason when not `evaluated` or the evaluation cannot read the data). A peer whose
    files cannot be read (`read_peer`) is left out, named with why in `peer_problems`."""
    peers, finals, problems = {}, {}, []
    for rank in range(workers):
        out = run_dir / "peers" / f"worker-{rank}"
        if not (out / "summary.json").is_file():
            continue
        try:
            name, entry, final = read_peer(out)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        peers[name], finals[name] = entry, final
    result: dict = {"peers": peers, "rounds": min((p["version"] for p in peers.values()), default=0)}
    if problems:
        result["peer_problems"] = problems
    if finals:
        first = next(iter(finals.values()))
        result["replica_max_abs_difference"] = max(
            (float((params[k] - first[k]).abs().max()) for params in finals.values() for k in first), default=0.0)
        if "worker-0" in finals:
            result["export_problem"] = export_replica(run_dir)
        result.update(held_out_losses(spec, {k: v.to(torch.float32) for k, v in first.items()}, evaluated))
    return result


def export_replica(run_dir: Path) -> str:
    """Copy worker-0's replica to RUN_DIR/final.safetensors (a temporary renamed over it); "" when done, else (a full
    disk) "final parameters not exported: why", which one line on stderr says too: the summary is written either
    way, as the coordinator's launch does (`cli/run.export_or_say`)."""
    final = run_dir / "final.safetensors"
    partial = final.with_name(f".{final.name}.partial")
    try:
        shutil.copyfile(run_dir / "peers" / "worker-0" / "final.safetensors", partial)
        os.replace(partial, final)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        problem = f"final parameters not exported: {exc}"
        print(f"rcswarm run: {problem}", file=sys.stderr)
        return problem
    return ""


def print_bootstrap(console: Console, maddrs: list[str], written: Path) -> None:
    """The bootstrap peer's multiaddrs on one line that is never wrapped (a copied address must be whole), and
    the file that holds them."""
    console.print(f"bootstrap peer (in {written}): --initial-peers {' '.join(maddrs)}", soft_wrap=True)


def peer_line(name: str, peer: dict) -> str:
    """A peer's line of the summary: its version, first and last round loss ("no round trained" where its history is
    empty: the budget or a signal ended it before its first round), skipped rounds and largest drift."""
    if peer["first_round_loss"] is None and peer["last_round_loss"] is None:
        losses = "no round trained"
    else:
        losses = f"round loss {number(peer['first_round_loss'])} → {number(peer['last_round_loss'])}"
    return (f"{escape(name)}: version {peer['version']}, {losses}, {peer['skipped_rounds']} skipped, "
            f"max drift {peer['max_drift']:.3g}")


def launch(spec: RunSpec, run_dir: Path, minutes: float | None, console: Console, stop: StopSignal,
           max_params: int = 0) -> int:
    """Run the swarm and print its summary; the exit status (0 completed or at the budget, 1 failed, a run directory
    that cannot take the launch (`run_dir_problem`, `announce_earlier_results`) or a process that did not start, 128 +
    the signal's number when one stopped it). Nothing in the run directory is moved or written before its checks."""
    problem = run_dir_problem(run_dir)
    if problem:
        print(f"rcswarm run: --run-dir {str(run_dir)!r}: {problem}", file=sys.stderr)
        return 1
    if not announce_earlier_results(run_dir, console):
        return 1
    swarm = HivemindSwarm(spec, run_dir, spec.run.workers, max_params)
    out_of_time = False
    try:
        try:
            maddrs, target = start_services(swarm, spec, console)
        except RuntimeError as exc:
            print(f"rcswarm run: {exc}", file=sys.stderr)
            return 1
        swarm.start_peers(maddrs, target)
        swarm.write_process_table()
        deadline = time.monotonic() + minutes * 60.0 if minutes else math.inf
        out_of_time = wait(swarm, console, stop, deadline)
    finally:
        swarm.stop()
    with SummarySignals() as signals:  # a signal now ends the launcher only once summary.json is written
        ended = summarize_and_write(spec, run_dir, swarm, console, stop, out_of_time, minutes)
    return summary_status(ended, signals)


def start_services(swarm: HivemindSwarm, spec: RunSpec, console: Console) -> tuple[list[str], str]:
    """The bootstrap peer, and the coordinator where the curriculum needs one (`needs_coordinator`), started and
    announced; (the bootstrap peer's multiaddrs, the coordinator's HOST:PORT or ""). RuntimeError when one does not
    start (`Swarm.start_failure`)."""
    why, run_dir = needs_coordinator(spec), swarm.run_dir
    maddrs = swarm.start_bootstrap(mirror=not why)
    target = ""
    if why:
        port, http_port = swarm.start_coordinator()
        target = f"127.0.0.1:{port}"
        console.print(f"rcswarm run {spec.run.name}: a hivemind swarm of {spec.run.workers} workers and a coordinator "
                      f"on {target} as its control plane ({why}); run directory {run_dir}")
        console.print(f"dashboard http://127.0.0.1:{http_port}/; logs in {swarm.logs}")
    else:
        console.print(f"rcswarm run {spec.run.name}: a hivemind swarm of {spec.run.workers} workers, no coordinator; "
                      f"run directory {run_dir}")
        console.print(f"metrics mirrored into {run_dir / 'state'}; logs in {swarm.logs}")
    print_bootstrap(console, maddrs, swarm.maddrs_file)
    return maddrs, target


def summarize_and_write(spec: RunSpec, run_dir: Path, swarm: HivemindSwarm, console: Console, stop: StopSignal,
                        out_of_time: bool, minutes: float | None) -> Outcome:
    """The stopped swarm's summary (the held-out evaluation skippable), printed and written to summary.json; how the
    run ended."""
    result = skippable_evaluation(console, lambda evaluated: summarize(spec, run_dir, spec.run.workers, evaluated))
    codes = [p.returncode for p in swarm.workers]
    if stop.is_set():
        ended = interrupted_outcome(stop, f"{result['rounds']} of {spec.run.rounds} rounds")
    elif out_of_time:
        ended = Outcome("budget", f"stopped at the {minutes:g}-minute budget after {result['rounds']} rounds", 0)
    elif result["rounds"] < spec.run.rounds or any(code != 0 for code in codes):
        ended = Outcome("failed", f"the run did not complete: {result['rounds']} of {spec.run.rounds} rounds; "
                                  f"worker exit codes {codes}; see {swarm.logs}", 1)
    else:
        ended = Outcome("completed", f"completed {result['rounds']} rounds", 0)
    for name, peer in result["peers"].items():
        console.print(peer_line(name, peer))
    for problem in result.get("peer_problems", []):
        console.print(f"{escape(problem)}: its peer is left out of this summary", style="yellow", soft_wrap=True)
    if "val_loss_final" in result:
        console.print(f"held-out loss {held_out_text(result)}; replicas differ by at most "
                      f"{result['replica_max_abs_difference']:.3g}")
    write_summary(run_dir, {**result, "outcome": ended.kind, "outcome_message": ended.message})
    console.print(ended.message)
    return ended
