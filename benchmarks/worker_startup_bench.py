"""Worker start-up: how long after its process starts a worker trains, against a plain interpreter and torch alone.

A real `python -m rcswarm.cli coordinator` process (the chaos soak's run: tiny lstm_lm, 32 × 4 windows, int8, 5 inner
steps) and, `--repeats` times, a `rcswarm worker` process started and stopped once it pushed its first round. From
the worker's log lines (their timestamps against the moment it was started): when it joined, when it pulled (it
trains right after) and when its first push landed. With `--before DIR` the same is measured, interleaved, for the
rcswarm tree in DIR/rcswarm (put first on PYTHONPATH: `git archive <commit> | tar -x -C DIR/rcswarm`), and with
`--membership` once more for this tree's restarted worker (`--membership-file` holding a killed process's
membership: it ends it and builds the model before joining). Medians, one row per kind of process:

    python benchmarks/worker_startup_bench.py --repeats 5 --before /tmp/before
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rcswarm.config.runspec import RunSpec
from rcswarm.protos.wire import TOKEN_ENV

TOKEN = "startup-bench-token-0123456789"
HOST = "127.0.0.1"
TIMEOUT_S = 120.0
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
EVENTS = {"joined": " joined ", "pulled (trains)": " pulled version ", "first push": " pushed round "}
SPEC = {
    "run": {"name": "startup", "rounds": 0, "workers": 64},
    "model": {"name": "lstm_lm", "preset": "tiny"},
    "data": {"seq_len": 32, "batch_size": 4, "max_bytes": 2_000_000},
    "inner": {"steps": 5, "lr": 1e-2},
    "sync": {"codec": "int8", "round_deadline_s": 5.0, "min_reports": 1},
    "coordinator": {"lease_s": 5.0, "max_wait_s": 2.0},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def stamp_of(line: str) -> float | None:
    found = STAMP.match(line)
    if found is None:
        return None
    return datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def children_cpu_s() -> float:
    """CPU seconds (user + system) of every child process reaped so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Seconds a command takes from its start to its exit, and its CPU seconds."""
    started, cpu = time.perf_counter(), children_cpu_s()
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=TIMEOUT_S)
    return {"exit": time.perf_counter() - started, "CPU s": children_cpu_s() - cpu}


def worker_run(target: str, env: dict[str, str], log: Path, extra: list[str]) -> dict[str, float]:
    """Start a worker, stop it once it pushed; seconds from its start to each of EVENTS and, when it logged one, its
    own account of the start-up ("trains version V, S s after its process started (...)")."""
    argv = [sys.executable, "-m", "rcswarm.cli", "worker", "--coordinator", target, "--threads", "1",
            "--name", log.stem, *extra]
    started, cpu = time.time(), children_cpu_s()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while " pushed round " not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"no push within {TIMEOUT_S:g}s:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    found: dict[str, float] = {"CPU s": children_cpu_s() - cpu}
    for line in log.read_text(errors="replace").splitlines():
        at = stamp_of(line)
        for name, marker in EVENTS.items():
            if at is not None and marker in line and name not in found:
                found[name] = at - started
        if "after its process started" in line and "own account" not in found:
            found["own account"] = float(line.split(" after its process started")[0].rsplit(",", 1)[1].strip()[:-1])
    return found


def killed_membership(target: str, env: dict[str, str], log: Path, membership: Path) -> None:
    """A worker that joins with `--membership-file` and is SIGKILLed once it trains: the file its successor finds."""
    argv = [sys.executable, "-m", "rcswarm.cli", "worker", "--coordinator", target, "--threads", "1", "--name",
            log.stem, "--membership-file", str(membership)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + TIMEOUT_S
    while " pushed round " not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise RuntimeError("the worker to kill never pushed")
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def start_coordinator(work: Path, config: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """A coordinator process of the run in `work`, once it serves; (process, HOST:PORT)."""
    work.mkdir(parents=True)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config),
         "--state-dir", str(work / "state"), "--host", HOST, "--port", str(port),
         "--port-file", str(work / "port.json")],
        env=env, stdout=open(work / "coordinator.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + TIMEOUT_S
    while not (work / "port.json").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            log = (work / "coordinator.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the coordinator in {work} did not start:\n{log}")
        time.sleep(0.05)
    return proc, f"{HOST}:{port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker_startup_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", type=Path, default=None, help="a directory holding the rcswarm tree to compare")
    parser.add_argument("--membership", action="store_true", help="also a restarted worker with --membership-file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        print(f"worker_startup_bench: --repeats {args.repeats}: expected >= 1", file=sys.stderr)
        return 2
    # SIGTERM as Ctrl-C: through the finally below, which stops the coordinators (in sessions of their own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="rcswarm-startup-"))
    env = {**os.environ, TOKEN_ENV: TOKEN, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    before_env = {**env, "PYTHONPATH": f"{args.before}{os.pathsep}{env.get('PYTHONPATH', '')}"} if args.before else None
    config = work / "run.toml"
    RunSpec.from_dict(SPEC)  # valid here; written with only its own keys, which the other tree reads as well
    config.write_text("".join(f"[{table}]\n" + "".join(f"{key} = {value!r}\n".replace("'", '"')
                                                        for key, value in values.items()) + "\n"
                              for table, values in SPEC.items()))
    rows: dict[str, list[dict[str, float]]] = {}
    load = [os.getloadavg()[0]]
    coordinators: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        # One coordinator per tree: a run spec names every key of its tree, which an older worker refuses.
        coordinators["this"] = start_coordinator(work / "this", config, env)
        if before_env is not None:
            coordinators["before"] = start_coordinator(work / "before", config, before_env)
        target = coordinators["this"][1]
        for repeat in range(args.repeats):
            rows.setdefault("python -c pass", []).append(timed([sys.executable, "-c", "pass"], env))
            rows.setdefault("python -c 'import torch'", []).append(timed([sys.executable, "-c", "import torch"], env))
            if before_env is not None:
                before = worker_run(coordinators["before"][1], before_env, work / f"b{repeat}.log", [])
                rows.setdefault("worker, before", []).append(before)
            rows.setdefault("worker, this tree", []).append(worker_run(target, env, work / f"a{repeat}.log", []))
            if args.membership:
                membership = work / f"m{repeat}.json"
                killed_membership(target, env, work / f"k{repeat}.log", membership)
                rows.setdefault("restarted worker, --membership-file", []).append(
                    worker_run(target, env, work / f"m{repeat}.log", ["--membership-file", str(membership)]))
            load.append(os.getloadavg()[0])
            print(f"worker_startup_bench: repeat {repeat + 1} of {args.repeats} done", file=sys.stderr, flush=True)
    finally:
        for proc, _ in coordinators.values():
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)  # the state dirs and logs (it was left in the temp dir)
    columns = ["exit", *EVENTS, "own account", "CPU s"]
    print("CPU s: the process's CPU seconds, to its exit (a worker's: after its first push and Leave); the rest: "
          "median seconds from the process's start")
    print(f"over {args.repeats} runs; load average (1 min) "
          f"{min(load):.1f}-{max(load):.1f}; {os.cpu_count()} CPUs")
    print("| process | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for name, runs in rows.items():
        cells = []
        for column in columns:
            values = [run[column] for run in runs if column in run]
            cells.append(f"{statistics.median(values):.2f}" if values else "")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
