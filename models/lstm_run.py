"""Running an `nn.LSTM` over a long sequence: in float32 (models/precision.py) and in pieces cuDNN accepts.

One cuDNN RNN call over a whole long window fails: on an H100 (torch 2.11, cuDNN 9, 2026-11-27) the frame model's
main LSTM ran over 32,768 frames in one call and raised CUDNN_STATUS_NOT_SUPPORTED over 1,000,000 (the paged mode of
streaming BPTT, `rcswarm bench gpu` part (c); docs/PERFORMANCE.md). `run_lstm` runs the sequence in consecutive
pieces of at most `PIECE_STEPS` steps and `PIECE_ELEMENTS` steps x batch x hidden (the size the call's reserve
space grows with), each from the state the last one ended in: the same recurrence, so the outputs and every
gradient are the ones of one call (bit for bit on the CPU, which runs step by step either way).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rcswarm.models.precision import in_float32

# The longest single call seen to work on CUDA (the frame model's main LSTM, B = 1, H = 48; see above).
PIECE_STEPS = 32_768
# steps x batch x hidden of one call: 2**24 keeps its float32 reserve space well under 2 GiB (about 10 floats each).
PIECE_ELEMENTS = 2**24


def piece_steps(batch: int, hidden: int) -> int:
    """Steps per call for `batch` sequences through an LSTM of `hidden` units (at least 1)."""
    return max(1, min(PIECE_STEPS, PIECE_ELEMENTS // max(1, batch * hidden)))


def run_lstm(
    lstm: nn.LSTM, x: Tensor, state: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """`lstm(x, state)` for a batch-first `lstm` and `x` [B, T, D_in], in float32 under autocast and in pieces of
    `piece_steps(B, hidden)` steps: (outputs [B, T, H], (h, c) each [layers, B, H])."""
    assert lstm.batch_first and not lstm.bidirectional, "pieces along dim 1 need a batch-first, forward-only LSTM"
    steps = piece_steps(x.shape[0], lstm.hidden_size)
    if x.shape[1] <= steps:
        return in_float32(lstm, x, state)
    outputs = []
    for start in range(0, x.shape[1], steps):
        out, state = in_float32(lstm, x[:, start:start + steps], state)  # [B, <= steps, H]
        outputs.append(out)
    assert state is not None
    return torch.cat(outputs, dim=1), state  # [B, T, H]
