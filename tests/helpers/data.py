"""What the data tests share: the stdlib corpus, small diagnostic tasks, the typing frames' config, git frame sizes."""

from __future__ import annotations

import hashlib

import pytest
import torch

from rcswarm.data.diagnostics import Batch
from rcswarm.data.frames import FrameWindow, TypingConfig
from rcswarm.data.text import load_stdlib_corpus

# The editor frames of the git-frames tests (tests/data/ and tests/swarm/test_git_frames.py).
ROWS, COLS = 16, 64


# A lazy window against the batch of the same seed (tests/data/test_frame_windows.py, tests/swarm/test_git_frames.py).
def _assert_chunks_make_the_batch(window: FrameWindow, batch: tuple[torch.Tensor, torch.Tensor], k: int) -> None:
    pieces = [window.chunk(start, min(start + k, window.length)) for start in range(0, window.length, k)]
    assert torch.equal(torch.cat([f for f, _ in pieces], dim=1), batch[0])
    assert torch.equal(torch.cat([a for _, a in pieces], dim=1), batch[1])


# The stdlib byte corpus of tests/data/test_data_text.py (a fixture registered in tests/conftest.py).
@pytest.fixture(scope="module")
def corpus() -> bytes:
    return load_stdlib_corpus(max_bytes=200_000)


# The diagnostic tasks of tests/data/test_diagnostics.py, small.
SMALL_CONFIGS = {
    "frjt": {"max_depth": 12},
    "maze": {"num_moves": 40},
    "mqar": {"vocab_size": 256, "seq_len": 64},
    "s5": {"max_length": 30},
}


def batch_digest(batch: Batch) -> str:
    digest = hashlib.sha256()
    tensors = (batch.tokens, batch.targets, batch.mask, batch.lengths)
    for tensor in (*tensors, *batch.meta.values(), *batch.position_meta.values()):
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


# The typing frames of tests/data/test_frames_typing.py.
CONFIG = TypingConfig(rows=12, cols=40, char_vocab=256, n_documents=16)
