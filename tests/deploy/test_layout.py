"""The tests' own layout, read from the tests so that it cannot rot.

Tests live in tests/<room>/ (packages: they import as tests.<room>.<module>); what several test files share
lives in tests/helpers/, and no test file imports another. A test that starts a process lives in tests/swarm/
(marked slow there); elsewhere a test module may not import subprocess, multiprocessing, Ray or hivemind (nor
an rcswarm module that imports Ray or hivemind, nor a helper that starts processes), run sys.executable or
Popen, fork or spawn.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.imports import imported_modules

ROOT = Path(__file__).resolve().parents[2]

TESTS = ROOT / "tests"
PROCESS_MODULES = {"subprocess", "multiprocessing", "ray", "hivemind", "pty"}
PROCESS_NAMES = {"Popen", "ProcessPoolExecutor", "create_subprocess_exec", "create_subprocess_shell"}
OS_PROCESS_CALLS = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp",
                    "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
                    "spawnl", "spawnle", "spawnlp", "spawnlpe"}


def module_name(path: Path) -> str:
    """The dotted name a file of ours imports as: rcswarm.<folder>..., or tests.<folder>..."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "tests" else ("rcswarm", *parts))


def modules_named(tree: ast.AST) -> list[tuple[int, str]]:
    """imported_modules, plus the modules named to pytest.importorskip or importlib.import_module."""
    found = imported_modules(tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("importorskip", "import_module") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an `if` tests `TYPE_CHECKING` (or `typing.TYPE_CHECKING`)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def top_level_imports(tree: ast.Module) -> list[str]:
    """The modules a module imports when it is imported (not those imported inside its functions)."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo += node.orelse  # `if TYPE_CHECKING:` runs only under a type checker
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
    return found


def package_files() -> list[Path]:
    """Every module of the package: the files of each top-level folder with an `__init__.py` (tests/ aside)."""
    folders = [init.parent for init in ROOT.glob("*/__init__.py") if init.parent != TESTS]
    return sorted(path for folder in folders for path in folder.rglob("*.py"))


def loads_ray_or_hivemind() -> set[str]:
    """The rcswarm modules whose import imports Ray or hivemind (directly, or through another of ours)."""
    imports = {module_name(path): top_level_imports(ast.parse(path.read_text())) for path in package_files()}
    loading = {name for name, found in imports.items() if any(m.split(".")[0] in ("ray", "hivemind") for m in found)}
    while True:
        more = {name for name, found in imports.items() if name not in loading
                and any(m in loading or m.rsplit(".", 1)[0] in loading for m in found)}
        if not more:
            return loading
        loading |= more


def process_uses(path: Path, loading: set[str], helpers_that_start: set[str]) -> list[str]:
    """What in a file starts (or loads what starts) processes, as 'line: why'."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for line, module in modules_named(tree):
        if module.split(".")[0] in PROCESS_MODULES:
            found.append(f"{line}: imports {module}")
        elif module in loading:
            found.append(f"{line}: imports {module}, which imports Ray or hivemind")
        elif module in helpers_that_start:
            found.append(f"{line}: imports {module}, which starts processes")
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        owner = node.value.id if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) else None
        if (name in PROCESS_NAMES or (owner == "sys" and name == "executable")
                or (owner == "os" and name in OS_PROCESS_CALLS)):
            found.append(f"{node.lineno}: {owner + '.' if owner else ''}{name}")
    return sorted(set(found), key=lambda why: int(why.split(":")[0]))


def helpers_that_start_processes(loading: set[str]) -> set[str]:
    """The tests.helpers modules that start processes themselves or import one that does."""
    helpers = {module_name(path): path for path in (TESTS / "helpers").rglob("*.py")}
    starting: set[str] = set()
    while True:
        more = {name for name, path in helpers.items()
                if name not in starting and process_uses(path, loading, starting)}
        if not more:
            return starting
        starting |= more


def files_under_tests() -> list[Path]:
    """Every Python file under tests/."""
    return sorted(TESTS.rglob("*.py"))


def test_every_test_folder_is_a_package() -> None:
    folders = {path.parent for path in files_under_tests()}
    assert not [f for f in folders if not (f / "__init__.py").is_file()], "a test folder without __init__.py"


def test_no_test_file_imports_another() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in files_under_tests()
             for line, module in modules_named(ast.parse(path.read_text()))
             if module.startswith("tests.") and any(part.startswith("test_") for part in module.split("."))]
    assert not wrong, "shared test code goes to tests/helpers/:\n" + "\n".join(wrong)


def test_only_the_swarm_tests_start_processes() -> None:
    loading = loads_ray_or_hivemind()
    starting = helpers_that_start_processes(loading)
    wrong = [f"{path.relative_to(ROOT)}:{why}" for path in files_under_tests()
             if not {"swarm", "helpers"} & set(path.relative_to(TESTS).parts[:1])
             for why in process_uses(path, loading, starting)]
    assert not wrong, "a test that starts processes belongs in tests/swarm/:\n" + "\n".join(wrong)


def test_the_test_layout_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    loading = loads_ray_or_hivemind()
    assert "rcswarm.worker.hivemind_sync" in loading and "rcswarm.cli.main" not in loading
    starting = helpers_that_start_processes(loading)
    assert {"tests.helpers.processes", "tests.helpers.hivemind", "tests.helpers.git_repo"} <= starting
    assert "tests.helpers.specs" not in starting
    bad = tmp_path / "test_bad.py"
    bad.write_text("import os, sys\nfrom tests.helpers import processes\n\n\ndef test_x():\n"
                   "    import subprocess\n    subprocess.run([sys.executable, '-V'])\n    os.fork()\n"
                   "    pytest.importorskip('rcswarm.worker.hivemind_sync')\n"
                   "    from tests.coordinator.test_tls import request\n")
    assert process_uses(bad, loading, starting) == [
        "2: imports tests.helpers.processes, which starts processes", "6: imports subprocess", "7: sys.executable",
        "8: os.fork", "9: imports rcswarm.worker.hivemind_sync, which imports Ray or hivemind"]
    assert [m for _, m in modules_named(ast.parse(bad.read_text())) if "test_" in m] == [
        "tests.coordinator.test_tls", "tests.coordinator.test_tls.request"]
