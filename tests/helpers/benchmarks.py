"""A benchmark script (benchmarks/ is no package) loaded as a module by its file name, once, for tests that share its
parts (the half-sent calls of rpc_latency_bench.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(file_name: str) -> ModuleType:
    """benchmarks/`file_name` as a module (its `main` is not run)."""
    name = f"rcswarm_bench_{Path(file_name).stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / file_name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
