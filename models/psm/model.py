"""Transformer-PSM: a prefix-scannable model whose aggregator is a bidirectional Transformer.

After "Sequential-Parallel Duality in Prefix-Scannable Models" (Yau et al.), Section 3.4,
Alg. 3 (training) and Alg. 4 (streaming inference). A sequence is cut into chunks of c
tokens; with x_i = Enc(C_i) [c, d]:

    Agg(x_i, x_j) = RH(GPT^b([x_i | x_j]))            bidirectional blocks over 2c tokens
    s = BlellochScan({x_i}, Agg, e)                    exclusive prefixes, s_{i-1} for chunk i
    ŷ(C_i) = head(RH(GPT^c([s_{i-1} | Enc(C_i)])))    causal blocks over 2c tokens

RH keeps the right half (the last c positions); `compression = "linear"` replaces it by the
learned linear map from 2c to c positions of Section 4.2. The identity e is a learned [c, d]
"empty" state that enters Agg as a real operand, as in Alg. 1 (the Blelloch down-sweep
computes Agg(e, ·) on the left spine). Training uses the static scan (O(log r) batched Agg
calls); `PSMStream` decodes token by token with the online binary-counter scan, keeping
O(log r) chunk states, and produces the same predictions (sequential-parallel duality).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rcswarm.kernels.scan import OnlineScan, blelloch_scan
from rcswarm.models.inputs import check_inputs
from rcswarm.models.psm.config import TransformerPSMConfig


class Block(nn.Module):
    """Pre-LN Transformer block; attention causal or bidirectional."""

    def __init__(self, config: TransformerPSMConfig, causal: bool) -> None:
        super().__init__()
        d = config.d_model
        self.causal = causal
        self.n_heads = config.n_heads
        self.dropout = config.dropout
        self.ln_attn = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_mlp = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, config.mlp_ratio * d), nn.GELU(), nn.Linear(config.mlp_ratio * d, d))

    def forward(self, x: Tensor) -> Tensor:
        batch, length, d = x.shape  # [N, S, D]
        qkv = self.qkv(self.ln_attn(x)).view(batch, length, 3, self.n_heads, d // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [N, H, S, Dh]
        attended = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0
        )  # [N, H, S, Dh]
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, d))
        return x + self.mlp(self.ln_mlp(x))


class PairTransformer(nn.Module):
    """GPT-style blocks over the 2c positions of a pair of chunk states."""

    def __init__(self, config: TransformerPSMConfig, n_layers: int, causal: bool) -> None:
        super().__init__()
        self.position = nn.Parameter(torch.zeros(2 * config.chunk_size, config.d_model))
        self.blocks = nn.ModuleList(Block(config, causal) for _ in range(n_layers))
        self.ln_out = nn.LayerNorm(config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.position[: x.shape[1]]  # [N, S <= 2c, D]
        for block in self.blocks:
            x = block(x)
        return self.ln_out(x)


class TransformerPSM(nn.Module):
    def __init__(self, config: TransformerPSMConfig) -> None:
        super().__init__()
        self.config = config
        c, d = config.chunk_size, config.d_model
        self.embed = nn.Embedding(config.vocab_size, d)
        self.empty_state = nn.Parameter(torch.zeros(c, d))
        self.aggregator = PairTransformer(config, config.agg_layers, causal=False)
        self.compress = nn.Linear(2 * c, c, bias=False) if config.compression == "linear" else None
        self.inference = PairTransformer(config, config.inf_layers, causal=True)
        self.head = nn.Linear(d, config.output_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
        for transformer in (self.aggregator, self.inference):
            nn.init.normal_(transformer.position, std=0.02)
        if self.compress is not None:
            with torch.no_grad():
                self.compress.weight.zero_()
                self.compress.weight[:, self.config.chunk_size :].copy_(torch.eye(self.config.chunk_size))

    def aggregate(self, earlier: Tensor, later: Tensor) -> Tensor:
        """Agg batched over leading dims: earlier, later [..., c, d] -> [..., c, d]."""
        lead = earlier.shape[:-2]
        c, d = self.config.chunk_size, self.config.d_model
        pair = torch.cat([earlier.reshape(-1, c, d), later.reshape(-1, c, d)], dim=1)  # [N, 2c, D]
        mixed = self.aggregator(pair)  # [N, 2c, D]
        if self.compress is None:
            state = mixed[:, c:]  # [N, c, D]
        else:
            state = self.compress(mixed.transpose(1, 2)).transpose(1, 2)  # [N, c, D]
        return state.reshape(*lead, c, d).to(earlier.dtype)  # the scan's dtype (autocast makes `compress` bf16)

    def infer(self, state: Tensor, chunk: Tensor) -> Tensor:
        """Logits of a (possibly partial) chunk: state [N, c, D], chunk [N, m <= c, D] -> [N, m, V]."""
        c = self.config.chunk_size
        hidden = self.inference(torch.cat([state, chunk], dim=1))  # [N, c + m, D]
        return self.head(hidden[:, c:])  # [N, m, V]

    def forward(self, inputs: Tensor) -> Tensor:
        """Training mode (Alg. 3): inputs [B, T] -> logits [B, T, V]."""
        check_inputs(inputs)
        batch, length = inputs.shape
        c, d = self.config.chunk_size, self.config.d_model
        chunks = math.ceil(length / c)
        padded = F.pad(inputs, (0, chunks * c - length))  # [B, r c]
        x = self.embed(padded).view(batch, chunks, c, d)  # [B, r, c, D]
        elements = x.transpose(0, 1)  # [r, B, c, D]
        identity = self.empty_state.expand(batch, c, d)  # [B, c, D]
        states = blelloch_scan(self.aggregate, elements, identity).exclusive  # [r, B, c, D]
        states = states.transpose(0, 1).reshape(batch * chunks, c, d)  # [B r, c, D]
        logits = self.infer(states, x.reshape(batch * chunks, c, d))  # [B r, c, V]
        return logits.view(batch, chunks * c, logits.shape[-1])[:, :length]  # [B, T, V]; -1 fails at B = 0

    def stream(self, batch_size: int) -> PSMStream:
        return PSMStream(self, batch_size)


class PSMStream:
    """Token-by-token decoding (Alg. 4) with O(log r) chunk states: `step(tokens [B]) -> logits [B, V]`."""

    def __init__(self, model: TransformerPSM, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: expected >= 1")
        c, d = model.config.chunk_size, model.config.d_model
        self.model = model
        self.scan = OnlineScan(model.aggregate, model.empty_state.expand(batch_size, c, d))
        self.buffer: list[Tensor] = []

    @property
    def stored_states(self) -> int:
        """Chunk states held by the binary counter (its roots)."""
        return self.scan.num_roots

    def step(self, tokens: Tensor) -> Tensor:
        self.buffer.append(tokens)
        chunk = self.model.embed(torch.stack(self.buffer, dim=1))  # [B, m, D]
        logits = self.model.infer(self.scan.prefix, chunk)[:, -1]  # [B, V]
        if len(self.buffer) == self.model.config.chunk_size:
            self.scan.push(chunk)
            self.buffer = []
        return logits
