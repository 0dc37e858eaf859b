"""Lazy frame windows: a batch served a chunk at a time, equal to the materialized batch, never held whole."""

from __future__ import annotations

import tracemalloc

import pytest
import torch

from rcswarm.data.frames import (
    FrameWindow,
    FrameWindowSpec,
    TensorWindow,
    TypingConfig,
    TypingFrameSource,
)
from tests.helpers.data import _assert_chunks_make_the_batch

TINY = {"rows": 8, "cols": 16, "char_vocab": 128, "action_vocab": 64}


def _typing(n_documents: int, batch_size: int, window: int, seed: int = 5) -> TypingFrameSource:
    config = TypingConfig.fitting(**TINY, n_documents=n_documents)
    return TypingFrameSource(config, FrameWindowSpec(batch_size=batch_size, window=window, seed=seed))


def test_typing_window_chunks_are_the_batch_of_the_same_seed() -> None:
    lazy, eager = _typing(8, 3, 150), _typing(8, 3, 150)
    for _ in range(2):  # the second draw too: both consume the RNG alike
        window = lazy.next_window()
        batch = eager.next_batch()
        assert isinstance(window, FrameWindow)
        assert (window.batch_size, window.length) == (3, 150)
        _assert_chunks_make_the_batch(window, batch, 7)
        assert torch.equal(window.chunk(40, 47)[0], window.chunk(40, 47)[0])  # the same every time


def test_a_window_of_100000_frames_is_served_without_materializing_it() -> None:
    source = _typing(1800, 2, 100_000)
    whole_bytes = 2 * 100_000 * 8 * 16 * 2 * 8  # int64 frames of the whole window: 204.8 MB
    tracemalloc.start()
    try:
        window = source.next_window()
        frames, actions = window.chunk(99_992, 100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert frames.shape == (2, 8, 8, 16, 2) and actions.shape == (2, 8)
    assert peak < whole_bytes / 1000
    # the chunk is the window's tail: the same steps as a window drawn at offset + 99,992
    offset = int(window.offsets[0]) + 99_992
    tail_frames, tail_actions = source.window(offset, 8)
    assert torch.equal(frames[0], tail_frames) and torch.equal(actions[0], tail_actions)


def test_chunk_bounds_are_checked() -> None:
    window = _typing(4, 1, 20).next_window()
    with pytest.raises(ValueError, match=r"chunk \[5, 5\): expected 0 <= start < stop <= 20"):
        window.chunk(5, 5)
    with pytest.raises(ValueError, match=r"chunk \[18, 21\)"):
        window.chunk(18, 21)
    with pytest.raises(ValueError, match="chunk start=1.5: expected an int"):
        window.chunk(1.5, 3)  # type: ignore[arg-type]
    steps = torch.zeros(2, 6, 3)
    assert torch.equal(TensorWindow(steps, torch.zeros(2, 6)).chunk(1, 4)[0], steps[:, 1:4])
    with pytest.raises(ValueError, match=r"targets has shape \(2, 5\)"):
        TensorWindow(steps, torch.zeros(2, 5))
