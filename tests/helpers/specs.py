"""The tests' run specs: the join token their coordinators accept, the tiny LSTM spec and its RUN.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rcswarm.config.runspec import RunSpec

TOKEN = "test-token-0123456789"


def tiny_spec(**tables: dict[str, Any]) -> RunSpec:
    """The tiny LSTM on short windows, with per-table overrides: tiny_spec(sync={"codec": "fp32"})."""
    base: dict[str, dict[str, Any]] = {
        "run": {"name": "test", "rounds": 3, "workers": 2},
        "model": {"name": "lstm_lm", "preset": "tiny"},
        "data": {"seq_len": 32, "batch_size": 4, "max_bytes": 2_000_000},
        "inner": {"steps": 5, "lr": 1e-2},
        "sync": {"round_deadline_s": 60.0},
        "coordinator": {"lease_s": 10.0, "max_wait_s": 2.0},
    }
    for table, values in tables.items():
        base.setdefault(table, {}).update(values)
    return RunSpec.from_dict(base)


def hivemind_spec(**tables: dict[str, Any]) -> RunSpec:
    """The tiny spec of a three-round run whose workers average peer to peer (sync.backend = "hivemind", int8)."""
    return tiny_spec(**{"run": {"name": "hm", "rounds": 3}, "sync": {"backend": "hivemind", "codec": "int8"}, **tables})


def write_spec(spec: RunSpec, path: Path) -> Path:
    path.write_text(spec.to_toml())
    return path
