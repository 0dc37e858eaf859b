"""The deployment tests' fixture: a real gRPC health server on loopback (tests/helpers/deploy.py)."""

from tests.helpers.deploy import health_server  # noqa: F401  (a fixture)
