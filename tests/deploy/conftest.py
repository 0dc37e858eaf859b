"""The deployment tests' fixtures: a real gRPC health server on loopback, Helm's SDK and the chart loaded by it,
kubernetes-validate with its schemas read once (tests/helpers/deploy.py)."""

from functools import cache

import pytest

from tests.helpers.deploy import (
    CHART,
    health_server,  # noqa: F401  (a fixture)
    need,
)


@pytest.fixture(scope="module")
def helm():
    return need("helm_python", "helm-python-sdk")


@pytest.fixture(scope="module")
def chart(helm):
    loaded = helm.Chart.load(CHART)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def k8s_validate():
    """kubernetes_validate.validate with its schema files read once (it reads them on every call)."""
    kv = need("kubernetes_validate.utils", "kubernetes-validate")
    original = kv.schema_contents
    kv.schema_contents = cache(original)
    yield kv
    kv.schema_contents = original
