"""A case-aware subword tokenizer of editor action streams (Hugging Face `tokenizers`, BPE).

The action stream is first written as text, one character per action: a typed
character is itself, control k is U+F0000 + k (the replay treats files holding
characters of U+F0000..U+F00FF as binary, so the mapping is one to one).

Pre-tokenization is expressible with the library's built-in components (no
custom Python pre-tokenizer, so the tokenizer serializes to one JSON file): a
`Split` on the regex `CASE_PATTERN` with behavior "isolated" cuts the text into
words at camelCase / PascalCase / snake_case / digit boundaries (`parseHTTPResponse_code`
-> `parse`, `HTTP`, `Response`, `_`, `code`), whitespace runs and single other
characters; then `ByteLevel` (no prefix space, no regex) maps each piece to
bytes, so every string is encodable (no unknown token) and the `ByteLevel`
decoder gives back the input exactly. BPE merges are learned only inside
pieces, by frequency, up to `vocab_size` tokens (at least the 256 byte tokens).

Each token's offsets say which actions it covers: token t starts at action
`offsets[t][0]`. A character whose UTF-8 bytes were not merged into one token
spans several tokens; they all start at that character's action.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from rcswarm.data.frames.git_editor import CONTROL_BASE

CONTROL_CHAR_BASE = 0xF0000
CASE_PATTERN = r"\p{Lu}?\p{Ll}+|\p{Lu}+(?!\p{Ll})|\p{N}+| +|\t+|[^\p{L}\p{N} \t]|\p{L}"


def actions_to_text(actions: Iterable[int]) -> str:
    """One character per action (controls as U+F0000 + k)."""
    return "".join(chr(a) if a < CONTROL_BASE else chr(CONTROL_CHAR_BASE + a - CONTROL_BASE) for a in actions)


def text_to_actions(text: str) -> list[int]:
    out = []
    for ch in text:
        o = ord(ch)
        out.append(CONTROL_BASE + o - CONTROL_CHAR_BASE if CONTROL_CHAR_BASE <= o <= CONTROL_CHAR_BASE + 0xFF else o)
    return out


class ActionTokenizer:
    """Wraps a trained `tokenizers.Tokenizer`; `encode` / `decode` round-trip exactly."""

    def __init__(self, tokenizer) -> None:
        self.tk = tokenizer

    @staticmethod
    def _empty():
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(CASE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tk.decoder = decoders.ByteLevel()
        return tk

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 4096) -> ActionTokenizer:
        """Learn a vocabulary of `vocab_size` tokens (>= 256) from action texts."""
        from tokenizers import pre_tokenizers, trainers

        if vocab_size < 256:
            raise ValueError(f"vocab_size={vocab_size}: expected >= 256 (the byte alphabet)")
        tk = cls._empty()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
            special_tokens=[],
        )
        tk.train_from_iterator(texts, trainer=trainer)
        return cls(tk)

    @classmethod
    def load(cls, path: str | Path) -> ActionTokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        self.tk.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size()

    def encode_text(self, text: str) -> tuple[list[int], list[int]]:
        """(token ids, start character of each token)."""
        enc = self.tk.encode(text, add_special_tokens=False)
        return enc.ids, [o[0] for o in enc.offsets]

    def encode(self, actions: Iterable[int]) -> tuple[list[int], list[int]]:
        """(token ids, index of each token's first action)."""
        return self.encode_text(actions_to_text(actions))

    def decode_text(self, ids: Iterable[int]) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=False)

    def decode(self, ids: Iterable[int]) -> list[int]:
        return text_to_actions(self.decode_text(ids))


def chunk_text(text: str, size: int = 1 << 16) -> Iterator[tuple[int, str]]:
    """(start, chunk) pieces of at most ~size characters, cut after a newline when possible."""
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            cut = text.rfind("\n", start, end)
            if cut > start:
                end = cut + 1
        yield start, text[start:end]
        start = end


def encode_stream(tok: ActionTokenizer, actions: np.ndarray,
                  on_chunk: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (uint32) and their first-action indices (int64) for a whole action stream, in chunks;
    `on_chunk(n)` is told after each chunk of n actions (a progress bar)."""
    text = actions_to_text(actions.tolist())
    ids: list[int] = []
    starts: list[int] = []
    for base, chunk in chunk_text(text):
        i, s = tok.encode_text(chunk)
        ids += i
        starts += [base + x for x in s]
        if on_chunk is not None:
            on_chunk(len(chunk))
    return np.asarray(ids, np.uint32), np.asarray(starts, np.int64)
