"""Traffic per worker per round and its ratio to fp32 (issue #28), worded once for `rcswarm status`, the dashboard
and the run summary.

`fp32_bytes` is θ's tensors in float32, what one update or one pull moves uncompressed; a ratio is fp32_bytes over
the bytes that moved (message bytes, headers included), so 100 means a hundred times less traffic than fp32.

The downlink's figure is the steady state: the pulls of a round's step. A full pull of θ (a worker's first, or one
after a missed round) moves θ in float32 whatever the codec; the coordinator counts those apart and keeps their
total in its store under `FULL_PULLS_KEY`, so that the run summary can take them out of the workers' byte counters.
"""

from __future__ import annotations

import json
import math

# The run_state key of the full pulls a coordinator served: {"bytes": total message bytes, "pulls": count}.
FULL_PULLS_KEY = "traffic.full_pulls"


def full_pulls(stored: str | None) -> tuple[int, int]:
    """(bytes, pulls) of the full pulls from `FULL_PULLS_KEY`'s stored value ((0, 0) when unset)."""
    if not stored:
        return 0, 0
    value = json.loads(stored)
    return int(value["bytes"]), int(value["pulls"])


def full_pulls_value(size: int, pulls: int) -> str:
    """`FULL_PULLS_KEY`'s value for `size` bytes over `pulls` full pulls."""
    return json.dumps({"bytes": size, "pulls": pulls})


def ratio(fp32_bytes: float, moved: float) -> float:
    """fp32_bytes / moved (NaN when nothing moved or the base is unknown)."""
    return fp32_bytes / moved if moved > 0 and fp32_bytes > 0 else math.nan


def size(value: float) -> str:
    """Bytes in B, kB or MB (decimal), three significant digits."""
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def one_way(fp32_bytes: float, moved: float) -> str:
    """`12.3 kB (105× below fp32)`, or `–` before anything moved."""
    if moved <= 0:
        return "–"
    times = ratio(fp32_bytes, moved)
    return f"{size(moved)} ({times:.3g}× below fp32)" if math.isfinite(times) else size(moved)


def describe(fp32_bytes: float, up: float, down: float) -> str:
    """Both directions of one worker's round: `up 8.6 kB (150× below fp32), down 8.3 kB (154× below fp32)`."""
    return f"up {one_way(fp32_bytes, up)}, down {one_way(fp32_bytes, down)}"
