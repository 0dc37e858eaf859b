"""The suite's hooks (the `wide` option) and its shared fixtures, registered from tests/helpers/."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.coordinator import start_coordinator  # noqa: F401  (a fixture)
from tests.helpers.data import corpus  # noqa: F401  (a fixture)

# Tests run small models, where one intra-op thread is fastest and immune to oversubscription
# when other processes (worker subprocesses, a parallel build) share the two cores.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seeded_torch() -> None:
    """Every test starts from torch's seed 0, so what a test draws without a generator does not depend on
    which tests ran before it (an order-dependent draw once put a reference at a zero distance in CI)."""
    torch.manual_seed(0)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--wide", action="store_true", help="also run the wide suite (tests marked `wide`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `wide` run only with --wide (make test-all) or RCSWARM_WIDE=1."""
    if config.getoption("--wide") or os.environ.get("RCSWARM_WIDE") == "1":
        return
    skip = pytest.mark.skip(reason="wide suite: run with --wide (make test-all) or RCSWARM_WIDE=1")
    for item in items:
        if "wide" in item.keywords:
            item.add_marker(skip)
