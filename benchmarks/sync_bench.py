"""One sync round of rcswarm against hivemind's DecentralizedAverager, on loopback.

    pip install -e '.[dev,bench]'
    python benchmarks/sync_bench.py                      # 2 and 4 workers, fp32/bf16/int8, hivemind (minutes)
    python benchmarks/sync_bench.py --quick              # smoke run: tiny model, 1 round, every configuration (~2 min)
    python benchmarks/sync_bench.py --workers 2 --rounds 8 --codecs fp32 int8 --json results.json

The tensors are the parameter shapes of ``build_model("lstm_lm", "base10m")`` (9,772,224
float32 values, 39 tensors); ``--preset`` picks another preset of the same model.

rcswarm: a real coordinator runs in its own process (``python -m rcswarm.cli coordinator``, a
fresh state dir per configuration, ``[sync] codec`` set to the codec under test). N worker
processes each join, pull once (a worker's base version is set by its pull), then per round:
build a random pseudo-gradient Δ (global L2 norm ``--delta-norm``) and encode it with
``ErrorFeedback.compress`` (bf16, int8) or plain fp32, all before the round starts; wait on a
shared barrier; ``push`` → ``await_version(v+1)`` → ``pull``. Seconds per round run from the
first worker leaving the barrier to the last worker holding version v+1, so they include the
coordinator's close of the round: decode, average, outer Nesterov step, SHA-256, persisting
the version (safetensors + fsync, SQLite FULL sync) and building the pull payloads; each
worker pulls with the version it holds, so it receives the compressed outer step. Bytes
are what ``CoordinatorClient`` counts (protobuf message sizes of push and pull) summed over
the workers, plus the bytes the loopback interface carried during the round (``lo`` tx, which
also counts gRPC/HTTP2/TCP framing and anything else on loopback).

hivemind: N processes, each with its own DHT node (the first on 127.0.0.1, the others
bootstrapped from it) and a DecentralizedAverager over tensors of the same shapes
(``target_group_size = min_group_size = N``, no compression, hivemind's defaults otherwise).
After all peers are ready, each round they leave a barrier and call ``averager.step()``;
seconds per round run from the first peer leaving the barrier to the last ``step()``
returning (matchmaking included; the all-reduce part is shown separately). hivemind exposes
no byte counters, so its payload is reported as ``n_params * 4`` bytes per peer, next to the
measured loopback bytes.

hivemind's libp2p connections are encrypted (TLS 1.3) by default; plain rcswarm gRPC is not,
so ``--tls-codecs`` (default: fp32) runs those rcswarm configurations a second time with the
coordinator serving TLS (a self-signed certificate, made with ``cryptography``).
``--no-fsync-codecs`` (default: fp32 int8) runs configurations again with ``[coordinator]
durable = false``: each version is still persisted atomically, but not fsynced (hivemind
persists nothing). A separate table times the coordinator's close-of-round pieces in-process (weighted average
and outer step, SHA-256, ``StateStore.commit_version``, building the pull payload).

Every child process runs in its own session and is killed with its process group on exit,
on errors and on Ctrl-C; every wait has a timeout (``--timeout`` per configuration).
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import multiprocessing as mp
import os
import queue as queue_mod
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rcswarm.protos.wire import TOKEN_ENV

LO_TX = Path("/sys/class/net/lo/statistics/tx_bytes")
START_TIMEOUT_S = 90.0
AWAIT_WAIT_S = 10.0
STOP_GRACE_S = 5.0
INT8_BLOCK = 256
CLK_TCK = os.sysconf("SC_CLK_TCK")


def read_lo_tx() -> int | None:
    """Bytes the loopback interface has transmitted so far (None where not readable)."""
    try:
        return int(LO_TX.read_text())
    except (OSError, ValueError):
        return None


def _child_setup(log_path: str, threads: int) -> None:
    """In a child: own session (so the parent can kill the group), output to a log file."""
    os.setsid()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    import torch

    torch.set_num_threads(threads)


def session_cpu_s(sid: int) -> float:
    """CPU seconds (user + system) of the live processes of session `sid`: a peer with its DHT, averager and
    p2pd, or the coordinator (Linux /proc; 0.0 where it is unreadable)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # After "pid (comm)": state ppid pgrp session ... utime (11th) stime (12th).
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return ticks / CLK_TCK


def random_tensors(shapes: list[tuple[str, tuple[int, ...]]], seed: int, norm: float) -> dict[str, Any]:
    """Gaussian tensors of the given shapes, scaled to a global L2 norm of ``norm``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(shape, generator=gen) for name, shape in shapes}
    total = math.sqrt(sum(float(t.double().square().sum()) for t in tensors.values()))
    scale = norm / total if total > 0 else 1.0
    for t in tensors.values():
        t.mul_(scale)
    return tensors


def report_failure(rank: int, barrier: Any, out: Any) -> None:
    """In a peer's `except`: release the others from the barrier and send the traceback to the parent."""
    try:
        barrier.abort()
    finally:
        out.put(("error", rank, traceback.format_exc()))


def rcswarm_worker(rank: int, cfg: dict[str, Any], barrier: Any, out: Any) -> None:
    """Join, pull once, then rounds of push → await_version(v+1) → pull; results on ``out``."""
    try:
        _child_setup(cfg["log"], cfg["threads"])
        from rcswarm.protos.v1 import coordinator_pb2 as pb
        from rcswarm.sync import codec as codecs
        from rcswarm.sync import tensor_stream
        from rcswarm.worker import CoordinatorClient, RetryPolicy, Timeouts

        codec = codecs.codec_from_name(cfg["codec"])
        sid = os.getsid(0)
        client = CoordinatorClient(
            cfg["target"], cfg["token"], tls_ca=Path(cfg["tls_ca"]) if cfg["tls_ca"] else None,
            retry=RetryPolicy(max_elapsed_s=30.0),
            timeouts=Timeouts(unary_s=30.0, transfer_s=cfg["timeout"]),
        )
        try:
            joined = client.join(f"bench-{rank}", "cpu", os.getpid())
            run_id = joined.run_id
            version, held = client.pull(joined, run_id)
            feedback = codecs.ErrorFeedback() if codec != pb.CODEC_FP32 else None
            out.put(("ready", rank, None))
            for r in range(cfg["total_rounds"]):
                deltas = random_tensors(cfg["shapes"], seed=1000 * rank + r, norm=cfg["delta_norm"])
                cpu_enc = session_cpu_s(sid)
                t_enc = time.monotonic()  # the codec and the payload, not the random numbers
                encoded = feedback.compress(deltas, codec, INT8_BLOCK) if feedback is not None else None
                header, chunks = tensor_stream.build_payload(
                    deltas, codec=codec, run_id=run_id, version=version, block_size=INT8_BLOCK, encoded=encoded
                )
                meta = pb.UpdateMeta(worker_id=joined.worker_id, worker_secret=joined.worker_secret, base_version=version,
                                     tokens=1000, inner_steps=1)
                encode_s = time.monotonic() - t_enc
                del deltas, encoded
                coordinator_cpu0 = session_cpu_s(cfg["coordinator_sid"]) if rank == 0 else 0.0
                barrier.wait(timeout=cfg["timeout"])
                lo0 = read_lo_tx()
                sent0, recv0 = client.bytes_sent, client.bytes_received
                t0 = time.monotonic()
                client.push(meta, header, chunks)
                t_push = time.monotonic()
                push_bytes = client.bytes_sent - sent0
                deadline = t0 + cfg["timeout"]
                while client.await_version(joined, version + 1, AWAIT_WAIT_S).version < version + 1:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"version {version + 1} did not appear within {cfg['timeout']}s")
                t_await = time.monotonic()
                new_version, held = client.pull(joined, run_id, have=(version, held))
                t1 = time.monotonic()
                lo1 = read_lo_tx()
                if new_version != version + 1:
                    raise RuntimeError(f"pulled version {new_version}, expected {version + 1}")
                version = new_version
                cpu_s = session_cpu_s(sid) - cpu_enc  # the encode and the round
                barrier.wait(timeout=cfg["timeout"])  # every worker holds v+1: the coordinator's part is done
                coordinator_cpu_s = session_cpu_s(cfg["coordinator_sid"]) - coordinator_cpu0 if rank == 0 else None
                out.put(("round", rank, dict(
                    round=r, t0=t0, t_push=t_push, t_await=t_await, t1=t1, lo0=lo0, lo1=lo1, cpu_s=cpu_s,
                    coordinator_cpu_s=coordinator_cpu_s, encode_s=encode_s, push_bytes=push_bytes,
                    sent=client.bytes_sent - sent0, received=client.bytes_received - recv0,
                )))
            client.leave(joined, "benchmark done")
        finally:
            client.close()
        out.put(("done", rank, None))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        report_failure(rank, barrier, out)


def hivemind_peer(rank: int, cfg: dict[str, Any], initial_peers: list[str] | None, barrier: Any, out: Any) -> None:
    """A DHT node and a DecentralizedAverager; rounds of averager.step(); results on ``out``."""
    try:
        _child_setup(cfg["log"], cfg["threads"])
        # hivemind's DHT and averager are processes forked from this one; this child was
        # spawned, which would make them spawn (and fail to pickle their state).
        mp.set_start_method("fork", force=True)
        import hivemind
        from hivemind.averaging.control import AveragingStage

        n, sid = cfg["workers"], os.getsid(0)
        tensors = list(random_tensors(cfg["shapes"], seed=rank, norm=cfg["delta_norm"]).values())
        dht = hivemind.DHT(
            start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=initial_peers,
        )
        averager = None
        try:
            if rank == 0:
                out.put(("maddrs", rank, [str(m) for m in dht.get_visible_maddrs()]))
            averager = hivemind.averaging.DecentralizedAverager(
                tensors, dht, start=True, prefix="syncbench", target_group_size=n, min_group_size=n,
                allreduce_timeout=cfg["timeout"],
            )
            out.put(("ready", rank, None))
            for r in range(cfg["total_rounds"]):
                with averager.get_tensors() as local:
                    fresh = random_tensors(cfg["shapes"], seed=1000 * rank + r, norm=cfg["delta_norm"])
                    for t, f in zip(local, fresh.values(), strict=True):
                        t.copy_(f)
                    del fresh
                cpu0 = session_cpu_s(sid)
                barrier.wait(timeout=cfg["timeout"])
                lo0 = read_lo_tx()
                t0 = time.monotonic()
                control = averager.step(wait=False, timeout=cfg["timeout"])
                t_allreduce = None
                while not control.done():
                    if t_allreduce is None and control.stage == AveragingStage.RUNNING_ALLREDUCE:
                        t_allreduce = time.monotonic()
                    time.sleep(0.005)
                gathered = control.result(timeout=cfg["timeout"])
                t1 = time.monotonic()
                lo1 = read_lo_tx()
                if gathered is None or len(gathered) != n:
                    raise RuntimeError(f"averager.step() returned {gathered!r}; expected a group of {n}")
                out.put(("round", rank, dict(
                    round=r, t0=t0, t_allreduce=t_allreduce if t_allreduce is not None else t0, t1=t1,
                    lo0=lo0, lo1=lo1, cpu_s=session_cpu_s(sid) - cpu0,
                )))
            print(f"{time.strftime('%H:%M:%S')} peer {rank}: {cfg['total_rounds']} rounds done; shutting down",
                  flush=True)
        finally:
            if averager is not None:
                averager.shutdown()
            dht.shutdown()
        out.put(("done", rank, None))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        report_failure(rank, barrier, out)


def backend_peer(rank: int, cfg: dict[str, Any], initial_peers: list[str] | None, barrier: Any, out: Any) -> None:
    """rcswarm's hivemind backend (worker/hivemind_sync.py): average Δ with the run's codec, check it, outer step."""
    try:
        _child_setup(cfg["log"], cfg["threads"])
        mp.set_start_method("fork", force=True)  # as hivemind_peer: the DHT and averager fork from here
        import torch

        from rcswarm.config.runspec import OuterSection
        from rcswarm.sync.outer import outer_step
        from rcswarm.worker import hivemind_sync as hs

        n, names, sid = cfg["workers"], [name for name, _ in cfg["shapes"]], os.getsid(0)
        shapes = [shape for _, shape in cfg["shapes"]]
        theta = random_tensors(cfg["shapes"], seed=7, norm=100.0)
        momentum = {name: torch.zeros_like(t) for name, t in theta.items()}
        state = ({"run": "syncbench", "version": 0}, [])
        options = hs.HivemindOptions.loopback(initial_peers or ())
        peer = hs.HivemindPeer("syncbench", shapes, cfg["codec"], INT8_BLOCK, options, lambda: state,
                               min_group_size=n, target_group_size=n)
        try:
            if rank == 0:
                out.put(("maddrs", rank, hs.visible_maddrs(peer.dht)))
            out.put(("ready", rank, None))
            for r in range(cfg["total_rounds"]):
                deltas = list(random_tensors(cfg["shapes"], seed=1000 * rank + r, norm=cfg["delta_norm"]).values())
                cpu0 = session_cpu_s(sid)
                barrier.wait(timeout=cfg["timeout"])
                lo0 = read_lo_tx()
                t0 = time.monotonic()
                averaged = peer.average(deltas, 1000, {"version": r, "tokens": 1000})
                t_allreduce = time.monotonic()
                if averaged is None or len(averaged.gathered) != n:
                    raise RuntimeError(f"round {r}: no group of {n} ({averaged!r})")
                problem = hs.trust_problem(averaged.deltas, deltas)
                if problem:
                    raise RuntimeError(problem)
                theta, momentum = outer_step(theta, momentum, dict(zip(names, averaged.deltas)), OuterSection())
                t1 = time.monotonic()
                lo1 = read_lo_tx()
                out.put(("round", rank, dict(round=r, t0=t0, t_allreduce=t0, t_step=t_allreduce, t1=t1,
                                             lo0=lo0, lo1=lo1, cpu_s=session_cpu_s(sid) - cpu0)))
        finally:
            peer.shutdown()
        out.put(("done", rank, None))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        report_failure(rank, barrier, out)


class Children:
    """Every process this benchmark started; each leads its own process group."""

    def __init__(self) -> None:
        self.procs: list[Any] = []  # mp.Process or subprocess.Popen

    def add(self, proc: Any) -> Any:
        self.procs.append(proc)
        return proc

    @staticmethod
    def _alive(proc: Any) -> bool:
        return proc.poll() is None if isinstance(proc, subprocess.Popen) else proc.is_alive()

    @staticmethod
    def _signal_group(proc: Any, sig: int) -> None:
        if proc.pid is None:
            return
        try:
            os.killpg(proc.pid, sig)  # the child and whatever it started (hivemind's p2pd, ...)
        except (ProcessLookupError, PermissionError):
            if Children._alive(proc):  # killed before it became a group leader
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM each group, wait up to ``grace_s``, then SIGKILL what is left."""
        procs, self.procs = self.procs, []
        for proc in procs:
            self._signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            left = max(0.05, deadline - time.monotonic())
            if isinstance(proc, subprocess.Popen):
                try:
                    proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    pass
            else:
                proc.join(timeout=left)
        for proc in procs:
            self._signal_group(proc, signal.SIGKILL)  # stragglers of the group, even if the leader is gone
            if isinstance(proc, subprocess.Popen):
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            else:
                proc.join(timeout=5)


CHILDREN = Children()


@dataclass
class Config:
    system: str  # "rcswarm" or "hivemind"
    codec: str
    workers: int
    rounds: list[dict[str, Any]] = field(default_factory=list)  # measured rounds, aggregated
    encode_s: list[float] = field(default_factory=list)
    error: str = ""
    setup_s: float = 0.0


def _log_tails(log_dir: Path, lines: int = 25) -> str:
    parts = []
    for path in sorted(log_dir.glob("*.log")):
        text = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {path.name} ---\n" + "\n".join(text))
    return "\n".join(parts)


def _collect(out: Any, config: Config, n: int, warmup: int, total: int, deadline: float, tick: Any) -> None:
    """Read worker messages until every rank is done; aggregate each round over the ranks."""
    per_round: dict[int, dict[int, dict[str, Any]]] = {}
    done: set[int] = set()
    while len(done) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{config.system} {config.codec} x{n}: not finished within the timeout")
        try:
            kind, rank, payload = out.get(timeout=min(left, 1.0))
        except queue_mod.Empty:
            continue
        if kind == "error":
            raise RuntimeError(f"{config.system} worker {rank} failed:\n{payload}")
        if kind == "done":
            done.add(rank)
        elif kind == "round":
            ranks = per_round.setdefault(payload["round"], {})
            ranks[rank] = payload
            if len(ranks) == n:
                tick()
    for r in range(warmup, total):
        ranks = per_round.get(r, {})
        if len(ranks) != n:
            raise RuntimeError(f"round {r}: results from {len(ranks)} of {n} workers")
        records = list(ranks.values())
        t0 = min(x["t0"] for x in records)
        lo0 = [x["lo0"] for x in records]
        lo1 = [x["lo1"] for x in records]
        agg: dict[str, Any] = {
            "seconds": max(x["t1"] for x in records) - t0,
            # CPU seconds of each worker/peer (its process session) in the round, and of the coordinator.
            "cpu_s": [x["cpu_s"] for x in records],
            "coordinator_cpu_s": next((x["coordinator_cpu_s"] for x in records if x.get("coordinator_cpu_s") is not None),
                                      0.0),
            "lo_bytes": (max(lo1) - min(lo0)) if None not in lo0 + lo1 else None,
        }
        if config.system.startswith("rcswarm"):
            agg.update(
                push_phase_s=max(x["t_push"] for x in records) - t0,
                pull_phase_s=max(x["t1"] for x in records) - max(x["t_await"] for x in records),
                push_bytes=sum(x["push_bytes"] for x in records),
                total_bytes=sum(x["sent"] + x["received"] for x in records),
                # The workers encode at once before the barrier: the slowest one's encode is the phase's length.
                encode_phase_s=max(x["encode_s"] for x in records),
            )
            config.encode_s.extend(x["encode_s"] for x in records)
        else:
            agg.update(allreduce_s=max(x["t1"] for x in records) - min(x["t_allreduce"] for x in records))
        config.rounds.append(agg)


def _wait_port(proc: subprocess.Popen, port_file: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.exists():
            return int(json.loads(port_file.read_text())["port"])
        if proc.poll() is not None:
            raise RuntimeError(f"the coordinator exited with code {proc.returncode} before serving")
        time.sleep(0.05)
    raise TimeoutError(f"the coordinator did not write {port_file} within {timeout:.0f}s")


RUN_TOML = """\
[run]
name = "syncbench"
rounds = 0
workers = {workers}

[model]
name = "lstm_lm"
preset = "{preset}"

[sync]
codec = "{codec}"
block_size = {block}
error_feedback = true
round_deadline_s = 3600.0
max_update_norm = 1e12

[coordinator]
lease_s = 3600.0
max_wait_s = 10.0
keep_checkpoints = 1
durable = {durable}
"""


def run_rcswarm(
    args: argparse.Namespace, ctx: Any, work: Path, shapes: list, n: int, codec: str, tick: Any, tls: bool = False,
    durable: bool = True,
) -> Config:
    config = Config("rcswarm+TLS" if tls else "rcswarm" if durable else "rcswarm, no fsync", codec, n)
    run_dir = work / f"rcswarm-{codec}-{n}{'-tls' if tls else ''}{'' if durable else '-nofsync'}"
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    (run_dir / "run.toml").write_text(RUN_TOML.format(
        workers=n, preset=args.preset, codec=codec, block=INT8_BLOCK, durable="true" if durable else "false"
    ))
    token = secrets.token_urlsafe(16)
    started = time.monotonic()
    deadline = started + args.timeout
    try:
        tls_args: list[str] = []
        tls_ca = ""
        if tls:
            from rcswarm.coordinator.tls import write_self_signed

            cert, key = write_self_signed(run_dir)
            tls_args, tls_ca = ["--tls-cert", str(cert), "--tls-key", str(key)], str(cert)
        with open(logs / "coordinator.log", "wb") as log:
            coordinator = CHILDREN.add(subprocess.Popen(
                [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(run_dir / "run.toml"),
                 "--state-dir", str(run_dir / "state"), "--port", "0", "--port-file", str(run_dir / "port.json"),
                 *tls_args],
                env={**os.environ, TOKEN_ENV: token}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            ))
        port = _wait_port(coordinator, run_dir / "port.json", min(START_TIMEOUT_S, args.timeout))
        barrier, out = ctx.Barrier(n), ctx.Queue()
        total = args.warmup + args.rounds
        for rank in range(n):
            cfg = dict(
                log=str(logs / f"worker-{rank}.log"), threads=args.threads, codec=codec, target=f"127.0.0.1:{port}",
                token=token, timeout=args.timeout, total_rounds=total, shapes=shapes, delta_norm=args.delta_norm,
                tls_ca=tls_ca, coordinator_sid=coordinator.pid,  # start_new_session: its own session
            )
            CHILDREN.add(ctx.Process(target=rcswarm_worker, args=(rank, cfg, barrier, out), daemon=False)).start()
        _wait_ready(out, n, deadline, config)
        config.setup_s = time.monotonic() - started
        _collect(out, config, n, args.warmup, total, deadline, tick)
    except Exception as exc:  # noqa: BLE001 - one failed configuration does not end the benchmark
        config.error = f"{type(exc).__name__}: {exc}\n{_log_tails(logs)}"
    finally:
        CHILDREN.stop_all()
    return config


def _wait_ready(out: Any, n: int, deadline: float, config: Config, extra: dict | None = None) -> None:
    ready: set[int] = set()
    while len(ready) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"only {len(ready)} of {n} {config.system} processes got ready")
        try:
            kind, rank, payload = out.get(timeout=min(left, 1.0))
        except queue_mod.Empty:
            continue
        if kind == "error":
            raise RuntimeError(f"{config.system} process {rank} failed while starting:\n{payload}")
        if kind == "ready":
            ready.add(rank)
        elif kind == "maddrs" and extra is not None:
            extra["maddrs"] = payload
            return


def run_hivemind(args: argparse.Namespace, ctx: Any, work: Path, shapes: list, n: int, tick: Any,
                 codec: str = "fp32", backend: bool = False) -> Config:
    """hivemind's averager alone, or (`backend`) rcswarm's hivemind backend with `codec`."""
    config = Config("hivemind backend" if backend else "hivemind", codec, n)
    logs = work / (f"backend-{codec}-{n}" if backend else f"hivemind-{n}") / "logs"
    logs.mkdir(parents=True)
    started = time.monotonic()
    deadline = started + args.timeout
    try:
        barrier, out = ctx.Barrier(n), ctx.Queue()
        total = args.warmup + args.rounds

        def start(rank: int, initial: list[str] | None) -> None:
            cfg = dict(
                log=str(logs / f"peer-{rank}.log"), threads=args.threads, timeout=args.timeout, total_rounds=total,
                shapes=shapes, delta_norm=args.delta_norm, workers=n, codec=codec,
            )
            target = backend_peer if backend else hivemind_peer
            peer = ctx.Process(target=target, args=(rank, cfg, initial, barrier, out), daemon=False)
            CHILDREN.add(peer).start()

        start(0, None)
        first: dict[str, Any] = {}
        _wait_ready(out, n, deadline, config, extra=first)  # returns once peer 0 published its address
        if "maddrs" not in first:
            raise RuntimeError("hivemind peer 0 did not publish its address")
        for rank in range(1, n):
            start(rank, first["maddrs"])
        _wait_ready(out, n, deadline, config)
        config.setup_s = time.monotonic() - started
        _collect(out, config, n, args.warmup, total, deadline, tick)
    except Exception as exc:  # noqa: BLE001
        config.error = f"{type(exc).__name__}: {exc}\n{_log_tails(logs)}"
    finally:
        CHILDREN.stop_all()
    return config


def time_coordinator_steps(args: argparse.Namespace, work: Path, n: int) -> dict[str, list[float]]:
    """The coordinator's close of a round, piece by piece, in this process (same code paths)."""
    import torch

    from rcswarm.config.runspec import OuterSection
    from rcswarm.models import registry
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from rcswarm.state.records import RoundRecord
    from rcswarm.state.store import StateStore
    from rcswarm.sync import outer, tensor_stream

    model = registry.build_model("lstm_lm", args.preset, seed=0)
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    momentum = {k: torch.zeros_like(v) for k, v in params.items()}
    shapes = [(k, tuple(v.shape)) for k, v in params.items()]
    updates = [(1000, random_tensors(shapes, seed=i, norm=args.delta_norm)) for i in range(n)]
    store = StateStore(work / "commit-timing", keep_checkpoints=1)
    times: dict[str, list[float]] = {"average+outer": [], "sha256": [], "commit_version": [], "pull payload": []}
    try:
        for rep in range(args.commit_reps):
            t = time.perf_counter()
            average = outer.weighted_average(updates)
            new_params, new_momentum = outer.outer_step(params, momentum, average, OuterSection())
            times["average+outer"].append(time.perf_counter() - t)
            t = time.perf_counter()
            digest = tensor_stream.params_sha256(new_params)
            times["sha256"].append(time.perf_counter() - t)
            record = RoundRecord(rep, 0.0, 0.0, n, 1000 * n, "bench", 0.0, digest.hex())
            t = time.perf_counter()
            store.commit_version("syncbench", rep + 1, new_params, {"outer_momentum": new_momentum}, record)
            times["commit_version"].append(time.perf_counter() - t)
            t = time.perf_counter()
            tensor_stream.build_payload(new_params, codec=pb.CODEC_FP32, run_id="syncbench", version=rep + 1,
                                        content_sha256=digest)
            times["pull payload"].append(time.perf_counter() - t)
    finally:
        store.close()
    return times


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _stats(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:,.2f}"


def _sec(values: list[float]) -> str:
    med, lo, hi = _stats(values)
    return f"{med:.3f} [{lo:.3f}–{hi:.3f}]"


def build_tables(
    configs: list[Config], n_params: int, coordinator_times: dict[int, dict[str, list[float]]]
) -> list[Any]:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    fp32_push: dict[int, float] = {}
    for c in configs:
        if c.system == "rcswarm" and c.codec == "fp32" and c.rounds:  # the ratio's base is plain gRPC
            fp32_push[c.workers] = statistics.median(r["push_bytes"] for r in c.rounds)

    main = Table(title=f"One sync round, {n_params:,} float32 parameters ({n_params * 4 / 1e6:.2f} MB) — "
                       + escape("median [min–max] over measured rounds"), box=box.ASCII2)
    for col, justify in [("system", "left"), ("codec", "left"), ("workers", "right"), ("s / round", "right"),
                         ("with encode ‡", "right"), ("push MB / round", "right"), ("push ratio vs fp32", "right"),
                         ("sent+recv MB / round", "right"), ("loopback MB / round", "right"),
                         ("MB / peer / round", "right")]:
        main.add_column(col, justify=justify)
    for c in configs:
        codec = "fp32 (none)" if c.system == "hivemind" else c.codec
        if c.error:
            main.add_row(c.system, codec, str(c.workers), "FAILED", "", "", "", "", "", "")
            continue
        lo_values = [r["lo_bytes"] for r in c.rounds if r["lo_bytes"] is not None]
        lo = statistics.median(lo_values) if lo_values else None
        seconds = _sec([r["seconds"] for r in c.rounds])
        if c.system.startswith("rcswarm"):
            push = statistics.median(r["push_bytes"] for r in c.rounds)
            ratio = f"{push / fp32_push[c.workers]:.4f}" if c.workers in fp32_push else "n/a"
            total = statistics.median(r["total_bytes"] for r in c.rounds)
            with_encode = _sec([r["seconds"] + r["encode_phase_s"] for r in c.rounds])
            main.add_row(c.system, c.codec, str(c.workers), seconds, with_encode, _mb(push), ratio, _mb(total),
                         _mb(lo), _mb(total / c.workers))
        else:
            payload = n_params * 4 * c.workers
            star = "" if c.system == "hivemind" else "(fp32) "
            main.add_row(c.system, codec, str(c.workers), seconds, seconds, f"{star}{_mb(payload)}*", "",
                         f"{star}{_mb(payload)}*", _mb(lo), f"{_mb(lo / c.workers)}†" if lo is not None else "n/a")

    phases = Table(title=escape("Where the time goes — median [min–max] seconds"), box=box.ASCII2)
    for col in ("system", "codec", "workers", "encode+payload (per worker, before round)", "push + close round",
                "await + pull", "pull", "all-reduce (hivemind)", "start-up"):
        phases.add_column(col, justify="left" if col in ("system", "codec") else "right")
    for c in configs:
        if c.error or not c.rounds:
            continue
        if c.system.startswith("rcswarm"):
            rest = [r["seconds"] - r["push_phase_s"] for r in c.rounds]
            phases.add_row(c.system, c.codec, str(c.workers), _sec(c.encode_s),
                           _sec([r["push_phase_s"] for r in c.rounds]), _sec(rest),
                           _sec([r["pull_phase_s"] for r in c.rounds]), "", f"{c.setup_s:.1f}")
        else:
            phases.add_row(c.system, "fp32 (none)" if c.system == "hivemind" else c.codec, str(c.workers), "", "", "",
                           "", _sec([r["allreduce_s"] for r in c.rounds]), f"{c.setup_s:.1f}")

    cpu = Table(title=escape("CPU seconds per round (user + system, each process group: a worker, a peer with its "
                             "DHT, averager and p2pd, the coordinator) — median [min–max] over measured rounds"),
                box=box.ASCII2)
    for col in ("system", "codec", "workers", "coordinator", "busiest worker / peer", "all processes",
                "busiest machine ¶"):
        cpu.add_column(col, justify="left" if col in ("system", "codec") else "right")
    for c in configs:
        if c.error or not c.rounds:
            continue
        coordinator = [r["coordinator_cpu_s"] for r in c.rounds]
        busiest_peer = [max(r["cpu_s"]) for r in c.rounds]
        every = [sum(r["cpu_s"]) + r["coordinator_cpu_s"] for r in c.rounds]
        machine = [max(a, b) for a, b in zip(coordinator, busiest_peer)]
        cpu.add_row(c.system, "fp32 (none)" if c.system == "hivemind" else c.codec, str(c.workers),
                    _sec(coordinator) if c.system.startswith("rcswarm") else "–", _sec(busiest_peer), _sec(every),
                    _sec(machine))

    tables = [main, phases, cpu]
    if coordinator_times:
        close = Table(title=escape("Coordinator close-round pieces, timed in-process — median [min–max] seconds"),
                      box=box.ASCII2)
        close.add_column("workers", justify="right")
        keys = list(next(iter(coordinator_times.values())))
        for key in keys:
            close.add_column(key, justify="right")
        for n, times in coordinator_times.items():
            close.add_row(str(n), *(_sec(times[k]) for k in keys))
        tables.append(close)
    return tables


def write_json(path: Path | None, hivemind_version: str | None, wall_s: float, sizes: dict[str, tuple[list, int]],
               results: dict[str, tuple[list[Config], dict[int, dict[str, list[float]]]]]) -> None:
    """The raw per-round results of the presets done so far (nothing without --json)."""
    if path is None:
        return
    path.write_text(json.dumps({
        "hivemind": hivemind_version, "wall_s": wall_s,
        "presets": {preset: {"n_params": sizes[preset][1], "configs": [asdict(c) for c in configs],
                             "coordinator_times": times} for preset, (configs, times) in results.items()},
    }, indent=1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Benchmark one rcswarm sync round against hivemind's averager.")
    p.add_argument("--workers", type=int, nargs="+", default=None, help="worker counts (default: 2 4)")
    p.add_argument("--rounds", type=int, default=None, help="measured rounds per configuration (default: 10)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default: 1)")
    p.add_argument("--codecs", nargs="+", default=["fp32", "bf16", "int8"], choices=["fp32", "bf16", "int8"])
    p.add_argument("--preset", nargs="+", default=None,
                   help="lstm_lm presets whose parameter shapes are used, one set of tables each (default: base10m)")
    p.add_argument("--backend-codecs", nargs="*", default=None, choices=["fp32", "bf16", "int8"],
                   help="codecs of rcswarm's hivemind backend (sync.backend = \"hivemind\") to run "
                        "(default: those of --codecs; give the flag alone for none)")
    p.add_argument("--tls-codecs", nargs="*", default=["fp32"], choices=["fp32", "bf16", "int8"],
                   help="codecs to run a second time over TLS, as hivemind's libp2p traffic is encrypted "
                        "(default: fp32; give the flag alone for none)")
    p.add_argument("--no-fsync-codecs", nargs="*", default=["fp32", "int8"], choices=["fp32", "bf16", "int8"],
                   help="codecs to run a second time with [coordinator] durable = false (no fsync of each "
                        "version; hivemind persists nothing) (default: fp32 int8; give the flag alone for none)")
    p.add_argument("--no-hivemind", action="store_true", help="skip the hivemind comparison")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny preset, 2 workers, 1 round")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker/peer process (default: 1)")
    p.add_argument("--delta-norm", type=float, default=1.0, help="global L2 norm of each random pseudo-gradient")
    p.add_argument("--commit-reps", type=int, default=5, help="repetitions of the in-process coordinator timings")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one configuration may take (default: 300)")
    p.add_argument("--json", type=Path, help="also write the raw per-round results here")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (state dirs, logs)")
    args = p.parse_args(argv)
    if args.quick:
        args.preset = args.preset or ["tiny"]
        args.rounds = args.rounds or 1
        args.workers = args.workers or [2]
        args.commit_reps = 1
    args.presets = args.preset or ["base10m"]
    args.backend_codecs = args.codecs if args.backend_codecs is None else args.backend_codecs
    args.rounds = args.rounds or 10
    args.workers = args.workers or [2, 4]
    if args.rounds < 1 or args.warmup < 0 or any(n < 2 for n in args.workers):
        p.error("need --rounds >= 1, --warmup >= 0 and at least 2 workers per configuration")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(width=None if sys.stdout.isatty() else 200)
    err_console = Console(stderr=True)

    from rcswarm.models import registry

    sizes: dict[str, tuple[list, int]] = {}
    for preset in args.presets:
        model = registry.build_model("lstm_lm", preset)
        sizes[preset] = ([(name, tuple(p.shape)) for name, p in model.named_parameters()],
                         sum(p.numel() for p in model.parameters()))
        del model
    hivemind_version = None
    if not args.no_hivemind:
        try:
            from importlib.metadata import version

            hivemind_version = version("hivemind")
        except Exception:  # noqa: BLE001
            err_console.print("[yellow]hivemind is not installed (pip install -e '.[bench]'); skipping it[/]")
            args.no_hivemind = True

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    atexit.register(CHILDREN.stop_all)
    ctx = mp.get_context("spawn")
    work = Path(tempfile.mkdtemp(prefix="rcswarm-syncbench-"))
    plan: list[tuple[str, int, str]] = []
    for n in args.workers:
        plan += [("rcswarm", n, codec) for codec in args.codecs]
        plan += [("rcswarm+TLS", n, codec) for codec in args.tls_codecs]
        plan += [("rcswarm, no fsync", n, codec) for codec in args.no_fsync_codecs]
        if not args.no_hivemind:
            plan.append(("hivemind", n, "fp32"))
            plan += [("hivemind backend", n, codec) for codec in args.backend_codecs]
    total_rounds = len(args.presets) * (len(plan) * (args.warmup + args.rounds) + len(args.workers))
    results: dict[str, tuple[list[Config], dict[int, dict[str, list[float]]]]] = {}
    wall = time.monotonic()
    console.print(
        f"sync_bench: lstm_lm {', '.join(f'{k} ({v[1]:,} params)' for k, v in sizes.items())}; workers {args.workers}; "
        f"codecs {args.codecs}; hivemind backend codecs {args.backend_codecs}; "
        f"{args.warmup} warm-up + {args.rounds} measured rounds; hivemind "
        f"{hivemind_version or 'skipped'}; {os.cpu_count()} CPUs; load average {_loadavg()}; work dir {work}"
    )
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console, transient=False) as progress:
            task = progress.add_task("rounds", total=total_rounds)
            for preset, (shapes, n_params) in sizes.items():
                args.preset = preset
                preset_dir = work / preset  # each preset's configurations in their own directories
                preset_dir.mkdir()
                configs: list[Config] = []
                coordinator_times: dict[int, dict[str, list[float]]] = {}
                results[preset] = (configs, coordinator_times)
                for n in args.workers:
                    progress.update(task, description=f"{preset}: coordinator pieces x{n}")
                    # In a child process: its N full-size updates would otherwise stay in this process's heap
                    # while the peers run (at 8 x 50 M, 3 GB the peers need).
                    with ctx.Pool(1) as pool:
                        coordinator_times[n] = pool.apply(time_coordinator_steps, (args, preset_dir, n))
                    progress.advance(task)
                for system, n, codec in plan:
                    progress.update(task, description=f"{preset}: {system} {codec} x{n}")
                    tick = lambda: progress.advance(task)  # noqa: E731
                    if system.startswith("rcswarm"):
                        config = run_rcswarm(
                            args, ctx, preset_dir, shapes, n, codec, tick, tls=system == "rcswarm+TLS",
                            durable=system != "rcswarm, no fsync",
                        )
                    else:
                        config = run_hivemind(args, ctx, preset_dir, shapes, n, tick, codec,
                                              backend=system == "hivemind backend")
                    if config.error:
                        err_console.print(f"[red]{preset}: {system} {codec} x{n} failed:[/]\n{config.error}")
                    configs.append(config)
                # Each preset's tables as soon as it is done (a later failure or Ctrl-C keeps them), and the JSON.
                for table in build_tables(configs, n_params, coordinator_times):
                    console.print(table)
                write_json(args.json, hivemind_version, time.monotonic() - wall, sizes, results)
    except KeyboardInterrupt:
        err_console.print("[red]interrupted; stopping child processes[/]")
        CHILDREN.stop_all()
        return 130
    finally:
        CHILDREN.stop_all()
        if args.keep:
            err_console.print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - wall
    notes = [
        "s / round: first worker leaving the barrier → last worker holding the new version (rcswarm: push, "
        "await_version, pull, with the coordinator's average, outer step and persisted checkpoint inside; "
        "hivemind: averager.step(), matchmaking included). Payload encoding happens before the barrier.",
        "push / sent+recv MB: protobuf message bytes counted by CoordinatorClient, summed over workers. "
        "A worker holding the previous version pulls the compressed outer step (the run codec); others pull fp32 parameters.",
        f"* hivemind exposes no byte counters: its column shows the payload, n_params*4 bytes per peer "
        f"(a butterfly all-reduce sends 2(N-1)/N of it per peer). hivemind {hivemind_version or 'n/a'}.",
        "loopback MB: growth of the lo interface's tx bytes during the round (all framing included; "
        "other loopback traffic on the machine would be counted too).",
        "‡ with encode: for the coordinator rows, s / round plus the slowest worker's encode of its push in that "
        "round (the workers encode at once, before the barrier); the hivemind rows compress inside the round, "
        "so the column repeats s / round: from each peer's Δ in hand to θ_{v+1} in hand, in both.",
        "¶ busiest machine: with one machine per process group (each peer, each worker, the coordinator on a box "
        "of its own), no round can take less CPU time than this on one core: the coordinator's for the coordinator "
        "rows (its close grows with N), the busiest peer's for the hivemind rows. Worker CPU includes its encode.",
        "MB / peer / round: sent+recv per worker for the coordinator rows (a worker's push and pull); † for the "
        "hivemind rows, loopback MB / N (every peer is on this machine: what one peer sends).",
        "hivemind backend: rcswarm's sync.backend = \"hivemind\" (worker/hivemind_sync.py): HivemindPeer.average "
        "with the run's codec (rcswarm's codecs as hivemind compression), the trust check and the shared outer "
        "step; min_group_size = target_group_size = N (as the hivemind row).",
        "rcswarm+TLS: the same round with the coordinator serving TLS (self-signed P-256 certificate); "
        "hivemind's libp2p connections are encrypted (TLS 1.3) by default, plain rcswarm rows are not.",
        f"int8 payload/fp32 payload = (1 + 4/{INT8_BLOCK})/4 = {(1 + 4 / INT8_BLOCK) / 4:.4f} (one float32 scale per "
        f"{INT8_BLOCK} values).",
    ]
    for note in notes:
        console.print(f"- {note}")
    console.print(f"total wall time {elapsed:.0f}s; load average at the end {_loadavg()}")
    return 1 if any(c.error for configs, _ in results.values() for c in configs) else 0


if __name__ == "__main__":
    sys.exit(main())
