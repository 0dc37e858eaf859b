"""Table 1 layer families as affine scan inputs, and their plain recurrences as the reference.

Each `*_elements` builder turns per-step inputs into an `AffineSequence` for `affine_scan`;
each `*_recurrence` runs the layer's own update step by step, written directly from Table 1
and independently of the aggregator, and returns the same states. Shapes (time-major, any
number of batch dims, typically *batch = B, H):

    k [T, *batch, d_k], v [T, *batch, d_v], beta [T, *batch]; states [T, *batch, d_v, d_k].

| family          | update                                  | E_t (kind)                         |
|-----------------|-----------------------------------------|------------------------------------|
| linear attention| S_t = S_{t-1} + v kᵀ                    | 1, [.., 1, 1] (diagonal)           |
| RetNet          | S_t = γ S_{t-1} + v kᵀ                  | γ, [.., 1, 1] (diagonal)           |
| diagonal gate   | S_t = S_{t-1} diag(α_t) + v kᵀ (GLA)    | α_t, [.., 1, d_k] (diagonal)       |
|                 | or α_t ⊙ S_{t-1} + v kᵀ (Mamba-like)    | α_t, [.., d_v, d_k] (diagonal)     |
| DeltaNet        | S_t = S_{t-1}(I - β kkᵀ) + β v kᵀ       | I - β k kᵀ (matrix)                |
| gated DeltaNet  | S_t = α_t S_{t-1}(I - β kkᵀ) + β v kᵀ   | α_t (I - β k kᵀ) (matrix)          |

Keys are used as given: DeltaNet-style layers normalise k (and keep β in (0, 1)) upstream.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rcswarm.kernels.scan.affine import AffineSequence
from rcswarm.kernels.scan.tree import describe


def _check_keys_values(k: Tensor, v: Tensor) -> None:
    if k.dim() < 2 or k.shape[0] == 0:
        raise ValueError(f"k={describe(k)}: expected [T >= 1, *batch, d_k]")
    if v.shape[:-1] != k.shape[:-1] or v.dtype != k.dtype:
        raise ValueError(
            f"v={describe(v)}: expected [T, *batch, d_v] with the T, batch dims and dtype of k={describe(k)}"
        )


def _check_per_step(name: str, value: Tensor, k: Tensor) -> None:
    if value.shape != k.shape[:-1] or value.dtype != k.dtype:
        raise ValueError(f"{name}={describe(value)}: expected one scalar per step, {describe(k[..., 0])}")


def _check_diagonal_gate(alpha: Tensor, k: Tensor, v: Tensor) -> None:
    key_gate = k.shape
    full_gate = (*v.shape, k.shape[-1])
    if tuple(alpha.shape) not in (tuple(key_gate), full_gate) or alpha.dtype != k.dtype:
        raise ValueError(
            f"alpha={describe(alpha)}: expected a key gate {list(key_gate)} or a per-entry gate {list(full_gate)} "
            f"of dtype {k.dtype}"
        )


def _gate_tensor(gamma: float | Tensor, k: Tensor) -> Tensor:
    """gamma broadcast to one scalar per step and batch entry, [T, *batch]."""
    gamma = torch.as_tensor(gamma, dtype=k.dtype, device=k.device)
    try:
        return gamma.expand(k.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"gamma={describe(gamma)}: expected a float or a tensor broadcastable to {list(k.shape[1:-1])}"
        ) from None


def outer(v: Tensor, k: Tensor) -> Tensor:
    """v kᵀ: [..., d_v] x [..., d_k] -> [..., d_v, d_k]."""
    return v.unsqueeze(-1) * k.unsqueeze(-2)


def _projector(k: Tensor, beta: Tensor) -> Tensor:
    """I - β k kᵀ: [T, *batch, d_k], [T, *batch] -> [T, *batch, d_k, d_k]."""
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)  # [d_k, d_k]
    return eye - beta[..., None, None] * outer(k, k)


def _scalar_transition(gate: Tensor) -> Tensor:
    """[T, *batch] -> [T, *batch, 1, 1]."""
    return gate[..., None, None]


def linear_attention_elements(k: Tensor, v: Tensor) -> AffineSequence:
    """Linear attention: E = I (ones [T, *batch, 1, 1]), f = v kᵀ."""
    _check_keys_values(k, v)
    return AffineSequence(_scalar_transition(torch.ones_like(k[..., 0])), outer(v, k), "diagonal")


def retnet_elements(k: Tensor, v: Tensor, gamma: float | Tensor) -> AffineSequence:
    """RetNet: E = γ I (γ [T, *batch, 1, 1]; gamma a float or per-head [H]), f = v kᵀ."""
    _check_keys_values(k, v)
    return AffineSequence(_scalar_transition(_gate_tensor(gamma, k)), outer(v, k), "diagonal")


def diagonal_gate_elements(k: Tensor, v: Tensor, alpha: Tensor) -> AffineSequence:
    """GLA / Mamba-like: E = diag(α_t); alpha [T, *batch, d_k] or [T, *batch, d_v, d_k]; f = v kᵀ."""
    _check_keys_values(k, v)
    _check_diagonal_gate(alpha, k, v)
    transition = alpha.unsqueeze(-2) if alpha.shape == k.shape else alpha  # [T, *batch, 1 | d_v, d_k]
    return AffineSequence(transition, outer(v, k), "diagonal")


def deltanet_elements(k: Tensor, v: Tensor, beta: Tensor) -> AffineSequence:
    """DeltaNet: E = I - β k kᵀ [T, *batch, d_k, d_k], f = β v kᵀ."""
    _check_keys_values(k, v)
    _check_per_step("beta", beta, k)
    return AffineSequence(_projector(k, beta), beta[..., None, None] * outer(v, k), "matrix")


def gated_deltanet_elements(k: Tensor, v: Tensor, beta: Tensor, alpha: Tensor) -> AffineSequence:
    """Gated DeltaNet: E = α (I - β k kᵀ) [T, *batch, d_k, d_k], f = β v kᵀ; alpha [T, *batch]."""
    _check_keys_values(k, v)
    _check_per_step("beta", beta, k)
    _check_per_step("alpha", alpha, k)
    transition = alpha[..., None, None] * _projector(k, beta)
    return AffineSequence(transition, beta[..., None, None] * outer(v, k), "matrix")


def _zero_state(k: Tensor, v: Tensor) -> Tensor:
    return k.new_zeros((*k.shape[1:-1], v.shape[-1], k.shape[-1]))  # [*batch, d_v, d_k]


def _delta_rule(state: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """S + β (v - S k) kᵀ: write β of the error of what S recalls for k."""
    recalled = (state @ k.unsqueeze(-1)).squeeze(-1)  # [*batch, d_v]
    return state + beta[..., None, None] * outer(v - recalled, k)


def linear_attention_recurrence(k: Tensor, v: Tensor) -> Tensor:
    """S_t = S_{t-1} + v_t k_tᵀ; states [T, *batch, d_v, d_k]."""
    _check_keys_values(k, v)
    state, states = _zero_state(k, v), []
    for step in range(k.shape[0]):
        state = state + outer(v[step], k[step])
        states.append(state)
    return torch.stack(states)


def retnet_recurrence(k: Tensor, v: Tensor, gamma: float | Tensor) -> Tensor:
    """S_t = γ S_{t-1} + v_t k_tᵀ; states [T, *batch, d_v, d_k]."""
    _check_keys_values(k, v)
    decay = _gate_tensor(gamma, k)[..., None, None]  # [T, *batch, 1, 1]
    state, states = _zero_state(k, v), []
    for step in range(k.shape[0]):
        state = decay[step] * state + outer(v[step], k[step])
        states.append(state)
    return torch.stack(states)


def diagonal_gate_recurrence(k: Tensor, v: Tensor, alpha: Tensor) -> Tensor:
    """S_t = S_{t-1} diag(α_t) + v_t k_tᵀ, or α_t ⊙ S_{t-1} + v_t k_tᵀ for a per-entry gate."""
    _check_keys_values(k, v)
    _check_diagonal_gate(alpha, k, v)
    state, states = _zero_state(k, v), []
    for step in range(k.shape[0]):
        if alpha.shape == k.shape:
            state = state @ torch.diag_embed(alpha[step]) + outer(v[step], k[step])
        else:
            state = alpha[step] * state + outer(v[step], k[step])
        states.append(state)
    return torch.stack(states)


def deltanet_recurrence(k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """The delta rule S_t = S_{t-1} + β_t (v_t - S_{t-1} k_t) k_tᵀ; states [T, *batch, d_v, d_k]."""
    _check_keys_values(k, v)
    _check_per_step("beta", beta, k)
    state, states = _zero_state(k, v), []
    for step in range(k.shape[0]):
        state = _delta_rule(state, k[step], v[step], beta[step])
        states.append(state)
    return torch.stack(states)


def gated_deltanet_recurrence(k: Tensor, v: Tensor, beta: Tensor, alpha: Tensor) -> Tensor:
    """Decay then delta rule: S' = α_t S_{t-1}, S_t = S' + β_t (v_t - S' k_t) k_tᵀ."""
    _check_keys_values(k, v)
    _check_per_step("beta", beta, k)
    _check_per_step("alpha", alpha, k)
    state, states = _zero_state(k, v), []
    for step in range(k.shape[0]):
        state = _delta_rule(alpha[step][..., None, None] * state, k[step], v[step], beta[step])
        states.append(state)
    return torch.stack(states)
