"""The shape every diagnostic task shares, so that a trainer can drive any of them.

A task is a `DiagnosticTask` built from a validated config dataclass. It has a
`vocab` (`Vocab`: input vocabulary size, named special tokens, and the size and
meaning of the target class space) and produces `Example`s:

- `tokens`  LongTensor[T]: input token ids in `[0, vocab.vocab_size)`;
- `targets` LongTensor[T]: class ids in `[0, vocab.num_classes)` where `mask`
  is True and `IGNORE_INDEX` (-100, `F.cross_entropy`'s default) elsewhere;
- `mask`    BoolTensor[T]: the positions that are scored;
- `meta`: per-example ints for "accuracy by depth / length" tables;
- `position_meta`: per-position LongTensor[T]s for the same, where a quantity
  varies along the sequence (e.g. withheld moves so far). Their values are
  meaningful only where `mask` is True.

An `Example` unpacks as `tokens, targets, mask = example`.

`task.examples(seed)` is an endless stream drawn from
`numpy.random.default_rng(seed)`; `task.batch(n, seed)` stacks its first `n`
examples into a `Batch` of [B, T] tensors, right-padded with the PAD token,
`IGNORE_INDEX` targets and mask False. Both depend only on the config and the
seed, so they are identical in every process.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import ClassVar, Generic, TypeVar

import numpy as np
import torch

from rcswarm.data.validation import check_int, check_seed, is_int

IGNORE_INDEX = -100
"""Target value at unscored positions (the default `ignore_index` of `F.cross_entropy`)."""

PAD = "PAD"
"""Name of the padding token; every task's `Vocab.specials` has it."""

MAX_VOCAB = 1 << 20
"""The most input tokens (or label names, keys and values) a task config may ask for: 128 × the largest of the
papers' (MQAR's 8192). Larger pools took minutes and gigabytes to name before the first batch (fuzz review,
2026-11-29)."""

MAX_EXAMPLE_TOKENS = 1 << 20
"""The most tokens one example of a task config may have: thousands of times the papers' lengths (S5 to 180,
the maze's 640, MQAR's 256). Longer examples ran out of memory, or for hours, in the sampler."""


@dataclass(frozen=True)
class Vocab:
    """Input vocabulary and target class space of a task.

    `specials` maps names of special tokens (always including "PAD") to ids.
    `token_names[i]` is a readable name for input id i. `num_classes` is the
    size of the target space and `target_space` says what a class means;
    `targets_share_token_ids` is True when target class c denotes the same
    thing as input token id c.
    """

    vocab_size: int
    specials: Mapping[str, int]
    num_classes: int
    target_space: str
    targets_share_token_ids: bool
    token_names: tuple[str, ...] = field(repr=False)

    def __post_init__(self) -> None:
        check_int("Vocab", "vocab_size", self.vocab_size, 1)
        check_int("Vocab", "num_classes", self.num_classes, 1)
        if len(self.token_names) != self.vocab_size:
            raise ValueError(
                f"Vocab.token_names has {len(self.token_names)} names: expected vocab_size={self.vocab_size}"
            )
        if PAD not in self.specials:
            raise ValueError(f"Vocab.specials={dict(self.specials)!r}: expected a {PAD!r} entry")
        for name, token in self.specials.items():
            if not is_int(token) or not 0 <= token < self.vocab_size or self.token_names[token] != name:
                raise ValueError(
                    f"Vocab.specials[{name!r}]={token!r}: "
                    f"expected the id in [0, {self.vocab_size}) named {name!r}"
                )

    @property
    def pad_id(self) -> int:
        return self.specials[PAD]

    def decode(self, tokens: Iterable[int]) -> list[str]:
        """Readable names of a sequence of input ids."""
        return [self.token_names[int(t)] for t in tokens]


@dataclass(frozen=True)
class Example:
    """One sequence; unpacks as `(tokens, targets, mask)`. See the module docstring."""

    tokens: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    meta: Mapping[str, int] = field(default_factory=dict)
    position_meta: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.tokens, self.targets, self.mask))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def make_example(
    tokens: Sequence[int] | np.ndarray,
    targets: Sequence[int] | np.ndarray,
    mask: Sequence[bool] | np.ndarray,
    meta: Mapping[str, int] | None = None,
    position_meta: Mapping[str, Sequence[int] | np.ndarray] | None = None,
) -> Example:
    """Build an Example from arrays; targets outside the mask become IGNORE_INDEX."""
    tokens_t = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    mask_t = torch.as_tensor(np.asarray(mask, dtype=np.bool_))
    targets_t = torch.as_tensor(np.asarray(targets, dtype=np.int64)).masked_fill(~mask_t, IGNORE_INDEX)
    length = tokens_t.shape[0]
    positional = {k: torch.as_tensor(np.asarray(v, dtype=np.int64)) for k, v in (position_meta or {}).items()}
    for name, tensor in (("targets", targets_t), ("mask", mask_t), *positional.items()):
        if tensor.shape != (length,):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}: expected ({length},) like tokens")
    return Example(tokens_t, targets_t, mask_t, {k: int(v) for k, v in (meta or {}).items()}, positional)


@dataclass(frozen=True)
class Batch:
    """Examples stacked to [B, T] (right-padded); unpacks as `(tokens, targets, mask)`.

    `lengths[b]` is example b's unpadded length; `meta[k]` is LongTensor[B];
    `position_meta[k]` is LongTensor[B, T], zero in the padding.
    """

    tokens: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    meta: Mapping[str, torch.Tensor]
    position_meta: Mapping[str, torch.Tensor]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.tokens, self.targets, self.mask))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def _pad_stack(rows: Sequence[torch.Tensor], width: int, fill: int | bool) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    """Stack examples into a Batch, padding with `pad_id`, IGNORE_INDEX and mask False."""
    if not examples:
        raise ValueError("examples is empty: expected at least one Example")
    meta_keys, pos_keys = set(examples[0].meta), set(examples[0].position_meta)
    for i, ex in enumerate(examples):
        if set(ex.meta) != meta_keys or set(ex.position_meta) != pos_keys:
            raise ValueError(f"examples[{i}] has different metadata keys from examples[0]")
    width = max(len(ex) for ex in examples)
    return Batch(
        tokens=_pad_stack([ex.tokens for ex in examples], width, pad_id),
        targets=_pad_stack([ex.targets for ex in examples], width, IGNORE_INDEX),
        mask=_pad_stack([ex.mask for ex in examples], width, False),
        lengths=torch.tensor([len(ex) for ex in examples], dtype=torch.int64),
        meta={k: torch.tensor([ex.meta[k] for ex in examples], dtype=torch.int64) for k in sorted(meta_keys)},
        position_meta={
            k: _pad_stack([ex.position_meta[k] for ex in examples], width, 0) for k in sorted(pos_keys)
        },
    )


ConfigT = TypeVar("ConfigT")


class DiagnosticTask(ABC, Generic[ConfigT]):
    """A seeded example generator with a fixed vocabulary; subclasses implement `sample`."""

    name: ClassVar[str]
    config_type: ClassVar[type]

    def __init__(self, config: ConfigT | None = None) -> None:
        if config is None:
            config = self.config_type()
        if not isinstance(config, self.config_type):
            raise ValueError(
                f"config={config!r}: expected a {self.config_type.__name__} for task {self.name!r}"
            )
        self._config = config

    @property
    def config(self) -> ConfigT:
        return self._config

    @property
    @abstractmethod
    def vocab(self) -> Vocab:
        """The input vocabulary and target space (fixed by the config)."""

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Example:
        """Draw one example, consuming randomness only from `rng`."""

    def examples(self, seed: int) -> Iterator[Example]:
        """Endless deterministic stream of examples for `seed`."""
        check_seed(seed)
        rng = np.random.default_rng(seed)
        while True:
            yield self.sample(rng)

    def batch(self, n: int, seed: int) -> Batch:
        """The first `n` examples of `examples(seed)`, stacked and padded."""
        check_int(f"{type(self).__name__}.batch", "n", n, 1)
        return collate(list(islice(self.examples(seed), n)), self.vocab.pad_id)
