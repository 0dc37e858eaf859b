"""GPT-style causal Transformer baseline, registered as "transformer".

    token embedding (+ learned position embedding)
    -> n_layers pre-LN blocks:  x = x + Attn(LN(x));  x = x + MLP(LN(x))
    -> LN -> linear head

as the GPT-2 style models of Yau et al., "Sequential-Parallel Duality in
Prefix-Scannable Models" (Sec. 4), and the Transformer baselines of Keiblinger
(Sec. 8). Attention is multi-head softmax attention computed by
`torch.nn.functional.scaled_dot_product_attention`.

Positions: `positions="learned"` (the default, as in GPT-2) adds a learned
embedding of the absolute position, so sequences are limited to `max_len`
tokens. `positions="rope"` instead rotates queries and keys by their absolute
position (rotary embedding, Su et al. 2021, "RoFormer", arXiv:2104.09864,
Sec. 3.4; rotate-half pairing of channels i and i + head_dim/2), which has no
parameters; `max_len` still bounds the position but can be set as large as
a stream needs.

Sliding window: with `window=W` each query at position t attends to keys at
positions t - W + 1 .. t only (the Sliding Window Transformer baseline of the
MQAR comparison, Yau et al. Sec. 4.2). Without it, attention is fully causal.

Incremental decoding: `cache = model.init_cache(batch_size)` and
`model.step(tokens, cache)` (or `model(inputs, cache)` for a chunk) append each
layer's keys and values to the cache and return the same logits as the full
forward over the whole sequence. With a window the cache keeps only the last
W - 1 positions, so streaming memory is bounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.models.baselines.common import (
    MLP,
    check_config,
    check_state_batch,
    check_tokens,
)
from rcswarm.models.baselines.config import TransformerConfig
from rcswarm.models.init import init_linear, init_norm
from rcswarm.models.inputs import check_inputs


@dataclass
class KVCache:
    """Keys and values of the positions seen so far, per layer.

    keys[i], values[i]: [B, n_heads, S, head_dim] for layer i, the last S
    positions (all of them, or the last window - 1 with a sliding window);
    keys are stored after the rotary embedding. `length`: the number of
    positions consumed, i.e. the absolute position of the next token.
    """

    keys: list[Tensor]
    values: list[Tensor]
    length: int = 0

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]


def rope_rotate(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Rotary position embedding of `x` [B, H, T, Dh] at absolute `positions` [T].

    Channel i is paired with channel i + Dh/2 and the pair rotated by the angle
    position * base^(-2i/Dh) (Su et al. 2021, Sec. 3.4, rotate-half layout).
    """
    half = x.shape[-1] // 2
    exponent = torch.arange(half, dtype=torch.float32, device=x.device) * (2.0 / x.shape[-1])
    inv_freq = base**-exponent  # [Dh/2]
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, Dh/2]
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(x.dtype)  # [T, Dh]
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(x.dtype)  # [T, Dh]
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [B, H, T, Dh]
    return x * cos + rotated * sin  # [B, H, T, Dh]


def attention_mask(n_queries: int, n_keys: int, window: int | None, device: torch.device) -> Tensor:
    """Boolean mask [Tq, Tk], True where a query may attend to a key.

    The keys are consecutive positions and the queries are the last Tq of
    them (Tq <= Tk): query i sits at key position Tk - Tq + i. A key is visible
    if it is not in the future (key <= query) and, with a window W, among the
    last W positions (key > query - W).
    """
    q = torch.arange(n_keys - n_queries, n_keys, device=device)[:, None]  # [Tq, 1]
    k = torch.arange(n_keys, device=device)[None, :]  # [1, Tk]
    allowed = k <= q  # [Tq, Tk]
    if window is not None:
        allowed = allowed & (k > q - window)  # [Tq, Tk]
    return allowed


def causal_attention(
    q: Tensor, k: Tensor, v: Tensor, window: int | None, dropout_p: float = 0.0
) -> Tensor:
    """Softmax attention [B, H, Tq, Dh] of q [B, H, Tq, Dh] over k, v [B, H, Tk, Dh].

    The queries are the last Tq of the Tk key positions; visibility follows
    `attention_mask`. Full causal attention of a sequence over itself uses
    the fused `is_causal=True` path.
    """
    n_queries, n_keys = q.shape[2], k.shape[2]
    if window is None and n_queries == n_keys:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    mask = attention_mask(n_queries, n_keys, window, q.device)  # [Tq, Tk]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with optional RoPE and sliding window."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.n_heads = config.n_heads
        self.head_dim = config.d_model // config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, time, _ = x.shape
        return x.view(batch, time, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, T, Dh]

    def forward(
        self, x: Tensor, positions: Tensor, past: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attention output [B, T, D] for x [B, T, D] at absolute `positions` [T].

        `past` holds the cached (keys, values) [B, H, S, Dh] of the S positions
        just before `positions`. Returns the output and the (keys, values) of
        past and present together.
        """
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x [B, T, D]
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        if self.config.positions == "rope":
            q = rope_rotate(q, positions, self.config.rope_base)  # [B, H, T, Dh]
            k = rope_rotate(k, positions, self.config.rope_base)  # [B, H, T, Dh]
        if past is not None:
            k = torch.cat((past[0], k), dim=2)  # [B, H, S + T, Dh]
            v = torch.cat((past[1], v), dim=2)  # [B, H, S + T, Dh]
        dropout_p = self.config.dropout if self.training else 0.0
        out = causal_attention(q, k, v, self.config.window, dropout_p)  # [B, H, T, Dh]
        out = out.transpose(1, 2).reshape(x.shape)  # [B, T, D]
        return self.proj(out), (k, v)


class TransformerBlock(nn.Module):
    """Pre-LN block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm_attn = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.norm_mlp = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model, config.mlp_ratio)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, positions: Tensor, past: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        a, present = self.attn(self.norm_attn(x), positions, past)  # [B, T, D]
        x = x + self.dropout(a)  # [B, T, D]
        x = x + self.dropout(self.mlp(self.norm_mlp(x)))  # [B, T, D]
        return x, present


class TransformerModel(nn.Module):
    """GPT-style causal Transformer with a linear head to `config.out_dim`."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        check_config(type(self), config, TransformerConfig)
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed: nn.Embedding | None = None
        if config.positions == "learned":
            self.pos_embed = nn.Embedding(config.max_len, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm_out = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.out_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialize every parameter from the global torch RNG (GPT-2 scheme).

        Embeddings and linear weights: normal(0, 0.02), except the projections
        that write into the residual stream (attention output, MLP output),
        whose std is 0.02 / sqrt(2 * n_layers). Biases zero; LayerNorms
        weight 1, bias 0.
        """
        std = 0.02
        out_std = std / math.sqrt(2 * self.config.n_layers)
        nn.init.normal_(self.embed.weight, mean=0.0, std=std)
        if self.pos_embed is not None:
            nn.init.normal_(self.pos_embed.weight, mean=0.0, std=std)
        for block in self.blocks:
            init_norm(block.norm_attn)
            init_linear(block.attn.qkv, std)
            init_linear(block.attn.proj, out_std)
            init_norm(block.norm_mlp)
            block.mlp.reset_parameters(std, out_std)
        init_norm(self.norm_out)
        init_linear(self.head, std)

    def init_cache(self, batch_size: int) -> KVCache:
        """An empty KV cache for `batch_size` sequences."""
        weight = self.head.weight
        shape = (batch_size, self.config.n_heads, 0, self.config.d_model // self.config.n_heads)
        empty = [torch.zeros(shape, dtype=weight.dtype, device=weight.device)]
        n = self.config.n_layers
        return KVCache(keys=empty * n, values=empty * n, length=0)

    def init_state(self, batch_size: int) -> KVCache:
        """The same as `init_cache`: the streaming state every baseline family offers."""
        return self.init_cache(batch_size)

    def _positions(self, start: int, time: int, device: torch.device) -> Tensor:
        if start + time > self.config.max_len:
            raise ValueError(
                f"positions {start}..{start + time - 1}: expected at most "
                f"max_len={self.config.max_len} positions"
            )
        return torch.arange(start, start + time, device=device)  # [T]

    def forward(self, inputs: Tensor, cache: KVCache | None = None) -> Tensor:
        """Logits [B, T, out_dim] for token ids `inputs` [B, T].

        With `cache`, `inputs` continue the sequence the cache holds: they
        attend to the cached positions, and their keys and values are appended
        to `cache` (trimmed to the last window - 1 positions with a window).
        """
        check_inputs(inputs)
        start = 0
        if cache is not None:
            check_state_batch(cache.batch_size, inputs)
            start = cache.length
        positions = self._positions(start, inputs.shape[1], inputs.device)  # [T]
        x = self.embed(inputs)  # [B, T, D]
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions)[None]  # [B, T, D]
        x = self.dropout(x)  # [B, T, D]
        for i, block in enumerate(self.blocks):
            past = None if cache is None else (cache.keys[i], cache.values[i])
            x, (k, v) = block(x, positions, past)  # [B, T, D]
            if cache is not None:
                cache.keys[i], cache.values[i] = self._trim(k), self._trim(v)
        if cache is not None:
            cache.length = start + inputs.shape[1]
        return self.head(self.norm_out(x))  # [B, T, out_dim]

    def _trim(self, kv: Tensor) -> Tensor:
        window = self.config.window
        if window is None:
            return kv
        return kv[:, :, kv.shape[2] - min(kv.shape[2], window - 1) :]  # [B, H, <= W-1, Dh]

    def step(self, tokens: Tensor, cache: KVCache) -> Tensor:
        """Logits [B, out_dim] for the next token of each sequence, `tokens` [B].

        Appends the token's keys and values to `cache`.
        """
        check_tokens(tokens)
        return self.forward(tokens[:, None], cache)[:, 0]  # [B, out_dim]
