"""The GPU check's table and JSON document, the cards' peaks and the FLOP and byte counts behind the fractions.

Counting conventions (one multiply-add = 2 FLOPs, as in models/frame/flops.py):

* RWKV-Product (`kernels/rwkv_product/naive.py`), per token and head, forward: S diag(w) (d_v d_k), z = S a,
  z bᵀ, v kᵀ and y = S r (2 d_v d_k each): 9 d_v d_k. Forward + backward counts 3× the forward (the usual
  2× for the backward; the Triton kernel's recomputation of the chunk's states is not counted). Compulsory
  memory traffic per token and head, with I = 5 d_k + d_v inputs (r, w, k, a, b, v): the forward reads I and
  writes y (d_v); the backward reads I and dy (d_v) and writes I gradients: (3 I + 2 d_v) elements in all.
* Attention (SGSA, SDPA), per batch and query head: 2 (D + D_v) FLOPs per visible (query, key) pair forward
  (q kᵀ and p v); forward + backward 3.5× the forward (FlashAttention's convention: backward = 2.5 forward).
  Dense causal attention has T (T + 1) / 2 pairs; SGSA Σ_i min(i + 1, W) + ⌊(i − W + 1) / G⌋₊.

A fraction of peak is the counted FLOPs (or bytes) per second over the card's dense bf16 (or fp32) peak and
memory bandwidth (`CARDS`, from NVIDIA's data sheets; the H100 numbers are the issue's: 989 TFLOP/s bf16
dense, 3.35 TB/s). An unknown card gets no fractions.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PASS, FAIL, INFO, SKIPPED, ERROR = "pass", "fail", "info", "skipped", "error"
STATUSES = (PASS, FAIL, INFO, SKIPPED, ERROR)
PARTS = ("kernels", "timings", "bptt", "swarm")
# The detail of a part or configuration the check's time budget (`rcswarm bench gpu --budget-minutes`) left out.
BUDGET_SPENT = "not started: the check's time budget (--budget-minutes) was spent"


def seconds_left(deadline: float | None) -> float:
    """Seconds until `deadline` (time.monotonic()); infinite without one."""
    return math.inf if deadline is None else deadline - time.monotonic()


@dataclass(frozen=True)
class CardPeak:
    """A card's dense peaks: bf16 and fp32 (non-tensor-core) FLOP/s and memory bytes/s."""

    name: str
    bf16_flops: float
    fp32_flops: float
    bandwidth: float


# Matched in order against torch.cuda.get_device_name(): the first whose every word occurs in the name.
CARDS: tuple[tuple[tuple[str, ...], CardPeak], ...] = (
    (("H200",), CardPeak("H200", 989e12, 67e12, 4.8e12)),
    (("H100", "PCIe"), CardPeak("H100 PCIe", 756e12, 51e12, 2.0e12)),
    (("H100", "NVL"), CardPeak("H100 NVL", 835e12, 60e12, 3.9e12)),
    (("H100",), CardPeak("H100 SXM", 989e12, 67e12, 3.35e12)),
    (("A100", "40GB"), CardPeak("A100 40GB", 312e12, 19.5e12, 1.555e12)),
    (("A100",), CardPeak("A100 80GB", 312e12, 19.5e12, 2.039e12)),
)


def card_peak(device_name: str) -> CardPeak | None:
    """The peaks of the card called `device_name` (as CUDA names it), or None when it is not in `CARDS`."""
    for words, peak in CARDS:
        if all(word.lower() in device_name.lower() for word in words):
            return peak
    return None


def rwkv_flops(batch: int, length: int, heads: int, d_k: int, d_v: int, backward: bool) -> int:
    """Counted FLOPs of the RWKV-Product recurrence: 9 d_v d_k per token and head forward, 3× with the backward."""
    forward = 9 * batch * length * heads * d_v * d_k
    return 3 * forward if backward else forward


def rwkv_bytes(batch: int, length: int, heads: int, d_k: int, d_v: int, element_bytes: int, backward: bool) -> int:
    """Compulsory memory traffic of the recurrence (see the module docstring)."""
    inputs = 5 * d_k + d_v
    elements = 3 * inputs + 2 * d_v if backward else inputs + d_v
    return batch * length * heads * elements * element_bytes


def causal_pairs(length: int) -> int:
    """Visible (query, key) pairs of dense causal attention: T (T + 1) / 2."""
    return length * (length + 1) // 2


def sgsa_pairs(length: int, window: int, anchor_stride: int) -> int:
    """Visible pairs of SGSA: per query i, min(i + 1, W) window keys plus the ⌊(i − W + 1) / G⌋ anchors before it."""
    window = min(window, length)
    in_window = sum(min(i + 1, window) for i in range(length))
    anchors = sum(max(0, (i - window + 1) // anchor_stride) for i in range(window, length))
    return in_window + anchors


def attention_flops(batch: int, heads: int, d: int, d_v: int, pairs: int, backward: bool) -> int:
    """2 (D + D_v) FLOPs per visible pair, per batch and query head; 3.5× with the backward."""
    forward = 2 * (d + d_v) * pairs * batch * heads
    return int(3.5 * forward) if backward else forward


def fraction(amount: float, seconds: float, peak: float | None) -> float | None:
    """amount / seconds / peak (a FLOP or byte rate over the card's peak); None without a peak or a time."""
    if peak is None or not seconds > 0:
        return None
    return amount / seconds / peak


@dataclass(frozen=True)
class Row:
    """One line of the table: which part, what was measured, the headline, more detail, a status, the numbers."""

    part: str
    name: str
    value: str
    detail: str = ""
    status: str = INFO
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise ValueError(f"Row.part={self.part!r}: expected one of {PARTS}")
        if self.status not in STATUSES:
            raise ValueError(f"Row.status={self.status!r}: expected one of {STATUSES}")


@dataclass(frozen=True)
class Goal:
    """A goal of the issue read from the rows: what it compares, the measured ratio, the target, whether met."""

    name: str
    measured: float | None
    target: float
    higher_is_better: bool = True
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.measured is None or not math.isfinite(self.measured):
            return None
        return self.measured >= self.target if self.higher_is_better else self.measured <= self.target

    def line(self) -> str:
        sign = "≥" if self.higher_is_better else "≤"
        got = "not measured" if self.measured is None else f"{self.measured:.3g}"
        verdict = {True: "met", False: "NOT met", None: "not measured"}[self.met]
        return f"{self.name}: {got} (goal {sign} {self.target:g}) — {verdict}{f'; {self.note}' if self.note else ''}"


def _find(rows: Iterable[Row], part: str, **match: Any) -> Row | None:
    for row in rows:
        if row.part == part and all(row.data.get(key) == value for key, value in match.items()):
            return row
    return None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or not denominator > 0:
        return None
    return numerator / denominator


def goals(rows: Sequence[Row]) -> list[Goal]:
    """The issue's H100 goals from the measured rows (None where a side was not measured)."""

    def seconds(part: str, **match: Any) -> float | None:
        row = _find(rows, part, **match)
        return None if row is None else row.data.get("seconds")

    rwkv = _ratio(seconds("timings", kernel="fla chunk_rwkv7", length=32768, backward=True),
                  seconds("timings", kernel="rwkv_product triton", length=32768, backward=True))
    sgsa = _ratio(seconds("timings", kernel="sdpa causal", length=16384, backward=True),
                  seconds("timings", kernel="sgsa triton", length=16384, backward=True))
    found = [
        Goal("rwkv_product fwd+bwd speed over fla chunk_rwkv7 at T = 32K", rwkv, 1.0, note="★ at ≥ 1.2"),
        Goal("SGSA fwd+bwd speed over dense causal SDPA at 16K", sgsa, 5.0),
    ]
    def bptt(preset: str, method: str, length: int | None, key: str) -> float | None:
        row = _find(rows, "bptt", preset=preset, method=method, length=length)
        return None if row is None else row.data.get(key)

    for preset in sorted({r.data["preset"] for r in rows if r.part == "bptt" and "preset" in r.data}):
        lengths = sorted({r.data["length"] for r in rows if r.part == "bptt" and r.data.get("preset") == preset})
        shortest, longest = lengths[0], lengths[-1]
        found.append(Goal(f"{preset}: streaming BPTT peak memory at L = {longest:,} over L = {shortest:,}",
                          _ratio(bptt(preset, "binomial", longest, "peak_bytes"),
                                 bptt(preset, "binomial", shortest, "peak_bytes")),
                          1.05, higher_is_better=False, note="core checkpointing (binomial)"))
        found.append(Goal(f"{preset}: streaming BPTT frames/s over plain autograd at L = {shortest:,}",
                          _ratio(bptt(preset, "binomial", shortest, "frames_per_second"),
                                 bptt(preset, "plain", shortest, "frames_per_second")),
                          0.5, note="where plain autograd fits"))
    return found


def render_table(rows: Sequence[Row], title: str, console) -> None:
    """One table on screen: part, what, value, detail, status."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("part", "what", "value", "detail", "status"):
        table.add_column(column, overflow="fold")
    colours = {PASS: "green", FAIL: "red", ERROR: "red", SKIPPED: "yellow", INFO: ""}
    for row in rows:
        status = f"[{colours[row.status]}]{row.status}[/]" if colours[row.status] else row.status
        table.add_row(row.part, row.name, row.value, row.detail, status)
    console.print(table)


def document(rows: Sequence[Row], environment: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: the environment, every row with its numbers, the goals, and the pass/fail summary."""
    found = goals(rows)
    return {
        "environment": environment,
        "rows": [asdict(row) for row in rows],
        "goals": [{**asdict(goal), "met": goal.met} for goal in found],
        "failed": [f"{row.part}: {row.name}" for row in rows if row.status in (FAIL, ERROR)],
    }


def write_json(doc: dict[str, Any], path: Path) -> None:
    """The document as JSON (non-finite floats as null)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(item) for item in value]
        return value

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(clean(doc), indent=2) + "\n")


def exit_status(rows: Sequence[Row]) -> int:
    """1 when a correctness check failed or a part raised; goals missed are reported, not failed."""
    return 1 if any(row.status in (FAIL, ERROR) for row in rows) else 0
