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
