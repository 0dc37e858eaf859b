"""Byte-level text corpus from the running interpreter's standard library.

`load_stdlib_corpus()` concatenates the standard library's .py sources into
one `bytes` object (deterministic for a given interpreter installation), and
`ByteWindowSampler` draws seeded random windows of it as (inputs, targets)
batches for next-byte prediction.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rcswarm.data.validation import check_int

EXCLUDED_DIRS: frozenset[str] = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)
"""Directory names skipped anywhere below the stdlib root (installed packages, test suites)."""

SPLITS: tuple[str, ...] = ("train", "val")


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_source_files(root: Path | None = None) -> list[Path]:
    """Every .py file under the stdlib directory (or `root`), sorted by relative path.

    Directories named in `EXCLUDED_DIRS` are skipped, and symlinked
    directories are not followed. Returns an empty list if nothing matches.
    """
    root = _stdlib_root() if root is None else Path(root)
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for filename in filenames:
            if not filename.endswith(".py"):
                continue
            path = Path(dirpath, filename)
            if path.is_file():
                found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda item: item[0])
    return [path for _, path in found]


def load_stdlib_corpus(max_bytes: int | None = None, *, root: Path | None = None) -> bytes:
    """The stdlib sources concatenated in sorted order, truncated to `max_bytes`.

    Each file is preceded by the line `# file: <relative/path.py>\\n`. The
    result depends only on the files on disk, so it is the same in every
    process on the same installation. Raises FileNotFoundError if no source
    file is found and ValueError for a bad `max_bytes`.
    """
    if max_bytes is not None and (
        isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0
    ):
        raise ValueError(f"max_bytes={max_bytes!r}: expected a positive int or None")
    root = _stdlib_root() if root is None else Path(root)
    files = stdlib_source_files(root)
    if not files:
        raise FileNotFoundError(
            f"no .py files found under the standard library directory {str(root)!r}"
        )
    parts: list[bytes] = []
    total = 0
    for path in files:
        header = f"# file: {path.relative_to(root).as_posix()}\n".encode()
        for chunk in (header, path.read_bytes()):
            parts.append(chunk)
            total += len(chunk)
        if max_bytes is not None and total >= max_bytes:
            break
    corpus = b"".join(parts)
    return corpus if max_bytes is None else corpus[:max_bytes]


def split_boundary(n_bytes: int, val_fraction: float) -> int:
    """Where a corpus of `n_bytes` splits: training is [0, boundary), held-out [boundary, n_bytes)."""
    return n_bytes - int(n_bytes * val_fraction)


@dataclass
class ByteWindowSampler:
    """Seeded random windows of a byte corpus as next-byte prediction batches.

    The corpus is split at `len(corpus) - int(len(corpus) * val_fraction)`:
    bytes before the boundary form the "train" split, the rest the "val"
    split, and a window never crosses the boundary. `next_batch()` draws
    `batch_size` uniform offsets with a numpy Generator seeded by `seed`, so
    the same arguments give the same sequence of batches in any process.
    """

    corpus: bytes = field(repr=False)
    seq_len: int
    batch_size: int
    seed: int
    split: str = "train"
    val_fraction: float = 0.05
    _data: np.ndarray = field(init=False, repr=False, compare=False)
    _rng: np.random.Generator = field(init=False, repr=False, compare=False)
    _start: int = field(init=False, repr=False, compare=False)
    _end: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.corpus, (bytes, bytearray, memoryview)):
            raise ValueError(
                f"ByteWindowSampler.corpus of type {type(self.corpus).__name__}: expected bytes"
            )
        check_int("ByteWindowSampler", "seq_len", self.seq_len, 1)
        check_int("ByteWindowSampler", "batch_size", self.batch_size, 1)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"ByteWindowSampler.seed={self.seed!r}: expected a non-negative int")
        if self.split not in SPLITS:
            raise ValueError(f"ByteWindowSampler.split={self.split!r}: expected one of {SPLITS}")
        if (
            isinstance(self.val_fraction, bool)
            or not isinstance(self.val_fraction, (int, float))
            or not 0.0 <= self.val_fraction < 1.0
        ):
            raise ValueError(
                f"ByteWindowSampler.val_fraction={self.val_fraction!r}: "
                "expected a float with 0 <= val_fraction < 1"
            )
        self._data = np.frombuffer(self.corpus, dtype=np.uint8)  # [N], a view, no copy
        n = self._data.shape[0]
        boundary = split_boundary(n, self.val_fraction)
        self._start, self._end = (0, boundary) if self.split == "train" else (boundary, n)
        if self._end - self._start < self.seq_len + 1:
            raise ValueError(
                f"ByteWindowSampler.seq_len={self.seq_len}: the {self.split!r} split has "
                f"{self._end - self._start} bytes (corpus {n} bytes, val_fraction "
                f"{self.val_fraction}); expected at least seq_len + 1 = {self.seq_len + 1}"
            )
        self._rng = np.random.default_rng(self.seed)

    @property
    def split_bounds(self) -> tuple[int, int]:
        """[start, end) byte range of the corpus this sampler draws windows from."""
        return self._start, self._end

    @property
    def tokens_per_batch(self) -> int:
        """Number of predicted tokens in one batch: batch_size * seq_len."""
        return self.batch_size * self.seq_len

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), both contiguous int64 [batch_size, seq_len].

        Row b is the corpus window [o_b, o_b + seq_len + 1) split into
        inputs = window[:-1] and targets = window[1:], so targets[:, t] is the
        byte that follows inputs[:, t].
        """
        window = self.seq_len + 1
        offsets = self._rng.integers(
            self._start, self._end - window, size=self.batch_size, endpoint=True
        )  # [B]
        index = offsets[:, None] + np.arange(window)[None, :]  # [B, T + 1]
        windows = torch.from_numpy(self._data[index].astype(np.int64))  # [B, T + 1]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # [B, T], [B, T]
