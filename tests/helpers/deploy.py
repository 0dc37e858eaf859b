"""What the deployment tests share: the Helm chart rendered by Helm's Go SDK (`render`, `objects`, a scenario's
values), the vendored CRD schemas made strict, and the images' health check against a real gRPC health server.

Each dependency is in the `dev` extra; `need` skips a test whose package is missing, naming it.
"""

from __future__ import annotations

import importlib.util
import json
from concurrent import futures
from functools import cache
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rcswarm"
SCHEMAS = ROOT / "tests" / "deploy" / "k8s_schemas"
DOCKER = ROOT / "docker"
RELEASE, NAMESPACE = "demo", "ml"
COORDINATOR_SERVICE = "rcswarm.v1.Coordinator"


def need(module: str, package: str):
    """Import `module`, or skip the test naming the package that provides it."""
    return pytest.importorskip(module, reason=f"{package} is not installed (pip install -e '.[dev]')")


def scenario_values(name: str) -> dict[str, Any] | None:
    """The values file of a scenario (helm/rcswarm/ci/<name>-values.yaml); None for the defaults."""
    yaml = need("yaml", "PyYAML")
    return None if name == "default" else yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text())


def render(chart, values: dict[str, Any] | None = None, api_versions: list[str] | tuple = (),
           kube_version: str | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm template demo helm/rcswarm -n ml --api-versions ...` prints it."""
    from helm_python import _native

    options: dict[str, Any] = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True, "api_versions": list(api_versions)}
    if kube_version:
        options["kube_version"] = kube_version
    payload = None if values is None else json.dumps(values)
    return json.loads(_native.call_string("helm_render", chart._raw(), payload, json.dumps(options)))


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object of a render (NOTES.txt aside)."""
    yaml = need("yaml", "PyYAML")
    found = []
    for path, text in sorted(rendered.items()):
        if not path.endswith("NOTES.txt"):
            found += [doc for doc in yaml.safe_load_all(text) if doc]
    return found


@cache
def strict_custom_schema(path: Path) -> dict[str, Any]:
    """A CRD's schema with unknown fields refused, as the API server's strict field validation does."""
    schema = json.loads(path.read_text())

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


@pytest.fixture
def health_server():
    """A real gRPC health server on 127.0.0.1, the servicer the coordinator uses."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0).wait(5)


def load_healthcheck():
    spec = importlib.util.spec_from_file_location("rcswarm_image_healthcheck", DOCKER / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
