"""The suite's hooks (the `wide` option) and its shared fixtures, registered from tests/helpers/."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

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


def sql(state_dir: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of one SQL statement on a state dir's state.sqlite, through a plain read-only connection.

    Tests may look into the tables directly; the package reads them only through StateStore's named reads.
    """
    connection = sqlite3.connect(f"{(Path(state_dir) / 'state.sqlite').resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        return connection.execute(statement, params).fetchall()
    finally:
        connection.close()
