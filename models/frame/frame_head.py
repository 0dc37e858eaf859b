"""The frame head: one frame of character cells -> one frame embedding [N, D].

Paper, Section 10.2 and Appendix J: full self-attention over the frame's
cells, interspersed with P pooling stages that each halve the sequence
("accomplishing the same goal as tokenization"), L_t more blocks after the
last pooling, then a terminating LSTM that reduces the pooled tokens to the
frame embedding. The layout is

    embed cells (char + style + row + col)                  T_0 = rows * cols
    for s in 0 .. P-1:  block at T_s, then pool             T_{s+1} = T_s / 2
    L_t blocks at T_P
    LayerNorm, reduction LSTM (D -> D) over the T_P tokens; its last hidden
    state is the embedding.

Pooling is the mean of adjacent pairs in row-major order. Because `cols` is a
multiple of 2**P, a pair never straddles two rows, so after P stages each
token summarizes 2**P horizontally adjacent cells (a fixed-width "subword").
It is parameter-free, which matches Appendix J: Eq. 15 has no term for the
pooling, whose cost is O(B D N_f). A learned merge (Linear 2D -> D) would add
O(B D^2 T_s) FLOPs that the paper does not count.

A cell is a pair (char id, style id): char ids in [0, char_vocab) (use
`frame_cells` to bucket raw Unicode code points), style ids in [0, n_styles).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rcswarm.models.frame.config import FrameModelConfig
from rcswarm.models.frame.layers import TransformerBlock, init_lstm_
from rcswarm.models.init import init_norm
from rcswarm.models.precision import in_float32

CHAR = 0
STYLE = 1


def frame_cells(codepoints: Tensor, styles: Tensor, char_vocab: int) -> Tensor:
    """Stack code points (bucketed) and style ids into cells [..., 2] (int64).

    A code point c maps to c mod char_vocab: ASCII and every code point below
    `char_vocab` keep their own id, higher ones share buckets.
    """
    if codepoints.shape != styles.shape:
        raise ValueError(
            f"codepoints has shape {tuple(codepoints.shape)} and styles {tuple(styles.shape)}: "
            "expected equal shapes"
        )
    chars = torch.remainder(codepoints.long(), char_vocab)  # [...]
    return torch.stack((chars, styles.long()), dim=-1)  # [..., 2]


def pool_pairs(x: Tensor) -> Tensor:
    """Mean of adjacent token pairs: [N, T, D] -> [N, T / 2, D]."""
    n, t, d = x.shape
    assert t % 2 == 0, t
    return x.view(n, t // 2, 2, d).mean(dim=2)  # [N, T/2, D]


class FrameHead(nn.Module):
    """Cells [N, rows, cols, 2] -> frame embeddings [N, D]; frames are independent."""

    def __init__(self, config: FrameModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.char_embed = nn.Embedding(config.char_vocab, d)
        self.style_embed = nn.Embedding(config.n_styles, d)
        self.row_embed = nn.Embedding(config.rows, d)
        self.col_embed = nn.Embedding(config.cols, d)
        self.pre_pool_blocks = nn.ModuleList(self._block() for _ in range(config.n_pool))
        self.post_pool_blocks = nn.ModuleList(self._block() for _ in range(config.n_frame_layers))
        self.norm = nn.LayerNorm(d)
        self.reduce = nn.LSTM(input_size=d, hidden_size=d, num_layers=1, batch_first=True)

    def _block(self) -> TransformerBlock:
        config = self.config
        return TransformerBlock(config.d_model, config.n_heads, config.mlp_ratio)

    def reset_parameters(self, std: float) -> None:
        """Embeddings normal(0, std); residual projections scaled by 1/sqrt(2 * blocks)."""
        for embed in (self.char_embed, self.style_embed, self.row_embed, self.col_embed):
            nn.init.normal_(embed.weight, mean=0.0, std=std)
        n_blocks = len(self.pre_pool_blocks) + len(self.post_pool_blocks)
        out_std = std / (2 * max(n_blocks, 1)) ** 0.5
        for block in (*self.pre_pool_blocks, *self.post_pool_blocks):
            block.reset_parameters(out_std)
        init_norm(self.norm)
        init_lstm_(self.reduce)

    def _embed(self, cells: Tensor) -> Tensor:
        n, rows, cols, _ = cells.shape
        cells = cells.long()
        x = self.char_embed(cells[..., CHAR]) + self.style_embed(cells[..., STYLE])  # [N, R, C, D]
        x = x + self.row_embed.weight[:, None, :] + self.col_embed.weight[None, :, :]  # [N, R, C, D]
        return x.reshape(n, rows * cols, -1)  # [N, T_0, D]

    def forward(self, cells: Tensor) -> Tensor:
        """Embeddings [N, D] of the frames `cells` [N, rows, cols, 2] (any integer dtype)."""
        x = self._embed(cells)  # [N, T_0, D]
        for block in self.pre_pool_blocks:
            x = pool_pairs(block(x))  # [N, T_{s+1}, D]
        for block in self.post_pool_blocks:
            x = block(x)  # [N, T_P, D]
        _, (h, _) = in_float32(self.reduce, self.norm(x))  # h: [1, N, D]; float32 under autocast too
        return h[0]  # [N, D]
