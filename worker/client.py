"""The worker's gRPC client of the coordinator: deadlines, token metadata, and retries.

Every call carries the join token and a deadline. Calls that fail with UNAVAILABLE (the
coordinator is restarting, the network blinked) are retried with jittered exponential
backoff until `RetryPolicy.max_elapsed_s` has passed or the stop event is set; any other
status is raised to the caller as `grpc.RpcError`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, TypeVar

import grpc
import torch

from rcswarm.protos import tensor_stream
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS

log = logging.getLogger("rcswarm.worker")
T = TypeVar("T")


class RetriesExhausted(RuntimeError):
    """The coordinator stayed unreachable for longer than the retry policy allows."""


class Stopped(RuntimeError):
    """The worker was asked to stop while waiting to retry."""


@dataclass(frozen=True)
class RetryPolicy:
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    multiplier: float = 2.0
    max_elapsed_s: float = 120.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                f"initial_backoff_s = {self.initial_backoff_s}, max_backoff_s = {self.max_backoff_s}: "
                "expected 0 < initial <= max"
            )
        if self.multiplier < 1 or self.max_elapsed_s <= 0:
            raise ValueError(f"multiplier = {self.multiplier}, max_elapsed_s = {self.max_elapsed_s}: expected >= 1 and > 0")

    def backoffs(self, rng: random.Random) -> Iterator[float]:
        """Full-jitter exponential backoff: uniform(0, min(max, initial * multiplier^k))."""
        ceiling = self.initial_backoff_s
        while True:
            yield rng.uniform(0.0, ceiling)
            ceiling = min(self.max_backoff_s, ceiling * self.multiplier)


@dataclass(frozen=True)
class Timeouts:
    unary_s: float = 10.0
    transfer_s: float = 300.0


def apply_delta(
    header: pb.TensorHeader, step: Mapping[str, torch.Tensor], have: tuple[int, Mapping[str, torch.Tensor]] | None
) -> dict[str, torch.Tensor]:
    """θ_new = θ_have − step, element-wise in float32, verified against header.result_sha256."""
    if have is None or header.delta_from_version != have[0]:
        held = None if have is None else have[0]
        raise tensor_stream.PayloadError(f"got a delta from version {header.delta_from_version} but this worker holds {held}")
    base = have[1]
    if list(step) != list(base) or any(step[k].shape != base[k].shape for k in base):
        raise tensor_stream.PayloadError("the delta's tensor names or shapes differ from the held parameters")
    params = {name: base[name] - step[name] for name in base}
    if tensor_stream.params_sha256(params) != header.result_sha256:
        raise tensor_stream.PayloadError(
            f"parameters rebuilt from the delta {header.delta_from_version} -> {header.version} do not match their SHA-256"
        )
    return params


class CoordinatorClient:
    def __init__(
        self, target: str, token: str, *, tls_ca: Path | None = None, retry: RetryPolicy = RetryPolicy(),
        timeouts: Timeouts = Timeouts(), stop: threading.Event | None = None,
    ) -> None:
        options = list(MESSAGE_SIZE_OPTIONS)
        if tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
            self.channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(target, options=options)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.retry = retry
        self.timeouts = timeouts
        self.stop = stop or threading.Event()
        self._rng = random.Random()
        self.bytes_sent = 0
        self.bytes_received = 0

    def close(self) -> None:
        self.channel.close()

    def _with_retry(self, what: str, attempt: Callable[[], T]) -> T:
        started = time.monotonic()
        backoffs = self.retry.backoffs(self._rng)
        while True:
            try:
                return attempt()
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                elapsed = time.monotonic() - started
                if elapsed > self.retry.max_elapsed_s:
                    raise RetriesExhausted(f"{what}: coordinator unavailable for {elapsed:.1f}s: {err.details()}") from err
                delay = next(backoffs)
                log.warning("%s: coordinator unavailable (%s); retrying in %.2fs", what, err.details(), delay)
                if self.stop.wait(delay):
                    raise Stopped(what) from err

    def _unary(self, name: str, request, timeout: float | None = None):
        method = getattr(self.stub, name)
        return self._with_retry(name, lambda: method(request, timeout=timeout or self.timeouts.unary_s, metadata=self.metadata))

    def join(self, name: str, device: str, pid: int) -> pb.JoinResponse:
        return self._unary("Join", pb.JoinRequest(worker_name=name, device=device, pid=pid))

    def heartbeat(self, worker_id: str) -> pb.HeartbeatResponse:
        return self._unary("Heartbeat", pb.HeartbeatRequest(worker_id=worker_id))

    def leave(self, worker_id: str, reason: str) -> None:
        self.stub.Leave(pb.LeaveRequest(worker_id=worker_id, reason=reason), timeout=self.timeouts.unary_s, metadata=self.metadata)

    def await_version(self, worker_id: str, min_version: int, wait_s: float) -> pb.AwaitVersionResponse:
        request = pb.AwaitVersionRequest(worker_id=worker_id, min_version=min_version, wait_ms=int(wait_s * 1000))
        return self._unary("AwaitVersion", request, timeout=wait_s + self.timeouts.unary_s)

    def report_metrics(self, worker_id: str, metrics: list[pb.Metric]) -> None:
        self._unary("ReportMetrics", pb.ReportMetricsRequest(worker_id=worker_id, metrics=metrics))

    def status(self) -> pb.GetStatusResponse:
        return self._unary("GetStatus", pb.GetStatusRequest())

    def pull(
        self, worker_id: str, run_id: str, have: tuple[int, Mapping[str, torch.Tensor]] | None = None
    ) -> tuple[int, dict[str, torch.Tensor]]:
        """The newest global parameters: (version, tensors), checked against the header's checksums.

        `have` = (version, parameters) the caller holds bit for bit; when the coordinator
        answers with the compressed step from that version, the parameters are rebuilt as
        have − step and checked against the SHA-256 of the new version.
        """
        request = pb.PullParametersRequest(worker_id=worker_id)
        if have is not None:
            request.have_version = have[0]

        def attempt() -> tuple[int, dict[str, torch.Tensor]]:
            responses = self.stub.PullParameters(request, timeout=self.timeouts.transfer_s, metadata=self.metadata)
            first = next(responses)
            if first.WhichOneof("part") != "header":
                raise tensor_stream.PayloadError(f"PullParameters: expected a header first, got {first.WhichOneof('part')}")
            receiver = tensor_stream.PayloadReceiver(first.header, expected=None, run_id=run_id)
            received = first.ByteSize()
            for message in responses:
                receiver.add(message.chunk)
                received += message.ByteSize()
            tensors = receiver.finish()
            self.bytes_received += received
            if first.header.HasField("delta_from_version"):
                tensors = apply_delta(first.header, tensors, have)
            return first.header.version, tensors

        return self._with_retry("PullParameters", attempt)

    def push(self, meta: pb.UpdateMeta, header: pb.TensorHeader, chunks: list[pb.TensorChunk]) -> pb.PushUpdateResponse:
        messages = [pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=header)]
        messages += [pb.PushUpdateRequest(chunk=chunk) for chunk in chunks]
        size = sum(m.ByteSize() for m in messages)

        def attempt() -> pb.PushUpdateResponse:
            response = self.stub.PushUpdate(iter(messages), timeout=self.timeouts.transfer_s, metadata=self.metadata)
            self.bytes_sent += size
            return response

        return self._with_retry("PushUpdate", attempt)
