"""Scan elements: a tensor or a tuple of tensors, stored stacked along dim 0.

A *sequence* of n elements keeps each leaf as one tensor [n, *S_j]; a single element has the
same structure without that dim, [*S_j]. Operators are batched over dim 0:
`op(left, right)` takes two stacked elements [K, *S_j] and returns one [K, *S_j] whose row k
combines left[k], the EARLIER operand, with right[k], the LATER one. Every scan in this
package uses that argument order.

This module holds the shared types and the helpers that validate user input (ValueError) and
slice, join and combine elements while keeping their structure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from rcswarm.kernels.checks import describe

Element = Tensor | tuple[Tensor, ...]
"""One scan element (no sequence dim) or a stacked sequence/batch of them (dim 0)."""

Operator = Callable[[Element, Element], Element]
"""Batched binary operator: op(earlier [K, *S], later [K, *S]) -> [K, *S]."""

_Signature = tuple[bool, tuple[tuple[tuple[int, ...], torch.dtype, torch.device], ...]]


class Prefixes(NamedTuple):
    """Both prefix arrays of a sequence of n elements, each stacked [n, *S_j].

    exclusive[i] aggregates elements 0..i-1, so exclusive[0] is the identity: it is the PSM
    state s_{i-1} of the chunks before chunk i. inclusive[i] aggregates elements 0..i.
    The two are one array shifted by one: inclusive[i] is exclusive[i + 1] for i < n - 1.
    """

    exclusive: Element
    inclusive: Element


def leaves_of(element: object, name: str) -> tuple[Tensor, ...]:
    """The tensors of an element; ValueError unless it is a tensor or a non-empty tuple of them."""
    if isinstance(element, Tensor):
        return (element,)
    if isinstance(element, tuple) and element and all(isinstance(leaf, Tensor) for leaf in element):
        return element
    raise ValueError(f"{name}={describe(element)}: expected a tensor or a non-empty tuple of tensors")


def tree_map(fn: Callable[[Tensor], Tensor], element: Element) -> Element:
    """Apply `fn` to every leaf, keeping the structure."""
    if isinstance(element, Tensor):
        return fn(element)
    return tuple(fn(leaf) for leaf in element)


def _zip_map(fn: Callable[..., Tensor], elements: Sequence[Element]) -> Element:
    """Apply `fn` leaf-wise across elements of one structure (the first one's)."""
    if isinstance(elements[0], Tensor):
        return fn(*elements)
    return tuple(fn(*group) for group in zip(*elements))


def _signature(element: Element, drop_leading: bool) -> _Signature:
    start = 1 if drop_leading else 0
    leaves = (element,) if isinstance(element, Tensor) else element
    return (
        isinstance(element, Tensor),
        tuple((tuple(leaf.shape[start:]), leaf.dtype, leaf.device) for leaf in leaves),
    )


def sequence_length(elements: object, name: str = "elements") -> int:
    """n for a stacked sequence [n, *S_j]; ValueError if empty, unstacked or ragged."""
    leaves = leaves_of(elements, name)
    if any(leaf.dim() == 0 for leaf in leaves):
        raise ValueError(f"{name}={describe(elements)}: expected every leaf to carry the sequence on dim 0")
    lengths = {leaf.shape[0] for leaf in leaves}
    if len(lengths) != 1:
        raise ValueError(f"{name}={describe(elements)}: leaves disagree on the sequence length (dim 0)")
    n = lengths.pop()
    if n == 0:
        raise ValueError(f"{name}={describe(elements)}: expected at least one element, got an empty sequence")
    return n


def check_element(element: object, sequence: Element, name: str) -> None:
    """ValueError unless `element` is one element of `sequence` (structure, shapes, dtypes, devices)."""
    leaves_of(element, name)
    assert isinstance(element, (Tensor, tuple))
    if _signature(element, drop_leading=False) != _signature(sequence, drop_leading=True):
        expected = describe(tree_map(lambda leaf: leaf[0], sequence))
        raise ValueError(
            f"{name}={describe(element)}: expected one element shaped like the sequence's items, {expected} "
            "(same structure, shapes, dtypes and devices)"
        )


def combine(op: Operator, earlier: Element, later: Element) -> Element:
    """One batched operator call [K, *S] x [K, *S] -> [K, *S]; ValueError if op breaks the contract."""
    out = op(earlier, later)
    leaves_of(out, "op(...) result")
    assert isinstance(out, (Tensor, tuple))
    if _signature(out, drop_leading=False) != _signature(earlier, drop_leading=False):
        raise ValueError(
            f"op returned {describe(out)} for operands {describe(earlier)}: expected the operands' "
            "structure, shapes (batch dim 0 included) and dtypes"
        )
    return out


def combine_one(op: Operator, earlier: Element, later: Element) -> Element:
    """The operator on two single elements, as a batch of K = 1."""
    out = combine(op, unsqueeze0(earlier), unsqueeze0(later))
    return tree_map(lambda leaf: leaf[0], out)


def unsqueeze0(element: Element) -> Element:
    """A single element as a sequence of one, [1, *S_j]."""
    return tree_map(lambda leaf: leaf.unsqueeze(0), element)


def row(elements: Element, index: int) -> Element:
    """Element `index` of a stacked sequence, without the sequence dim."""
    return tree_map(lambda leaf: leaf[index], elements)


def take(elements: Element, index: slice) -> Element:
    """Rows `index` of a stacked sequence."""
    return tree_map(lambda leaf: leaf[index], elements)


def stack(items: Sequence[Element]) -> Element:
    """Single elements [*S_j] -> one stacked sequence [len(items), *S_j]."""
    return _zip_map(lambda *leaves: torch.stack(leaves), items)


def cat(parts: Sequence[Element]) -> Element:
    """Stacked sequences joined along dim 0."""
    return _zip_map(lambda *leaves: torch.cat(leaves), parts)


def interleave(even: Element, odd: Element) -> Element:
    """[e0, o0, e1, o1, ...] from even [m, *S] and odd [m or m - 1, *S]."""

    def leafwise(even_leaf: Tensor, odd_leaf: Tensor) -> Tensor:
        paired = odd_leaf.shape[0]
        assert even_leaf.shape[0] - paired in (0, 1)
        pairs = torch.stack((even_leaf[:paired], odd_leaf), dim=1).flatten(0, 1)  # [2 * paired, *S]
        return torch.cat((pairs, even_leaf[paired:]))

    return _zip_map(leafwise, (even, odd))
