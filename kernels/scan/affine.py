"""The associative affine aggregator (Lemma 3.4) and the scan of affine recurrences.

An affine layer updates its state as S_t = E_t ▸ S_{t-1} + f_t with S_{-1} = 0. Conventions:

- State S (and offset f): [*batch, d_v, d_k], value-major as in Table 1 (f = v kᵀ; read out
  o = S q). Sequences are time-major: [T, *batch, d_v, d_k].
- ▸ acts on the RIGHT, as Table 1 writes DeltaNet, s_{t-1}(I - β k kᵀ):
  "matrix"   E [*batch, d_k, d_k],  E ▸ S = S @ E;
  "diagonal" E of S's rank, broadcastable to S,  E ▸ S = E * S. [*batch, 1, d_k] is
  S diag(α) = (1 αᵀ) ⊙ S (GLA), [*batch, 1, 1] a scalar gate γ I (RetNet; ones for I),
  [*batch, d_v, d_k] a per-entry gate (Mamba-like).
- A right action composes in time order: applying E_a then E_b is S E_a E_b, so the paper's
  E_b ∘ E_a is the matrix product E_a @ E_b here.
- Operand order is this package's op(earlier, later). Lemma 3.4 writes the later element on
  the left, (E_2, f_2) ⊕ (E_1, f_1) = (E_2 ∘ E_1, f_2 + E_2 ▸ f_1); hence

      op((E_a, f_a), (E_b, f_b)) = (E_a @ E_b, f_a @ E_b + f_b)    matrix
      op((E_a, f_a), (E_b, f_b)) = (E_a * E_b, f_a * E_b + f_b)    diagonal

  with identity (I, 0), and the inclusive prefix at t is (E_0 ... E_t, S_t).
- A system acting on the left, s_t = A s_{t-1} + B x_t on column vectors, is scanned
  transposed: state s_tᵀ as [*batch, 1, d], E_t = Aᵀ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from rcswarm.kernels.scan.dispatch import ScanMethod, prefix_scan
from rcswarm.kernels.scan.tree import Element, Operator, describe

AffineKind = Literal["diagonal", "matrix"]
AFFINE_KINDS: tuple[AffineKind, ...] = ("diagonal", "matrix")


@dataclass(frozen=True)
class AffineSequence:
    """Per-step affine maps (E_t, f_t), time-major; validated on construction.

    offset f: [T, *batch, d_v, d_k]. transition E: [T, *batch, d_k, d_k] for kind "matrix",
    for kind "diagonal" the rank of f with every dim after T equal to f's or 1.
    """

    transition: Tensor
    offset: Tensor
    kind: AffineKind

    def __post_init__(self) -> None:
        if self.kind not in AFFINE_KINDS:
            raise ValueError(f"kind={self.kind!r}: expected one of {', '.join(map(repr, AFFINE_KINDS))}")
        if self.offset.dim() < 3 or self.offset.shape[0] == 0:
            raise ValueError(f"offset={describe(self.offset)}: expected [T >= 1, *batch, d_v, d_k]")
        if self.transition.dtype != self.offset.dtype or self.transition.device != self.offset.device:
            raise ValueError(
                f"transition={describe(self.transition)} on {self.transition.device}: expected the offset's "
                f"dtype and device ({describe(self.offset)} on {self.offset.device})"
            )
        problem = _transition_shape_problem(self.transition.shape, self.offset.shape, self.kind)
        if problem:
            raise ValueError(
                f"transition={describe(self.transition)} for offset {describe(self.offset)}: {problem}"
            )

    @property
    def elements(self) -> tuple[Tensor, Tensor]:
        """The scan elements (E, f), stacked on dim 0 (time)."""
        return (self.transition, self.offset)


def _transition_shape_problem(transition: torch.Size, offset: torch.Size, kind: AffineKind) -> str:
    """'' if the transition shape fits the offset shape, else what was expected."""
    if kind == "matrix":
        d_k = offset[-1]
        wanted = (*offset[:-2], d_k, d_k)
        if tuple(transition) == wanted:
            return ""
        return f"expected [T, *batch, d_k, d_k] = {list(wanted)} (kind 'matrix')"
    fits = len(transition) == len(offset) and transition[0] == offset[0]
    fits = fits and all(size in (1, full) for size, full in zip(transition[1:], offset[1:]))
    if fits:
        return ""
    return "expected the offset's rank, T on dim 0 and every other dim equal to the offset's or 1 (kind 'diagonal')"


def matrix_combine(earlier: Element, later: Element) -> Element:
    """(E_a, f_a) then (E_b, f_b): (E_a @ E_b, f_a @ E_b + f_b), batched [K, ...]."""
    transition_a, offset_a = _pair(earlier)
    transition_b, offset_b = _pair(later)
    transition = transition_a @ transition_b  # [K, *batch, d_k, d_k]
    offset = offset_a @ transition_b + offset_b  # [K, *batch, d_v, d_k]
    return (transition, offset)


def diagonal_combine(earlier: Element, later: Element) -> Element:
    """(E_a, f_a) then (E_b, f_b): (E_a * E_b, f_a * E_b + f_b), batched [K, ...]."""
    transition_a, offset_a = _pair(earlier)
    transition_b, offset_b = _pair(later)
    transition = transition_a * transition_b  # E's shape, e.g. [K, *batch, 1, d_k]
    offset = offset_a * transition_b + offset_b  # [K, *batch, d_v, d_k]
    return (transition, offset)


def _pair(element: Element) -> tuple[Tensor, Tensor]:
    assert isinstance(element, tuple) and len(element) == 2
    return element[0], element[1]


def affine_operator(kind: AffineKind) -> Operator:
    """The batched aggregator of Lemma 3.4 for `kind`, in op(earlier, later) order."""
    if kind == "matrix":
        return matrix_combine
    if kind == "diagonal":
        return diagonal_combine
    raise ValueError(f"kind={kind!r}: expected one of {', '.join(map(repr, AFFINE_KINDS))}")


def affine_identity(sequence: AffineSequence) -> tuple[Tensor, Tensor]:
    """(I, 0) shaped like one element of `sequence`."""
    transition, offset = sequence.transition[0], sequence.offset[0]
    zero = torch.zeros_like(offset)  # [*batch, d_v, d_k]
    if sequence.kind == "diagonal":
        return (torch.ones_like(transition), zero)
    eye = torch.eye(offset.shape[-1], dtype=offset.dtype, device=offset.device)  # [d_k, d_k]
    return (eye.expand_as(transition), zero)


def affine_scan(sequence: AffineSequence, method: ScanMethod = "blelloch") -> Tensor:
    """The states S_0..S_{T-1} [T, *batch, d_v, d_k] of S_t = E_t ▸ S_{t-1} + f_t, S_{-1} = 0."""
    prefixes = prefix_scan(affine_operator(sequence.kind), sequence.elements, affine_identity(sequence), method)
    _, states = _pair(prefixes.inclusive)
    return states
