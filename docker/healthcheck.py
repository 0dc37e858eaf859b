"""The coordinator image's HEALTHCHECK: one grpc.health.v1 Check call, exit 0 when SERVING, else 1.

    python healthcheck.py [--address HOST:PORT] [--service NAME] [--timeout SECONDS]

The address defaults to $RCSWARM_HEALTH_ADDRESS (127.0.0.1:50051 in the image), the service to
the coordinator's (`rcswarm.v1.Coordinator`). The health service needs no join token; the call is
plaintext, so with TLS on the main port it targets the coordinator's --health-port. It imports only
grpcio and grpcio-health-checking, which the image already has, and says why on a failure.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ADDRESS_ENV = "RCSWARM_HEALTH_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:50051"
COORDINATOR_SERVICE = "rcswarm.v1.Coordinator"


def check(address: str, service: str, timeout_s: float) -> tuple[bool, str]:
    """(healthy, what was seen) after one Check call with a deadline of `timeout_s`."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as err:
            return False, f"{err.code().name}: {err.details()}" if err.details() else err.code().name
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the rcswarm coordinator's gRPC health.")
    parser.add_argument("--address", default=os.environ.get(ADDRESS_ENV, DEFAULT_ADDRESS),
                        help=f"HOST:PORT of a plaintext health server (default ${ADDRESS_ENV} or {DEFAULT_ADDRESS})")
    parser.add_argument("--service", default=COORDINATOR_SERVICE, help="service name; '' for the whole server")
    parser.add_argument("--timeout", type=float, default=5.0, help="deadline of the call in seconds")
    args = parser.parse_args(argv)
    healthy, seen = check(args.address, args.service, args.timeout)
    print(f"{args.address} {args.service or '(server)'}: {seen}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
