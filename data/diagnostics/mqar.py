"""Multi-Query Associative Recall (MQAR).

The task (Arora et al., 2023, "Zoology"): a sequence of key-value pairs
followed by queries of the keys; the target at each query position is the
value bound to that key. Facts taken from Zoology's definition: keys come from
the lower half of the data tokens and values from the upper half, both drawn
without replacement per example; the pairs fill the first 2 * num_kv_pairs
positions; every key is queried exactly once, at query slots that sit at even
offsets 2g of the remaining region (g in [0, (seq_len - 2N) // 2), so a query
is never directly followed by another); Zoology draws g with
p(g) proportional to (g + 1) ** (power_a - 1), power_a = 0.01, which puts
most queries right after the pairs ("nearby"). The source paper (002,
Sec. 4.2) instead samples queries uniformly over the rest of the sequence,
vocab 8192 and 8 pairs, which makes the task harder ("uniform", our default).

Choices of ours: ids PAD 0 and BLANK 1 are special, data tokens are
[2, vocab_size); non-query positions after the pairs hold `filler`: random
value tokens ("noise", like Zoology's random non-queries but never a key, so
every key token after the pairs is a scored query) or BLANK ("blank").

Tokens: `k_1 v_1 ... k_N v_N` then the query region. Targets are input token
ids (num_classes = vocab_size; only value ids occur). Metadata: `num_kv_pairs`,
`max_distance`; per position `distance` = query position - key position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rcswarm.data.diagnostics.base import (
    MAX_EXAMPLE_TOKENS,
    MAX_VOCAB,
    PAD,
    DiagnosticTask,
    Example,
    Vocab,
    make_example,
)
from rcswarm.data.validation import check_choice, check_int, check_probability

PLACEMENTS: tuple[str, ...] = ("uniform", "nearby")
FILLERS: tuple[str, ...] = ("noise", "blank")
BLANK = "BLANK"
FIRST_DATA_ID = 2


@dataclass(frozen=True)
class MQARConfig:
    """MQAR settings; validated on construction.

    Defaults: the source paper's vocab 8192 and 8 pairs, uniform queries, length 256. At most MAX_VOCAB
    tokens and MAX_EXAMPLE_TOKENS positions.
    """

    length_fields = ("seq_len",)
    """The fields that set `max_tokens`."""

    vocab_size: int = 8192
    num_kv_pairs: int = 8
    seq_len: int = 256
    placement: str = "uniform"
    power_a: float = 0.01
    filler: str = "noise"

    def __post_init__(self) -> None:
        owner = "MQARConfig"
        check_int(owner, "num_kv_pairs", self.num_kv_pairs, 1, min(MAX_VOCAB - FIRST_DATA_ID, MAX_EXAMPLE_TOKENS) // 4)
        check_int(owner, "vocab_size", self.vocab_size, FIRST_DATA_ID + 2 * self.num_kv_pairs, MAX_VOCAB)
        check_int(owner, "seq_len", self.seq_len, 4 * self.num_kv_pairs, MAX_EXAMPLE_TOKENS)
        check_choice(owner, "placement", self.placement, PLACEMENTS)
        check_probability(owner, "power_a", self.power_a, open_low=True)
        check_choice(owner, "filler", self.filler, FILLERS)

    @property
    def max_tokens(self) -> int:
        """Tokens of every example."""
        return self.seq_len

    @property
    def num_keys(self) -> int:
        """Size of the key range [2, 2 + num_keys); values take the rest."""
        return (self.vocab_size - FIRST_DATA_ID) // 2

    @property
    def first_value_id(self) -> int:
        return FIRST_DATA_ID + self.num_keys

    @property
    def num_slots(self) -> int:
        """Query slots after the pairs (at even offsets)."""
        return (self.seq_len - 2 * self.num_kv_pairs) // 2


def slot_probabilities(config: MQARConfig) -> np.ndarray:
    """P(a query lands in slot g) for one draw: uniform, or Zoology's power law for "nearby"."""
    slots = np.arange(1, config.num_slots + 1, dtype=np.float64)
    weights = np.ones_like(slots) if config.placement == "uniform" else slots ** (config.power_a - 1.0)
    return weights / weights.sum()


class MQARTask(DiagnosticTask[MQARConfig]):
    """MQAR examples; targets are the bound values at the query positions."""

    name = "mqar"
    config_type = MQARConfig

    def __init__(self, config: MQARConfig | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        names = (
            PAD,
            BLANK,
            *(f"K{i}" for i in range(cfg.num_keys)),
            *(f"V{i}" for i in range(cfg.vocab_size - cfg.first_value_id)),
        )
        self._vocab = Vocab(
            vocab_size=cfg.vocab_size,
            specials={PAD: 0, BLANK: 1},
            num_classes=cfg.vocab_size,
            target_space="input token ids (the value bound to the queried key)",
            targets_share_token_ids=True,
            token_names=names,
        )
        self._slot_p = slot_probabilities(cfg)

    @property
    def vocab(self) -> Vocab:
        return self._vocab

    def _filler(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.config.filler == "blank":
            return np.full(n, 1, dtype=np.int64)
        return rng.integers(self.config.first_value_id, self.config.vocab_size, size=n)

    def sample(self, rng: np.random.Generator) -> Example:
        cfg = self.config
        n, context = cfg.num_kv_pairs, 2 * cfg.num_kv_pairs
        keys = FIRST_DATA_ID + rng.choice(cfg.num_keys, size=n, replace=False)
        values = cfg.first_value_id + rng.choice(cfg.vocab_size - cfg.first_value_id, size=n, replace=False)
        slots = rng.choice(cfg.num_slots, size=n, replace=False, p=self._slot_p)
        tokens = np.empty(cfg.seq_len, dtype=np.int64)
        tokens[0:context:2], tokens[1:context:2] = keys, values
        tokens[context:] = self._filler(rng, cfg.seq_len - context)
        query_at = context + 2 * slots
        tokens[query_at] = keys
        targets = np.zeros(cfg.seq_len, dtype=np.int64)
        targets[query_at] = values
        mask = np.zeros(cfg.seq_len, dtype=np.bool_)
        mask[query_at] = True
        distance = np.zeros(cfg.seq_len, dtype=np.int64)
        distance[query_at] = query_at - 2 * np.arange(n)
        meta = {"num_kv_pairs": n, "max_distance": int(distance.max())}
        return make_example(tokens, targets, mask, meta, {"distance": distance})
