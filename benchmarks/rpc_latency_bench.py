"""Latency of a member's unary calls on a real coordinator, idle and under a flood of half-sent calls.

    python benchmarks/rpc_latency_bench.py                   # 1,000 Heartbeats, 200 GetStatus calls per phase
    python benchmarks/rpc_latency_bench.py --calls 200       # fewer

A real coordinator (`SwarmCoordinator` behind `RunningCoordinator`, the tiny LSTM, gRPC on 127.0.0.1) and one
member that joined it. Each phase times `--calls` Heartbeats (the call a member makes most) and a fifth as many
GetStatus calls (the operator's), one after another on one channel, and prints their median, p90, p99 and max in
milliseconds and the calls per second (each method's calls stop after PHASE_S). Phases: `idle`; `flood`, with as
many header-only calls (their request message never sent, no token: half GetStatus without a deadline, half
Heartbeat with 60 s) as the server has threads plus 50 held open on connections of their own. This measures what serving unary methods as
request-streaming with a bound on the calls waiting for their message (coordinator/guards.py, `FirstMessages`)
costs an honest call, and what it buys under the flood: run it on the code before that change for the reference
(docs/PERFORMANCE.md). Every call has a deadline; a call that fails is counted, not retried.
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
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS
from rcswarm.state.store import StateStore

TOKEN = "bench-token-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SERVICE = "rcswarm.v1.Coordinator"
CALL_TIMEOUT_S = 10.0
CALLS_PER_CHANNEL = 50  # half-sent calls per connection
HOLD_S = 300.0  # the longest a half-sent call is held open
PHASE_S = 60.0  # each method's calls in a phase stop after this long (calls that time out take CALL_TIMEOUT_S each)


def spec() -> RunSpec:
    return RunSpec.from_dict({
        "run": {"name": "bench", "rounds": 3, "workers": 1},
        "model": {"name": "lstm_lm", "preset": "tiny"},
        "data": {"seq_len": 32, "batch_size": 4, "max_bytes": 2_000_000},
        "inner": {"steps": 5, "lr": 1e-2},
        "coordinator": {"lease_s": 600.0},
    })


class HalfSent:
    """Header-only calls on connections of their own (CALLS_PER_CHANNEL each), each holding its request back for at
    most `hold_s`; `close` ends them (tests/coordinator/test_half_sent_calls.py uses it too)."""

    def __init__(self, target: str, hold_s: float = HOLD_S) -> None:
        self.target, self.hold_s, self.release = target, hold_s, threading.Event()
        self.channels: list[grpc.Channel] = []
        self.calls: list[grpc.Future] = []

    def _never(self) -> Iterator[bytes]:
        """A request iterator that sends nothing until released (at most `hold_s`)."""
        self.release.wait(self.hold_s)
        yield from ()

    def open(self, method: str, count: int, timeout: float | None = None) -> None:
        """`count` half-sent calls of `method` (a full path), without metadata, with `timeout` or no deadline."""
        for _ in range(count):
            if len(self.calls) % CALLS_PER_CHANNEL == 0:
                self.channels.append(grpc.insecure_channel(self.target, options=[("grpc.use_local_subchannel_pool", 1)]))
            call = self.channels[-1].stream_unary(method, request_serializer=bytes, response_deserializer=bytes)
            self.calls.append(call.future(self._never(), timeout=timeout))

    def codes(self, within_s: float) -> Counter:
        """The status codes the calls ended with, each waited for at most until `within_s` from now ("open" if not)."""
        deadline = time.monotonic() + within_s
        codes: Counter = Counter()
        for call in self.calls:
            try:
                error = call.exception(timeout=max(deadline - time.monotonic(), 0.01))
            except grpc.FutureTimeoutError:
                codes["open"] += 1
                continue
            codes[error.code() if error is not None else "answered"] += 1
        return codes

    def close(self) -> None:
        self.release.set()
        for call in self.calls:
            call.cancel()
        for channel in self.channels:
            channel.close()


def timings(call: Callable[[], object], count: int) -> tuple[list[float], int]:
    """Seconds of each of `count` calls made one after another (those begun within PHASE_S), and how many failed."""
    seconds, failed = [], 0
    end = time.monotonic() + PHASE_S
    for _ in range(count):
        if time.monotonic() > end:
            break
        started = time.perf_counter()
        try:
            call()
        except grpc.RpcError:
            failed += 1
        seconds.append(time.perf_counter() - started)
    return seconds, failed


def row(phase: str, name: str, seconds: list[float], failed: int) -> str:
    ordered = sorted(seconds)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3  # noqa: E731
    return (f"{phase:<6} {name:<10} {len(seconds):>6} {failed:>6} {statistics.median(seconds) * 1e3:>8.2f} "
            f"{pick(0.9):>8.2f} {pick(0.99):>8.2f} {ordered[-1] * 1e3:>8.2f} {len(seconds) / sum(seconds):>9.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="Heartbeats per phase (GetStatus: a fifth)")
    args = parser.parse_args()
    if args.calls < 5:
        parser.error(f"--calls {args.calls}: expected >= 5")
    with tempfile.TemporaryDirectory(prefix="rcswarm-rpc-bench-") as work:
        running = RunningCoordinator(SwarmCoordinator(spec(), StateStore(Path(work) / "state")), TOKEN).start()
        channel = grpc.insecure_channel(f"127.0.0.1:{running.port}", options=MESSAGE_SIZE_OPTIONS)
        flood = HalfSent(f"127.0.0.1:{running.port}")
        try:
            stub = pb_grpc.CoordinatorStub(channel)
            member = stub.Join(pb.JoinRequest(worker_name="bench", device="cpu", pid=os.getpid()),
                               timeout=CALL_TIMEOUT_S, metadata=AUTH)
            beat = pb.HeartbeatRequest(worker_id=member.worker_id, worker_secret=member.worker_secret)
            calls = {
                "Heartbeat": (lambda: stub.Heartbeat(beat, timeout=CALL_TIMEOUT_S, metadata=AUTH), args.calls),
                "GetStatus": (lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=CALL_TIMEOUT_S, metadata=AUTH),
                              max(1, args.calls // 5)),
            }
            count = running.limits.threads + 50
            print(f"python {platform.python_version()}, grpcio {grpc.__version__}, {os.cpu_count()} CPUs; "
                  f"flood: {count} half-sent calls", flush=True)
            print(f"{'phase':<6} {'call':<10} {'calls':>6} {'failed':>6} {'median':>8} {'p90':>8} {'p99':>8} "
                  f"{'max':>8} {'calls/s':>9}   (ms)")
            for phase in ("idle", "flood"):
                if phase == "flood":
                    flood.open(f"/{SERVICE}/GetStatus", count // 2)
                    flood.open(f"/{SERVICE}/Heartbeat", count - count // 2, 60.0)
                    time.sleep(1.0)
                for name, (call, n) in calls.items():
                    timings(call, 1)  # warm: the first call of a channel or a method pays for more than the call
                    print(row(phase, name, *timings(call, n)), flush=True)
        finally:
            flood.close()
            channel.close()
            running.stop(grace=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
