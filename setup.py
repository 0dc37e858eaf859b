"""Which packages the wheel holds, found from the tree: pyproject.toml has everything else.

Every folder at the root with an `__init__.py` (but tests/) installs as `rcswarm.<folder>`, and
every folder below it with an `__init__.py` as `rcswarm.<folder>.<sub>`, so a new model, kernel
or top-level folder ships without editing a list. tests/swarm/test_packaging.py checks the wheel.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
NOT_INSTALLED = {"tests"}


def package_dirs() -> dict[str, str]:
    """`rcswarm.<dotted path>` -> folder, for every package folder of the distribution."""
    mapping = {}
    for top in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name not in NOT_INSTALLED):
        for init in sorted(top.rglob("__init__.py")):
            folder = init.parent.relative_to(ROOT)
            mapping[".".join(("rcswarm", *folder.parts))] = folder.as_posix()
    return mapping


PACKAGE_DIRS = package_dirs()
setup(packages=list(PACKAGE_DIRS), package_dir=PACKAGE_DIRS)
