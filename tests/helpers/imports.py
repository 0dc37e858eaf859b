"""The imports of a Python file, read with ast: what tests/deploy/test_structure.py and test_layout.py check."""

from __future__ import annotations

import ast


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted module) for every import in the tree, relative ones made absolute under rcswarm."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.level:
                raise AssertionError(f"line {node.lineno}: relative import; rcswarm imports are absolute")
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found
