"""`run_lstm`: an LSTM over a long sequence in pieces equals one call, outputs and every gradient (float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rcswarm.models import lstm_run
from rcswarm.models.frame import FrameActionModel
from rcswarm.models.lstm_run import piece_steps, run_lstm


def _lstm(d_in: int = 5, hidden: int = 7, layers: int = 1) -> nn.LSTM:
    torch.manual_seed(0)
    return nn.LSTM(input_size=d_in, hidden_size=hidden, num_layers=layers, batch_first=True).double()


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("layers", [1, 2])
def test_pieces_give_the_outputs_state_and_gradients_of_one_call(monkeypatch, with_state: bool, layers: int) -> None:
    lstm = _lstm(layers=layers)
    x = torch.randn(3, 23, 5, dtype=torch.float64, requires_grad=True)  # [B, T, D]; 23 = 4 pieces of 6 + ragged
    state = tuple(torch.randn(layers, 3, 7, dtype=torch.float64, requires_grad=True) for _ in range(2))
    start = state if with_state else None

    def run(steps: int) -> list[torch.Tensor]:
        monkeypatch.setattr(lstm_run, "PIECE_STEPS", steps)
        assert piece_steps(3, 7) == steps
        lstm.zero_grad()
        out, (h, c) = run_lstm(lstm, x, start)
        weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)
        ((out * weights).sum() + h.square().sum() + c.sin().sum()).backward()
        grads = [x.grad.clone(), *(p.grad.clone() for p in lstm.parameters())]
        grads += [s.grad.clone() for s in state] if with_state else []
        x.grad = None
        for s in state:
            s.grad = None
        return [out.detach(), h.detach(), c.detach(), *grads]

    whole, pieces = run(1000), run(6)
    for want, got in zip(whole, pieces, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_piece_is_bounded_by_steps_and_by_steps_x_batch_x_hidden() -> None:
    assert piece_steps(1, 48) == lstm_run.PIECE_STEPS
    assert piece_steps(64, 1024) == lstm_run.PIECE_ELEMENTS // (64 * 1024)
    assert piece_steps(2**20, 2**20) == 1


def test_the_frame_model_runs_its_main_lstm_in_pieces(monkeypatch) -> None:
    """The model's logits over a window longer than a piece are those of one call (the pieces are used)."""
    from rcswarm.models import registry

    model = registry.build_model("frame", "tiny", seed=0).double()
    assert isinstance(model, FrameActionModel)
    embeddings = torch.randn(2, 40, model.config.d_model, dtype=torch.float64)  # [B, L, D]
    calls = []
    original = lstm_run.in_float32
    monkeypatch.setattr(lstm_run, "in_float32", lambda fn, *args: calls.append(1) or original(fn, *args))
    whole = model.core(embeddings)
    n_layers = len(model.layers)
    assert len(calls) == n_layers
    monkeypatch.setattr(lstm_run, "PIECE_STEPS", 16)
    pieces = model.core(embeddings)
    assert len(calls) == n_layers + 3 * n_layers  # 40 steps = 16 + 16 + 8
    torch.testing.assert_close(pieces, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's LSTM needs a GPU")
def test_cuda_pieces_give_the_outputs_and_gradients_of_one_cudnn_call(monkeypatch) -> None:
    """On cuDNN (float32, TF32 off) pieces of 32 steps against one call over 70: outputs, state and every gradient."""
    torch.manual_seed(0)
    lstm = nn.LSTM(input_size=8, hidden_size=16, num_layers=2, batch_first=True).cuda()
    x = torch.randn(3, 70, 8, device="cuda", requires_grad=True)  # [B, T, D]

    def run(steps: int) -> list[torch.Tensor]:
        monkeypatch.setattr(lstm_run, "PIECE_STEPS", steps)
        lstm.zero_grad()
        x.grad = None
        out, (h, c) = run_lstm(lstm, x)
        (out.square().sum() + h.sum() + c.sum()).backward()
        return [out.detach(), h.detach(), c.detach(), x.grad.clone(), *(p.grad.clone() for p in lstm.parameters())]

    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        whole, pieces = run(1000), run(32)
    for want, got in zip(whole, pieces, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
