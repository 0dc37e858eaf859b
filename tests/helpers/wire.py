"""Raw gRPC to a coordinator on loopback: the Coordinator service's stubs (`Wire`), and pushes through a client."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS
from rcswarm.sync import codec, tensor_stream
from tests.helpers.specs import TOKEN


def run_format(run_spec_json: str) -> codec.WireFormat:
    """The wire format a worker of the run a Join answered pushes its updates in (the coordinator takes no other)."""
    return codec.WireFormat.from_sync(RunSpec.from_json(run_spec_json).sync)


class Wire:
    """Raw stubs of the Coordinator service on a loopback port: the token and a deadline on every call, and
    the worker secret of every worker it joined (`creds`)."""

    def __init__(self, target: str, token: str = TOKEN) -> None:
        self.channel = grpc.insecure_channel(target, options=MESSAGE_SIZE_OPTIONS)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.secrets: dict[str, bytes] = {}
        self.format: codec.WireFormat | None = None

    def creds(self, worker_id: str) -> dict[str, Any]:
        """The worker_id and worker_secret fields of a request for a worker this wire joined."""
        return {"worker_id": worker_id, "worker_secret": self.secrets[worker_id]}

    def call(self, method: str, request: Any, timeout: float = 10.0) -> Any:
        """One unary (or client-streaming) call."""
        return getattr(self.stub, method)(request, timeout=timeout, metadata=self.metadata)

    def refusal(self, method: str, request: Any) -> grpc.RpcError:
        """The error a call that must be refused raises."""
        with pytest.raises(grpc.RpcError) as info:
            self.call(method, request)
        return info.value

    def join(self, name: str) -> str:
        """A new worker id (its secret kept for `creds`)."""
        joined = self.call("Join", pb.JoinRequest(worker_name=name, device="cpu", pid=1))
        self.secrets[joined.worker_id] = joined.worker_secret
        self.format = run_format(joined.run_spec_json)
        return joined.worker_id

    def pull(self, worker_id: str, timeout: float = 30.0) -> pb.TensorHeader:
        """Pull the current θ; its header (the chunks are read and dropped)."""
        responses = list(self.stub.PullParameters(pb.PullParametersRequest(**self.creds(worker_id)), timeout=timeout,
                                                  metadata=self.metadata))
        return responses[0].header

    def push_zero(self, worker_id: str, header: pb.TensorHeader, tokens: int = 1) -> pb.PushUpdateResponse:
        """Push a zero update trained from the version of a pull `header`, in the run's format."""
        zeros = {t.name: torch.zeros(tuple(t.shape)) for t in header.tensors}
        update, chunks = tensor_stream.build_payload(zeros, codec=self.format, run_id=header.run_id, version=header.version)
        meta = pb.UpdateMeta(**self.creds(worker_id), base_version=header.version, tokens=tokens)
        messages = [pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=update),
                    *(pb.PushUpdateRequest(chunk=c) for c in chunks)]
        return self.call("PushUpdate", iter(messages), timeout=30.0)

    def report(self, worker_id: str, metrics: list[pb.Metric]) -> pb.ReportMetricsResponse:
        return self.call("ReportMetrics", pb.ReportMetricsRequest(**self.creds(worker_id), metrics=metrics))

    def close(self) -> None:
        self.channel.close()


def small_deltas(local, value: float = 1e-3) -> dict[str, torch.Tensor]:
    return {name: torch.full(shape, value) for name, shape in local.service.shapes.items()}


def push(client, member, deltas, *, version=0, tokens=128, codec_id=None, corrupt=None):
    """`member`'s update `deltas` from `version` through `client`, in the run's format unless `codec_id` names another."""
    fmt = run_format(member.run_spec_json) if codec_id is None else codec.WireFormat.of(codec_id)
    header, chunks = tensor_stream.build_payload(deltas, codec=fmt, run_id=member.run_id, version=version)
    if corrupt:
        corrupt(header, chunks)
    meta = pb.UpdateMeta(
        worker_id=member.worker_id, worker_secret=member.worker_secret, base_version=version, tokens=tokens, inner_steps=1
    )
    return client.push(meta, header, chunks)


def pushed_and_left(client, local) -> tuple[Any, Any]:
    """(a, b) joined through `client` and pulled version 0; a's update for it is in the open round and a left
    ("crashed"): its place held until the round closes."""
    a, b = (client.join(name, "cpu", 1) for name in ("a", "b"))
    for member in (a, b):
        client.pull(member, member.run_id)
    assert push(client, a, small_deltas(local)).accepted
    client.leave(a, "crashed")
    return a, b


def refused(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value
