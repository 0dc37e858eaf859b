"""Heartbeat latency while rounds of a large model close back to back, and the close split into its pieces.

    python benchmarks/round_close_bench.py                       # 10 M and 100 M parameters, 2 workers, 4 rounds
    python benchmarks/round_close_bench.py --sizes 10m --rounds 3 --workers 4
    python benchmarks/round_close_bench.py --sizes 100m --rounds 3 --warmup 3   # steady state: recycled checkpoint files
    python benchmarks/round_close_bench.py --quick               # smoke run: ~1 M parameters, 2 rounds

A real coordinator (`SwarmCoordinator` behind `RunningCoordinator`, gRPC on 127.0.0.1, a fresh
state dir, `[sync] codec` int8 by default, `[coordinator] durable = true`) serves the residual
LSTM LM at the chosen size. N worker threads in this process speak the real wire with raw stubs:
each joins and pulls once, then every round pushes a pseudo-gradient (random, global L2 norm 1,
encoded once with the run's codec before the first round) and long-polls AwaitVersion for the
next version; the last push of a round makes the close due, so rounds close back to back. A
heartbeat thread on its own channel renews the first worker's lease every `--beat-ms` (as a worker's
heartbeat thread does beside its main thread) and times each call;
a beat counts as "during a close" when the coordinator reported a close under way as it was sent.
The close's pieces are the coordinator's own measurement of every close (`last_close_seconds`):
average (with each held update's decode), norm, outer step, compressed step, commit, norm bound and
step payload; the commit's own pieces (`StateStore.last_commit_seconds`, indented: the checkpoint
written with the parameters' digest in the same pass, the fsyncs, the SQLite transaction, which also
holds the reference norms and the flag events, and the rest of the commit piece: reading the digest back,
and on older code the reference norms and events in their own transactions) are shown under it and not
counted twice in the total. The full fp32 pull payload is built by a version's first
full pull, not by the close: the table's last row times one such pull of the last version (build and
transfer). `--warmup N` runs N rounds first without measuring them (beats included).

Before/after in one run: the script runs against whichever rcswarm is on PYTHONPATH, so pointing it at
a checkout of main (a directory holding an `rcswarm` symlink to it) gives the baseline with the same
command; a baseline without the commit's sub-pieces shows its "digest" and "commit" pieces instead.

The coordinator shares this process (and its GIL) with the worker threads, as it shares a host
with its gRPC threads in production; torch runs `--threads` intra-op threads (default 1).
Every call has a deadline and every wait a timeout; the benchmark is not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS
from rcswarm.state.store import StateStore
from rcswarm.sync import codec as codecs
from rcswarm.sync import tensor_stream

TOKEN = "round-close-bench-token"
# d_model of the 3-layer residual LSTM LM at each size (parameter counts printed by the run).
SIZES = {"1m": 160, "10m": 448, "50m": 1020, "100m": 1440}


@dataclass
class Beats:
    """Heartbeat latencies in seconds, split by whether a close was under way when the beat was sent."""

    during_close: list[float] = field(default_factory=list)
    otherwise: list[float] = field(default_factory=list)


@dataclass
class SizeResult:
    """One size's measurements."""

    size: str
    params: int
    round_seconds: list[float]
    pieces: list[dict[str, float]]
    beats: Beats
    # Seconds of the first full pull of the last version, which builds its fp32 payload.
    first_full_pull: float = float("nan")


class Wire:
    """Raw stubs of the Coordinator service with the token and a deadline on every call."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target, options=MESSAGE_SIZE_OPTIONS)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.metadata = (("authorization", f"Bearer {TOKEN}"),)

    def call(self, method: str, request: object, timeout: float) -> object:
        return getattr(self.stub, method)(request, timeout=timeout, metadata=self.metadata)

    def pull(self, member: pb.JoinResponse, timeout: float) -> pb.TensorHeader:
        request = pb.PullParametersRequest(worker_id=member.worker_id, worker_secret=member.worker_secret)
        responses = self.stub.PullParameters(request, timeout=timeout, metadata=self.metadata)
        header = None
        for response in responses:
            header = header or response.header
        return header


def spec_for(size: str, codec: str, workers: int) -> RunSpec:
    """A run of the LSTM LM at `size` that waits for every worker and never finishes on its own."""
    return RunSpec.from_dict({
        "run": {"name": f"bench-{size}", "rounds": 0, "workers": workers},
        "model": {"name": "lstm_lm", "preset": "base10m", "overrides": {"d_model": SIZES[size], "n_layers": 3}},
        "sync": {"codec": codec, "round_deadline_s": 600.0, "min_reports": workers},
        "coordinator": {"lease_s": 600.0, "max_wait_s": 60.0, "durable": True},
    })


def encoded_update(header: pb.TensorHeader, codec: int, block: int, seed: int) -> tuple[pb.TensorHeader, list[pb.TensorChunk]]:
    """A random pseudo-gradient of global L2 norm 1 over the pull header's tensors, encoded with `codec`."""
    generator = torch.Generator().manual_seed(seed)
    deltas = {t.name: torch.randn(tuple(t.shape), generator=generator) for t in header.tensors}  # [*shape] each
    scale = 1.0 / tensor_stream.global_norm(deltas)
    deltas = {name: d.mul_(scale) for name, d in deltas.items()}
    encoded = {name: codecs.encode(d, codec, block) for name, d in deltas.items()}
    return tensor_stream.build_payload(deltas, codec=codec, run_id=header.run_id, version=0, block_size=block,
                                       encoded=encoded)


def worker_loop(wire: Wire, member: pb.JoinResponse, update: tuple[pb.TensorHeader, list[pb.TensorChunk]], rounds: int,
                start: threading.Barrier, timeout: float, errors: list[BaseException]) -> None:
    """Push for the current version and wait for the next, `rounds` times."""
    template, chunks = update
    try:
        start.wait(timeout=timeout)
        for version in range(rounds):
            header = pb.TensorHeader()
            header.CopyFrom(template)
            header.version = version
            meta = pb.UpdateMeta(worker_id=member.worker_id, worker_secret=member.worker_secret, base_version=version,
                                 tokens=1000)
            messages = [pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=header),
                        *(pb.PushUpdateRequest(chunk=c) for c in chunks)]
            wire.call("PushUpdate", iter(messages), timeout=timeout)
            deadline = time.monotonic() + timeout
            reached = version
            while reached < version + 1 and time.monotonic() < deadline:
                request = pb.AwaitVersionRequest(worker_id=member.worker_id, worker_secret=member.worker_secret,
                                                 min_version=version + 1, wait_ms=10_000)
                reached = wire.call("AwaitVersion", request, timeout=15.0).version
            if reached < version + 1:
                raise TimeoutError(f"{member.worker_id}: version {version + 1} not reached within {timeout:.0f}s")
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def beat_loop(wire: Wire, member: pb.JoinResponse, coordinator: SwarmCoordinator, beat_s: float, stop: threading.Event,
              beats: Beats, errors: list[BaseException]) -> None:
    """Heartbeat every `beat_s` until `stop`, timing each call."""
    try:
        while not stop.wait(beat_s):
            closing = coordinator.closing
            started = time.perf_counter()
            beat = pb.HeartbeatRequest(worker_id=member.worker_id, worker_secret=member.worker_secret)
            wire.call("Heartbeat", beat, timeout=30.0)
            (beats.during_close if closing else beats.otherwise).append(time.perf_counter() - started)
    except BaseException as exc:
        errors.append(exc)


def close_pieces(coordinator: SwarmCoordinator) -> dict[str, float]:
    """The last close's pieces, the commit's own pieces (indented) right under the commit, and what the
    commit piece spent besides `commit_version` (on older code: the reference norms and events, in their own
    transactions)."""
    commit = dict(getattr(coordinator.store, "last_commit_seconds", {}))
    pieces: dict[str, float] = {}
    for name, seconds in coordinator.last_close_seconds.items():
        pieces[name] = seconds
        if name == "commit" and commit:
            pieces.update({f"  {piece}": t for piece, t in commit.items()})
            pieces["  rest of commit"] = seconds - sum(commit.values())
    return pieces


def run_size(args: argparse.Namespace, size: str, work: Path) -> SizeResult:
    """Serve one size, run the rounds back to back, and collect the measurements."""
    spec = spec_for(size, args.codec, args.workers)
    coordinator = SwarmCoordinator(spec, StateStore(work / size, durable=True))
    params = sum(t.numel() for t in coordinator.params.values())
    running = RunningCoordinator(coordinator, TOKEN).start()
    wire = Wire(f"127.0.0.1:{running.port}")
    beat_wire = Wire(f"127.0.0.1:{running.port}")
    stop, errors, beats = threading.Event(), [], Beats()
    try:
        members = [wire.call("Join", pb.JoinRequest(worker_name=f"w{i}", device="cpu", pid=1), timeout=30)
                   for i in range(args.workers)]
        header = None
        for member in members:
            header = wire.pull(member, timeout=args.timeout)
        codec, block = codecs.codec_from_name(args.codec), spec.sync.block_size
        updates = [encoded_update(header, codec, block, seed) for seed in range(args.workers)]
        start = threading.Barrier(args.workers + 1)
        threads = [threading.Thread(target=worker_loop, args=(wire, member, update, args.warmup + args.rounds, start,
                                                              args.timeout, errors),
                                    daemon=True) for member, update in zip(members, updates, strict=True)]
        beat_thread = threading.Thread(target=beat_loop, args=(beat_wire, members[0], coordinator, args.beat_ms / 1000, stop,
                                                               beats, errors), daemon=True)
        for thread in threads:
            thread.start()
        beat_thread.start()
        pieces, round_seconds = [], []
        start.wait(timeout=args.timeout)
        for version in range(1, args.warmup + args.rounds + 1):
            round_started = time.perf_counter()
            deadline = round_started + args.timeout
            while coordinator.version < version and not errors and time.perf_counter() < deadline:
                time.sleep(0.005)
            if coordinator.version < version:
                raise RuntimeError(f"round {version - 1} did not close: {errors or 'timed out'}")
            if version <= args.warmup:
                beats.during_close.clear()
                beats.otherwise.clear()
                continue
            round_seconds.append(time.perf_counter() - round_started)
            pieces.append(close_pieces(coordinator))
        for thread in threads:
            thread.join(timeout=args.timeout)
        if errors:
            raise RuntimeError(f"a benchmark thread failed: {errors[0]!r}")
        started = time.perf_counter()
        wire.pull(members[0], timeout=args.timeout)
        return SizeResult(size, params, round_seconds, pieces, beats, time.perf_counter() - started)
    finally:
        stop.set()
        wire.channel.close()
        beat_wire.channel.close()
        running.stop(grace=1.0)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; NaN without values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def print_tables(results: list[SizeResult], args: argparse.Namespace) -> None:
    """The heartbeat table and the close's pieces, one column per size."""
    print(f"\ncodec {args.codec}, {args.workers} workers, {args.rounds} rounds after {args.warmup} unmeasured, "
          f"beat every {args.beat_ms} ms, "
          f"{torch.get_num_threads()} torch thread(s)")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, torch {torch.__version__}")
    print(f"{'size':>6} {'params':>12} {'round s':>8} {'beats':>6} {'in close':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'close p99':>9}")
    for r in results:
        every = r.beats.during_close + r.beats.otherwise
        print(f"{r.size:>6} {r.params:>12,} {statistics.mean(r.round_seconds):>8.2f} {len(every):>6} "
              f"{len(r.beats.during_close):>8} {1000 * percentile(every, 50):>8.2f} {1000 * percentile(every, 99):>8.2f} "
              f"{1000 * max(every, default=float('nan')):>8.2f} {1000 * percentile(r.beats.during_close, 99):>9.2f}")
    names = list(dict.fromkeys(name for r in results for p in r.pieces for name in p))
    print("\nclose pieces, mean seconds per round")
    print(f"{'piece':>20} " + " ".join(f"{r.size:>9}" for r in results))
    for name in [*names, "total"]:
        cells = []
        for r in results:
            per_round = [sum(t for piece, t in p.items() if not piece.startswith(" ")) if name == "total"
                         else p.get(name, 0.0) for p in r.pieces]
            cells.append(f"{statistics.mean(per_round):>9.3f}")
        print(f"{name:>20} " + " ".join(cells))
    print(f"{'first full pull':>20} " + " ".join(f"{r.first_full_pull:>9.3f}" for r in results))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["10m", "100m"], choices=sorted(SIZES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4, help="rounds measured (default 4)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="rounds run first and not measured (default 0): a coordinator's first closes write new "
                             "checkpoint files, later ones overwrite the pruned one in place")
    parser.add_argument("--codec", default="int8", choices=["fp32", "bf16", "int8"])
    parser.add_argument("--beat-ms", type=float, default=10.0, help="milliseconds between heartbeats (default 10)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds any one wait may take (default 300)")
    parser.add_argument("--quick", action="store_true", help="~1 M parameters, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.rounds = ["1m"], 2
    if args.workers < 1 or args.rounds < 1 or args.warmup < 0 or args.beat_ms <= 0 or args.threads < 1 or args.timeout <= 0:
        parser.error("--workers, --rounds, --threads need >= 1; --warmup >= 0; --beat-ms and --timeout > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory(prefix="round-close-bench-") as work:
        for size in args.sizes:
            print(f"{size}: serving, {args.rounds} rounds ...", flush=True)
            results.append(run_size(args, size, Path(work)))
    print_tables(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
