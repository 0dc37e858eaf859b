"""What the TLS tests share: the quick start's names, a plaintext health Check, and an HTTP(S) request."""

from __future__ import annotations

import http.client
import ssl
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

QUICK_NAMES = ["127.0.0.1", "localhost", "::1"]


def health_check(target: str, service: str = "rcswarm.v1.Coordinator") -> int:
    with grpc.insecure_channel(target) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def request(port: int, method: str, path: str, headers: dict[str, str] | None = None, body: str | None = None,
            ca: Path | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    if ca is None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        context = ssl.create_default_context(cafile=str(ca))
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()
