"""Evaluation metrics of the frame model (paper, Section 10.4 and Appendix H).

- `mean_cross_entropy`: next-action cross-entropy averaged over all [B, L] positions.
- `sustained_accuracy`: "the average number of correct frames in a row without
  interruption as per top-1 sampling" (Section 10.4.1). Each sequence is cut at
  its wrong predictions: every wrong prediction closes the run of correct ones
  before it (which may be empty), and a non-empty run still open at the end of
  the sequence is closed there. The metric is the mean length of all closed
  runs in the batch, i.e. (number correct) / (number of runs). So
  [1,1,0,1,1,1,0] has runs 2 and 3 -> 2.5; [0,0,1] has runs 0, 0, 1 -> 1/3.
  Counting the empty runs is what lets the paper report values below one
  (0.28 and 0.35 at n_frames = 2 in Section 10.4.2), which the mean over
  non-empty runs could never produce once anything is correct.
- `position_losses`: mean cross-entropy over the first and the last n positions
  next to the overall mean (Appendix H uses n = 4 of 32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def _check_pair(logits: Tensor, targets: Tensor) -> None:
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)}: "
            "expected logits [B, L, V] and targets [B, L]"
        )


def per_position_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy of every position, [B, L], from logits [B, L, V] and targets [B, L]."""
    _check_pair(logits, targets)
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [B, L]


def mean_cross_entropy(logits: Tensor, targets: Tensor) -> float:
    """Cross-entropy averaged over all B x L positions."""
    return per_position_cross_entropy(logits, targets).mean().item()


def top1_correct(logits: Tensor, targets: Tensor) -> Tensor:
    """Bool [B, L]: whether the arg-max action is the target."""
    _check_pair(logits, targets)
    return logits.argmax(dim=-1) == targets  # [B, L]


def sustained_accuracy(correct: Tensor) -> float:
    """Mean length of the runs of correct predictions in `correct` [B, L] or [L] (bool).

    A run ends at every wrong prediction (possibly empty) and at the end of a
    sequence (only if non-empty); see the module docstring.
    """
    if correct.dtype != torch.bool or correct.dim() not in (1, 2) or correct.shape[-1] == 0:
        raise ValueError(
            f"correct has dtype {correct.dtype} and shape {tuple(correct.shape)}: "
            "expected a bool tensor [L] or [B, L] with L >= 1"
        )
    rows = correct.reshape(-1, correct.shape[-1])  # [B, L]
    n_correct = int(rows.sum())
    n_wrong = rows.numel() - n_correct
    n_open_at_end = int(rows[:, -1].sum())
    return n_correct / (n_wrong + n_open_at_end)


@dataclass(frozen=True)
class PositionLosses:
    """Mean cross-entropy overall, over the first `n` and over the last `n` positions."""

    mean: float
    early: float
    late: float
    n: int


def position_losses(logits: Tensor, targets: Tensor, n: int = 4) -> PositionLosses:
    """Appendix H's early- vs late-position loss next to the mean; 1 <= n <= L."""
    losses = per_position_cross_entropy(logits, targets)  # [B, L]
    length = losses.shape[1]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= length:
        raise ValueError(f"n={n!r}: expected an int with 1 <= n <= L={length}")
    return PositionLosses(
        mean=losses.mean().item(),
        early=losses[:, :n].mean().item(),
        late=losses[:, -n:].mean().item(),
        n=n,
    )
