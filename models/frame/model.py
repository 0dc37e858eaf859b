"""The frame-based action model: frame head per frame, residual LSTM stack over time.

    frames [B, L, rows, cols, 2] --FrameHead per frame--> e [B, L, D]
    main layer (x L_s):  x = x + Proj(LSTM_{D->H}(LN(x)))
                         x = x + MLP_{D->4D->D}(LN(x))
    logits = Head(LN(x))                                   [B, L, action_vocab]

`logits[:, t]` predicts the action taken after observing frame t (the next
action); it depends on frames[:, : t + 1] only, because frames are embedded
independently and every LSTM runs forwards in time.

`Proj` maps the LSTM's H outputs back to the D-wide residual stream: a
bias-free Linear(H -> D) when n_hidden != d_model, the identity (no
parameters) when they are equal, as in every preset of the paper.

The model implements `rcswarm.models.protocols.SegmentStepModel`, the halves the
streaming backward pass (`rcswarm.train.bptt.streaming`) needs: `encode` (frame
head, per step), `core` / `core_loss` (main model over the embeddings) and
`core_segment` (the main model over one segment from a carried state: the hook
core checkpointing, `rcswarm.train.bptt.checkpointed`, recomputes segments with). `forward` is
`core(encode(frames))`.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models.frame.config import FrameModelConfig
from rcswarm.models.frame.frame_head import FrameHead
from rcswarm.models.frame.layers import MLP, init_lstm_
from rcswarm.models.init import INIT_STD, init_linear, init_norm
from rcswarm.models.lstm_run import run_lstm
from rcswarm.models.protocols import CoreState

LSTMState = tuple[Tensor, Tensor]
"""(h, c) of one single-layer nn.LSTM, each [1, B, H]."""


class MainLayer(nn.Module):
    """One residual layer of the main sequence model: LSTM sublayer, then MLP sublayer."""

    def __init__(self, config: FrameModelConfig) -> None:
        super().__init__()
        d, h = config.d_model, config.n_hidden
        self.norm_lstm = nn.LayerNorm(d)
        self.lstm = nn.LSTM(input_size=d, hidden_size=h, num_layers=1, batch_first=True)
        self.proj = nn.Linear(h, d, bias=False) if h != d else None
        self.norm_mlp = nn.LayerNorm(d)
        self.mlp = MLP(d, config.mlp_ratio)

    def reset_parameters(self, out_std: float) -> None:
        init_norm(self.norm_lstm)
        init_lstm_(self.lstm)
        if self.proj is not None:
            init_linear(self.proj, out_std)
        init_norm(self.norm_mlp)
        self.mlp.reset_parameters(out_std)

    def forward(self, x: Tensor, state: LSTMState | None) -> tuple[Tensor, LSTMState]:
        h, new_state = run_lstm(self.lstm, self.norm_lstm(x), state)  # h: [B, L, H]; float32, in pieces
        if self.proj is not None:
            h = self.proj(h)  # [B, L, D]
        x = x + h  # [B, L, D]
        return x + self.mlp(self.norm_mlp(x)), new_state  # [B, L, D]


class FrameActionModel(nn.Module):
    """Frames [B, L, rows, cols, 2] -> next-action logits [B, L, action_vocab]."""

    def __init__(self, config: FrameModelConfig) -> None:
        super().__init__()
        if not isinstance(config, FrameModelConfig):
            raise TypeError(f"FrameActionModel(config={config!r}): expected a FrameModelConfig")
        self.config = config
        self.frame_head = FrameHead(config)
        self.layers = nn.ModuleList(MainLayer(config) for _ in range(config.n_main_layers))
        self.norm_out = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.action_vocab, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialize every parameter from torch's global RNG, in construction order.

        Linear weights and embeddings normal(0, 0.02); residual output
        projections scaled by 1/sqrt(2 * layers) of their stack; biases zero;
        LayerNorms one/zero; LSTM weights uniform(+-1/sqrt(H)) with forget-gate
        bias one.
        """
        self.frame_head.reset_parameters(INIT_STD)
        out_std = INIT_STD / (2 * self.config.n_main_layers) ** 0.5
        for layer in self.layers:
            layer.reset_parameters(out_std)
        init_norm(self.norm_out)
        init_linear(self.head)

    def _check_frames(self, frames: Tensor) -> None:
        config = self.config
        expected = (config.rows, config.cols, 2)
        if frames.dim() != 5 or tuple(frames.shape[2:]) != expected:
            raise ValueError(
                f"frames has shape {tuple(frames.shape)}: expected [batch, frames, "
                f"{config.rows}, {config.cols}, 2] (char id, style id per cell)"
            )
        if frames.is_floating_point() or frames.is_complex():
            raise ValueError(f"frames has dtype {frames.dtype}: expected an integer dtype")

    def encode(self, frames: Tensor) -> Tensor:
        """Frame embeddings [B, L, D] of `frames` [B, L, rows, cols, 2]; each frame on its own."""
        self._check_frames(frames)
        b, n_frames = frames.shape[:2]
        cells = frames.reshape(b * n_frames, *frames.shape[2:])  # [B*L, R, C, 2]
        return self.frame_head(cells).view(b, n_frames, -1)  # [B, L, D]

    def core(
        self,
        embeddings: Tensor,
        state: list[LSTMState] | None = None,
        return_state: bool = False,
    ) -> Tensor | tuple[Tensor, list[LSTMState]]:
        """Logits [B, L, V] from frame embeddings [B, L, D].

        `state` is a list of per-layer LSTM states from an earlier call with
        `return_state=True` (None starts from zeros), so a long window can be run
        in pieces with the result of one call.
        """
        x, new_state = self._main_layers(embeddings, state)  # [B, L, D]
        logits = self.head(self.norm_out(x))  # [B, L, V]
        if return_state:
            return logits, new_state
        return logits

    def _main_layers(self, embeddings: Tensor, state: list[LSTMState] | None) -> tuple[Tensor, list[LSTMState]]:
        """The residual LSTM + MLP stack over embeddings [B, L, D] from `state`: (x [B, L, D], state after)."""
        if state is not None and len(state) != len(self.layers):
            raise ValueError(
                f"state has {len(state)} layer states: expected {len(self.layers)} (one per layer)"
            )
        x = embeddings  # [B, L, D]
        new_state: list[LSTMState] = []
        for i, layer in enumerate(self.layers):
            x, layer_state = layer(x, None if state is None else state[i])  # [B, L, D]
            new_state.append(layer_state)
        return x, new_state

    def core_loss(self, embeddings: Tensor, targets: Tensor) -> Tensor:
        """Mean next-action cross-entropy over [B, L] from embeddings [B, L, D]."""
        logits = self.core(embeddings)  # [B, L, V]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def core_segment(
        self, embeddings: Tensor, targets: Tensor | None, state: CoreState | None
    ) -> tuple[Tensor | None, Tensor | None, CoreState]:
        """One segment of the main model from `state`: (summed cross-entropy, scored targets, state after).

        `embeddings` [B, T, D], `targets` [B, T] (None: only the state is computed, the
        head is skipped), `state` the flat (h_1, c_1, ..., h_Ls, c_Ls), each [1, B, H],
        of an earlier call (None: zeros). Chained over consecutive segments, the summed
        losses divided by the scored targets equal `core_loss` (targets of -100 are not
        scored, as in F.cross_entropy).
        """
        n_layers = len(self.layers)
        if state is not None and len(state) != 2 * n_layers:
            raise ValueError(f"state has {len(state)} tensors: expected {2 * n_layers} (h and c of every layer)")
        pairs = None if state is None else [(state[2 * i], state[2 * i + 1]) for i in range(n_layers)]
        x, new_state = self._main_layers(embeddings, pairs)  # [B, T, D]
        flat = tuple(t for pair in new_state for t in pair)  # each [1, B, H]
        if targets is None:
            return None, None, flat
        logits = self.head(self.norm_out(x))  # [B, T, V]
        flat_targets = targets.reshape(-1)  # [B*T]
        loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat_targets, reduction="sum")
        return loss_sum, (flat_targets != -100).sum(), flat

    def forward(self, frames: Tensor) -> Tensor:
        """Next-action logits [B, L, action_vocab] for `frames` [B, L, rows, cols, 2]."""
        return self.core(self.encode(frames))
