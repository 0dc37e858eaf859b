"""Every test under tests/swarm/ starts processes and is marked `slow` here (`pytest -m "not slow"` is the quick
suite); the fixtures that start worker processes, hivemind swarms and a health server are registered here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.deploy import health_server  # noqa: F401  (a fixture)
from tests.helpers.hivemind import no_new_p2pd, swarm  # noqa: F401  (fixtures)
from tests.helpers.processes import spawn_worker  # noqa: F401  (a fixture)

SWARM = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of this folder `slow` (the hook sees the whole session's items), before -m selects."""
    for item in items:
        if SWARM in item.path.parents:
            item.add_marker(pytest.mark.slow)
