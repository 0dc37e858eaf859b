"""S5 state tracking, as in the source paper (002, Sec. 4.1; after Merrill et al., 2024).

The task: a sequence of permutations of 5 elements; the target at every
position is the composition of all permutations so far (the "cups and balls"
state). The paper trains on lengths 4 to 18 in a curriculum and evaluates on
lengths up to 180; `LengthCurriculum` and `evaluation_configs` provide that.

Conventions (ours): a permutation is a tuple `p` mapping i to `p[i]`; the 120
permutations are indexed in lexicographic order of these tuples
(`itertools.permutations(range(5))`), so index 0 is the identity.
`compose(first, second)` applies `first`, then `second`:
`compose(first, second)[i] = second[first[i]]`. The state after tokens
g_1..g_t is s_t = compose(s_{t-1}, g_t) with s_0 the identity, i.e.
s_t[i] = g_t[...g_2[g_1[i]]...]. Each token is drawn uniformly from the 120.

Tokens: permutation index 0..119, PAD 120 (vocab_size 121). Targets: the
index of s_t at every position (num_classes 120; class c is the permutation
of token id c). Metadata: `length`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import permutations

import numpy as np

from rcswarm.data.diagnostics.base import (
    MAX_EXAMPLE_TOKENS,
    PAD,
    DiagnosticTask,
    Example,
    Vocab,
    make_example,
)
from rcswarm.data.validation import check_bool, check_int

PERMUTATIONS: tuple[tuple[int, ...], ...] = tuple(permutations(range(5)))
"""All 120 permutations of 0..4 in lexicographic order; PERMUTATIONS[0] is the identity."""
NUM_ELEMENTS = len(PERMUTATIONS)
PAD_ID = NUM_ELEMENTS
_INDEX: dict[tuple[int, ...], int] = {p: i for i, p in enumerate(PERMUTATIONS)}


def permutation_to_index(perm: Sequence[int]) -> int:
    """Index (= token id) of a permutation of 0..4; ValueError if `perm` is not one."""
    key = tuple(int(x) for x in perm)
    if key not in _INDEX:
        raise ValueError(f"perm={perm!r}: expected a permutation of 0..4")
    return _INDEX[key]


def index_to_permutation(index: int) -> tuple[int, ...]:
    """The permutation with index (= token id) `index`."""
    check_int("index_to_permutation", "index", index, 0, NUM_ELEMENTS - 1)
    return PERMUTATIONS[int(index)]


def compose(first: Sequence[int], second: Sequence[int]) -> tuple[int, ...]:
    """`first` then `second`: i -> second[first[i]]."""
    return tuple(second[first[i]] for i in range(len(first)))


@functools.cache
def product_table() -> np.ndarray:
    """product_table()[a, b] = index of compose(PERMUTATIONS[a], PERMUTATIONS[b]); built on first use (0.1–0.2 s, kept
    out of the import of every worker)."""
    table = np.empty((NUM_ELEMENTS, NUM_ELEMENTS), dtype=np.int64)
    for a, first in enumerate(PERMUTATIONS):
        for b, second in enumerate(PERMUTATIONS):
            table[a, b] = _INDEX[compose(first, second)]
    table.setflags(write=False)
    return table



def running_products(tokens: Iterable[int]) -> np.ndarray:
    """Index of the state s_t after each token (see the module docstring)."""
    table = product_table().tolist()
    state, out = 0, []
    for token in tokens:
        state = table[state][int(token)]
        out.append(state)
    return np.asarray(out, dtype=np.int64)


@dataclass(frozen=True)
class S5Config:
    """S5 settings; validated on construction. Lengths are uniform in [min_length, max_length], at most
    MAX_EXAMPLE_TOKENS."""

    min_length: int = 4
    max_length: int = 18

    length_fields = ("max_length",)
    """The fields that set `max_tokens`."""

    def __post_init__(self) -> None:
        check_int("S5Config", "min_length", self.min_length, 1, MAX_EXAMPLE_TOKENS)
        check_int("S5Config", "max_length", self.max_length, self.min_length, MAX_EXAMPLE_TOKENS)

    @property
    def max_tokens(self) -> int:
        """Tokens of the longest example."""
        return self.max_length


class S5Task(DiagnosticTask[S5Config]):
    """Sequences of uniform random permutations; target = running product at every position."""

    name = "s5"
    config_type = S5Config

    def __init__(self, config: S5Config | None = None) -> None:
        super().__init__(config)
        self._vocab = Vocab(
            vocab_size=NUM_ELEMENTS + 1,
            specials={PAD: PAD_ID},
            num_classes=NUM_ELEMENTS,
            target_space="index of the running product s_t (same indexing as the input tokens)",
            targets_share_token_ids=True,
            token_names=(*("".join(map(str, p)) for p in PERMUTATIONS), PAD),
        )

    @property
    def vocab(self) -> Vocab:
        return self._vocab

    def sample(self, rng: np.random.Generator) -> Example:
        length = int(rng.integers(self.config.min_length, self.config.max_length + 1))
        tokens = rng.integers(NUM_ELEMENTS, size=length)
        targets = running_products(tokens)
        return make_example(tokens, targets, np.ones(length, dtype=np.bool_), {"length": length})


@dataclass(frozen=True)
class LengthCurriculum:
    """Training lengths that grow with the step: the source paper's 4 -> 18 curriculum.

    At `step` the longest length is `min(final_length, start_length + step //
    steps_per_length)`. With `keep_shorter` (default) lengths are drawn from
    `[start_length, longest]`, so short sequences stay in the mix; otherwise
    every sequence has the longest length.
    """

    start_length: int = 4
    final_length: int = 18
    steps_per_length: int = 1000
    keep_shorter: bool = True

    def __post_init__(self) -> None:
        check_int("LengthCurriculum", "start_length", self.start_length, 1)
        check_int("LengthCurriculum", "final_length", self.final_length, self.start_length)
        check_int("LengthCurriculum", "steps_per_length", self.steps_per_length, 1)
        check_bool("LengthCurriculum", "keep_shorter", self.keep_shorter)

    def length_at(self, step: int) -> int:
        """The longest training length at `step` (>= 0)."""
        check_int("LengthCurriculum.length_at", "step", step, 0)
        return min(self.final_length, self.start_length + step // self.steps_per_length)

    def config_at(self, step: int) -> S5Config:
        """The S5Config to train with at `step`."""
        longest = self.length_at(step)
        return S5Config(self.start_length if self.keep_shorter else longest, longest)


def evaluation_configs(lengths: Iterable[int] = range(20, 181, 20)) -> list[S5Config]:
    """One fixed-length S5Config per evaluation length (default 20, 40, ..., 180)."""
    return [S5Config(int(n), int(n)) for n in lengths]
