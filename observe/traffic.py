"""Traffic per worker per round and its ratio to fp32 (issue #28), worded once for `rcswarm status`, the dashboard
and the run summary.

`fp32_bytes` is θ's tensors in float32, what one update or one pull moves uncompressed; a ratio is fp32_bytes over
the bytes that moved (message bytes, headers included), so 100 means a hundred times less traffic than fp32.

The downlink's figure is the steady state: the pulls of a round's step. A full pull of θ (a worker's first, or one
after a missed round) moves θ in float32 whatever the codec; the coordinator counts those apart and keeps their
total in its store under `FULL_PULLS_KEY`, so that the run summary can take them out of the workers' byte counters.
A store that holds the step pulls' total and count under `STEP_PULLS_KEY` (what GetStatus's downlink divides) gives
the run summary's downlink per pull (`downlink_per_pull`). Updates applied are no count of step pulls:
each membership's last update has none after it, so dividing by them read a short run's downlink smaller than any
pull was (ratio_down 5.06 where every pull was 3.94× below fp32).
"""

from __future__ import annotations

import json
import math

# The run_state key of the full pulls a coordinator served: {"bytes": total message bytes, "pulls": count}.
FULL_PULLS_KEY = "traffic.full_pulls"
# The run_state key of the pulls of a round's step a coordinator served, the same value as FULL_PULLS_KEY's.
STEP_PULLS_KEY = "traffic.step_pulls"


def full_pulls(stored: str | None) -> tuple[int, int]:
    """(bytes, pulls) of the full pulls from `FULL_PULLS_KEY`'s stored value ((0, 0) when unset)."""
    if not stored:
        return 0, 0
    value = json.loads(stored)
    return int(value["bytes"]), int(value["pulls"])


def full_pulls_value(size: int, pulls: int) -> str:
    """`FULL_PULLS_KEY`'s value for `size` bytes over `pulls` full pulls."""
    return json.dumps({"bytes": size, "pulls": pulls})


def step_pulls(stored: str | None) -> tuple[int, int]:
    """(bytes, pulls) of the step pulls from `STEP_PULLS_KEY`'s stored value ((0, 0) when unset)."""
    return full_pulls(stored)


def step_pulls_value(size: int, pulls: int) -> str:
    """`STEP_PULLS_KEY`'s value for `size` bytes over `pulls` pulls of a round's step."""
    return full_pulls_value(size, pulls)


def downlink_per_pull(step_bytes: int, step_count: int, received: int, full_bytes: int, reports: int) -> float:
    """One worker's bytes per pull of a round's step: the step pulls' `step_bytes` over their `step_count` as the
    coordinator counted them (`STEP_PULLS_KEY`, what GetStatus shows); a store without that count (0 pulls) gives
    the workers' `received` bytes less the full pulls' `full_bytes` over the `reports` (updates applied), as before
    the count was kept: smaller than a pull by up to one pull per membership (its last update has none after it)."""
    if step_count > 0:
        return step_bytes / step_count
    return max(received - full_bytes, 0) / max(reports, 1)


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
