"""Start-up cost of workers on Ray (`rcswarm launch ray`) against plain worker processes (`rcswarm run`).

    python benchmarks/ray_startup_bench.py                 # 3 repeats, 2 workers, the tiny LSTM
    python benchmarks/ray_startup_bench.py --repeats 5 --workers 2 --preset small

Each repeat serves a fresh run from a coordinator in this process (`RunningCoordinator`, gRPC on
127.0.0.1, a fresh state dir: the same in both paths, started before the clock) and measures:

* **processes** (what `rcswarm run` does after its coordinator is up): N `python -m rcswarm.cli worker`
  processes are spawned; seconds until every worker has joined, and until the first round closed
  (version 1).
* **ray**: a local Ray instance is started (`ray.init(num_cpus=2·N, num_gpus=N)`, loopback only,
  no dashboard: *ray.init*), then `rcswarm launch ray --detach` runs in its own process (a Ray
  driver: it connects, creates the supervisor, which creates the N worker actors, and returns once
  they joined). Seconds from spawning the launcher until every worker joined and until version 1,
  and the launcher's own run time. `--stop` and `ray.shutdown()` end the repeat (not timed).

"Joined" and "version 1" are read from the coordinator itself every 50 ms. On a cluster that
already runs, ray.init is paid once by the cluster, not per launch. Prints a table of medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator
from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.state.store import StateStore

TOKEN = "bench-token-0123456789"
POLL_S = 0.05
TIMEOUT_S = 300.0


def spec_for(preset: str, workers: int) -> RunSpec:
    return RunSpec.from_dict({
        "run": {"name": "ray-startup", "rounds": 1000, "workers": workers},
        "model": {"name": "lstm_lm", "preset": preset},
        "data": {"seq_len": 32, "batch_size": 4, "max_bytes": 2_000_000},
        "inner": {"steps": 4, "lr": 1e-2},
        "sync": {"codec": "fp32", "min_reports": workers, "round_deadline_s": 120.0},
        "coordinator": {"lease_s": 30.0, "max_wait_s": 2.0},
    })


def serve(spec: RunSpec, state_dir: Path) -> RunningCoordinator:
    store = StateStore(state_dir, spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    return RunningCoordinator(SwarmCoordinator(spec, store), TOKEN).start()


def until(predicate, what: str) -> float:
    """time.perf_counter() when `predicate()` first holds (polled every POLL_S, at most TIMEOUT_S)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if predicate():
            return time.perf_counter()
        time.sleep(POLL_S)
    raise RuntimeError(f"timed out waiting for {what}")


def milestones(running: RunningCoordinator, workers: int, started: float) -> tuple[float, float]:
    """Seconds from `started` until every worker joined, and until version 1."""
    service = running.coordinator
    joined = until(lambda: service.active_workers() >= workers, "the joins")
    first = until(lambda: service.version >= 1, "version 1")
    return joined - started, first - started


def env() -> dict[str, str]:
    return {**os.environ, TOKEN_ENV: TOKEN, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def processes(spec: RunSpec, folder: Path, workers: int) -> dict[str, float]:
    running = serve(spec, folder / "state-processes")
    target = f"127.0.0.1:{running.port}"
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "rcswarm.cli", "worker", "--coordinator", target, "--name", f"w{i}",
                               "--threads", "1", "--device", "cpu"], env=env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for i in range(workers)]
    try:
        joined, first = milestones(running, workers, started)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        running.stop(grace=0.5)
    return {"joined": joined, "first round": first}


def on_ray(spec: RunSpec, folder: Path, workers: int) -> dict[str, float]:
    import ray

    running = serve(spec, folder / "state-ray")
    target = f"127.0.0.1:{running.port}"
    temp_dir = tempfile.mkdtemp(prefix="rcsray-")  # short: Ray's unix sockets live below it
    began = time.perf_counter()
    context = ray.init(num_cpus=2 * workers, num_gpus=workers, _node_ip_address="127.0.0.1", include_dashboard=False,
                       namespace="bench", _temp_dir=temp_dir, log_to_driver=False)
    initialised = time.perf_counter() - began
    address = context.address_info["gcs_address"]
    command = [sys.executable, "-m", "rcswarm.cli.main", "launch", "ray", "--address", address, "--namespace", "bench"]
    try:
        started = time.perf_counter()
        launcher = subprocess.Popen([*command, "--coordinator", target, "--workers", str(workers), "--gpus-per-worker",
                                     "1", "--cpus-per-worker", "1", "--device", "cpu", "--detach"],
                                    env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        returned: list[float] = []
        waiter = threading.Thread(target=lambda: returned.append((launcher.wait(), time.perf_counter())[1]), daemon=True)
        waiter.start()
        joined, first = milestones(running, workers, started)
        waiter.join(timeout=TIMEOUT_S)
        if not returned or launcher.returncode != 0:
            raise RuntimeError("rcswarm launch ray --detach failed")
        launched = returned[0] - started
        subprocess.run([*command, "--stop"], env=env(), check=True, capture_output=True, timeout=TIMEOUT_S)
    finally:
        ray.shutdown()
        running.stop(grace=0.5)
        shutil.rmtree(temp_dir, ignore_errors=True)
    return {"ray.init": initialised, "joined": joined, "first round": first, "launcher returned": launched}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each path (default: 3)")
    parser.add_argument("--workers", type=int, default=2, help="workers per run (default: 2)")
    parser.add_argument("--preset", default="tiny", help="lstm_lm preset (default: tiny)")
    args = parser.parse_args(argv)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on loopback only, before ray is imported
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ[TOKEN_ENV] = TOKEN  # the Ray nodes' environment, which the worker actors read
    spec = spec_for(args.preset, args.workers)
    results: dict[str, list[dict[str, float]]] = {"processes": [], "ray": []}
    with tempfile.TemporaryDirectory(prefix="ray-startup-") as tmp:
        for repeat in range(args.repeats):
            for path, measure in (("processes", processes), ("ray", on_ray)):
                folder = Path(tmp) / f"{path}-{repeat}"
                folder.mkdir()
                results[path].append(measure(spec, folder, args.workers))
                print(f"repeat {repeat} {path}: " + ", ".join(f"{k} {v:.2f}s" for k, v in results[path][-1].items()),
                      flush=True)
    load = os.getloadavg()
    print(f"\n{args.workers} workers, lstm_lm {args.preset}, {args.repeats} repeats; medians in seconds; "
          f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    base = {k: statistics.median(r[k] for r in results["processes"]) for k in ("joined", "first round")}
    print("| path | ray.init | launcher returned | all joined | first round (version 1) | first round × processes |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path, rows in results.items():
        median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        cells = [f"{median[k]:.2f}" if k in median else "–" for k in ("ray.init", "launcher returned", "joined", "first round")]
        print(f"| {path} | {' | '.join(cells)} | {median['first round'] / base['first round']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
