"""What the streaming-BPTT tests share: batches of frames, gradients compared at RTOL, plain autograd's result
(cached per length), a tracker of live saved-tensor bytes, and a generic StepModel with dropout."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models.frame import FrameActionModel
from rcswarm.train.bptt.streaming import plain_backward

RTOL = 1e-10
BATCH = 2


def _batch(model: FrameActionModel, n_frames: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    cells = (BATCH, n_frames, config.rows, config.cols)
    chars = torch.randint(0, config.char_vocab, cells, generator=generator)
    styles = torch.randint(0, config.n_styles, cells, generator=generator)
    actions = torch.randint(0, config.action_vocab, (BATCH, n_frames), generator=generator)
    return torch.stack((chars, styles), dim=-1), actions


def _grads(model: nn.Module) -> dict[str, Tensor]:
    grads = {}
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        grads[name] = param.grad.clone()
    return grads


def _assert_close(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert list(got) == list(want)
    for name, reference in want.items():
        error = (got[name] - reference).norm().item()
        assert error <= RTOL * reference.norm().item(), (name, error, reference.norm().item())


_PLAIN_CACHE: dict[int, tuple[float, dict[str, Tensor]]] = {}


def _plain(model: FrameActionModel, n_frames: int) -> tuple[float, dict[str, Tensor]]:
    if n_frames not in _PLAIN_CACHE:
        model.zero_grad(set_to_none=True)
        loss = plain_backward(model, _batch(model, n_frames))
        _PLAIN_CACHE[n_frames] = (loss, _grads(model))
    return _PLAIN_CACHE[n_frames]


class _Holder(list):
    """A list that weakref.finalize can watch."""


class SavedBytes:
    """Outer saved-tensor hooks that track how many bytes of saved tensors are alive."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def pack(self, tensor: Tensor) -> _Holder:
        nbytes = tensor.numel() * tensor.element_size()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        holder = _Holder([tensor.detach()])
        weakref.finalize(holder, self._release, nbytes)
        return holder

    @staticmethod
    def unpack(holder: _Holder) -> Tensor:
        return holder[0]

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class DropoutStepModel(nn.Module):
    """A generic StepModel with dropout in its encoder and a GRU core."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(6, 8)
        self.dropout = nn.Dropout(0.5)
        self.core = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 5)

    def encode(self, steps: Tensor) -> Tensor:
        return torch.tanh(self.dropout(self.encoder(steps)))  # [B, k, 8]

    def core_loss(self, embeddings: Tensor, targets: Tensor) -> Tensor:
        hidden, _ = self.core(embeddings)  # [B, L, 8]
        return F.cross_entropy(self.head(hidden).transpose(1, 2), targets)
