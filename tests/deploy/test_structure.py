"""The layering of docs/ARCHITECTURE.md, read from the code so that it cannot rot.

Every import of an `rcswarm.<folder>` module, at the top of a file or inside a function, is an
arrow between top-level folders; each folder may point only at the folders listed for it below.
The table has no cycle, so neither has the tree. Beside the arrows: no module imports a `*_cli`
module, and no SQL statement is written and no `sqlite3` imported outside the store (state/): other
folders use its named reads and catch its StoreError.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.imports import imported_modules

ROOT = Path(__file__).resolve().parents[2]

# folder -> the folders of ours it may import (itself always allowed).
ALLOWED = {
    "kernels": set(),
    "models": {"kernels"},
    "data": set(),
    "protos": set(),
    "config": set(),
    "sync": {"protos", "config"},
    "train": {"kernels", "models", "data", "config"},
    "state": {"protos", "sync"},
    "observe": {"state", "config", "protos"},
    "coordinator": {"models", "protos", "config", "sync", "state", "observe"},
    "worker": {"kernels", "models", "data", "protos", "config", "sync", "train"},
    "launch": {"worker", "config", "protos"},
    "cli": {"kernels", "models", "data", "protos", "config", "sync", "train", "state", "observe", "coordinator",
            "worker", "launch"},
}
STORE = ROOT / "state"
SQL = re.compile(r"\b(SELECT\s.+\sFROM|INSERT\s+(OR\s+\w+\s+)?INTO|CREATE\s+(TABLE|INDEX)|DELETE\s+FROM|UPDATE\s+\w+\s+SET)\b",
                 re.DOTALL)


def package_files() -> list[Path]:
    return sorted(path for folder in ALLOWED for path in (ROOT / folder).rglob("*.py")
                  if "v1" not in path.relative_to(ROOT).parts)


def arrows(path: Path) -> list[tuple[int, str]]:
    """(line, folder) of ours that a file imports."""
    tree = ast.parse(path.read_text(), str(path))
    return [(line, module.split(".")[1]) for line, module in imported_modules(tree)
            if module.startswith("rcswarm.") and module.split(".")[1] in ALLOWED]


def test_the_allowed_arrows_have_no_cycle() -> None:
    def visit(folder: str, path: tuple[str, ...]) -> None:
        assert folder not in path, f"cycle {' -> '.join(path + (folder,))}"
        for target in ALLOWED[folder]:
            visit(target, path + (folder,))

    for folder in ALLOWED:
        visit(folder, ())


def test_every_package_folder_is_in_the_table() -> None:
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert folders == set(ALLOWED), "a new top-level package needs its place in ALLOWED and in docs/ARCHITECTURE.md"


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_imports_point_one_way(folder: str) -> None:
    wrong = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, target in arrows(path):
            if target != folder and target not in ALLOWED[folder]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports rcswarm.{target}")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_a_cli_module() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in package_files()
             for line, module in imported_modules(ast.parse(path.read_text()))
             if module.startswith("rcswarm.") and module.rsplit(".", 1)[-1].endswith("_cli")]
    assert not wrong, "\n".join(wrong)


def sql_outside_the_store(path: Path) -> list[str]:
    """SQL strings and sqlite3 imports in a file, each as "line: what"."""
    tree = ast.parse(path.read_text(), str(path))
    found = [f"{line}: imports {module}" for line, module in imported_modules(tree) if module.split(".")[0] == "sqlite3"]
    found += [f"{node.lineno}: {node.value.strip()[:60]!r}" for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value)]
    return found


def test_sql_and_sqlite3_live_in_the_store_alone() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{found}" for path in package_files() if STORE not in path.parents
             for found in sql_outside_the_store(path)]
    assert not wrong, "SQL or sqlite3 outside state/:\n" + "\n".join(wrong)


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from rcswarm.worker.worker import main\n    return 'SELECT x FROM metrics'\n")
    assert arrows(bad) == [(2, "worker"), (2, "worker")]
    bad.write_text("import sqlite3\nfrom sqlite3 import Error\nQUERY = 'DELETE FROM events'\n")
    assert sql_outside_the_store(bad) == ["1: imports sqlite3", "2: imports sqlite3", "2: imports sqlite3.Error",
                                          "3: 'DELETE FROM events'"]
    assert SQL.search("SELECT x FROM metrics WHERE y = ?") and not SQL.search("select the fastest path from them")
