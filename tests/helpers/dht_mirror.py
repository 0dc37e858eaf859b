"""The records of a hivemind swarm's run as `rcswarm dht` mirrors them: the run spec, metric rows on a known law."""

from __future__ import annotations

import math
from typing import Any

from tests.helpers.specs import tiny_spec

RUN = "hm"


def spec() -> Any:
    return tiny_spec(run={"name": RUN, "rounds": 3}, sync={"backend": "hivemind", "codec": "int8"})


def law_rows(seq_len: int, steps: int, version: int = 0) -> list[list[float]]:
    """Metric rows [version, step, loss, tokens, wall, compute, sync, seq_len, batch] on loss = 5·L^(−α(s))."""
    rows = []
    for step in range(1, steps + 1):
        alpha = 0.3 * (1 - math.exp(-step / 40))
        rows.append([float(version), float(step), 5.0 * seq_len ** -alpha, float(4 * seq_len), 0.01 * seq_len * step,
                     0.01 * seq_len * step, 0.0, float(seq_len), 4.0])
    return rows


def metrics(name: str, rows: list[list[float]]) -> dict[str, Any]:
    return {"run": RUN, "name": name, "rows": rows}
