"""Forward-FLOP estimates of the frame model, exactly as in the paper's Appendix J.

Conventions (Appendix J): one multiply-add is 2 FLOPs; biases, softmax,
normalization, pooling, embeddings and other element-wise work (O(B T D)) are
left out. With B batch size, D width, r the MLP ratio (`mlp_ratio`), N_f cells
per frame, P pooling stages, L_t blocks after pooling and T_s := N_f / 2^s:

    TF block at length T:             (8 + 4r) B D^2 T + 4 B D T^2
    LSTM D_in -> H over T steps:      8 B T (D_in H + H^2)       (reduction LSTM: 16 B D^2 T_P)
    MLP D -> rD -> D over T steps:    4r B T D^2

    frame head (Eq. 15) = sum_{s<P} block(T_s) + L_t block(T_P) + 16 B D^2 T_P
    main model          = L_s [8 B T (D H + H^2) + 4r B T D^2]

The paper's model has r = 4 (24 B D^2 T a block, 16 B T D^2 an MLP), which is
what its Appendix J writes; every function here takes r and defaults to 4.

Two things the formulas do not count, by the paper's choice: the H -> D
projection of a main layer when n_hidden != d_model (2 B T H D per layer) and
the action head (2 B T D V). Note also how the Appendix J table adds things
up: its frame-head rows are for B frames (one frame per batch row) while its
main-model rows cover B x T_s steps; a training window of T_s frames runs the
frame head T_s times. `window_flops` gives that per-window total.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from rcswarm.models.frame.config import FrameModelConfig

FRAME_HEAD = "frame_head"
MAIN = "main"


def _check_count(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: expected an int >= {minimum}")


def transformer_block_flops(batch: int, d_model: int, seq_len: int, *, mlp_ratio: int = 4) -> int:
    """(8 + 4r) B D^2 T + 4 B D T^2: QKV, output projection, MLP (D -> rD -> D), QK^T and AV."""
    return (8 + 4 * mlp_ratio) * batch * d_model**2 * seq_len + 4 * batch * d_model * seq_len**2


def lstm_flops(batch: int, d_in: int, d_hidden: int, seq_len: int) -> int:
    """8 B T (D_in H + H^2): four gates of input and recurrent matmuls."""
    return 8 * batch * seq_len * (d_in * d_hidden + d_hidden**2)


def mlp_flops(batch: int, d_model: int, seq_len: int, *, mlp_ratio: int = 4) -> int:
    """4r B T D^2: D -> rD -> D."""
    return 4 * mlp_ratio * batch * seq_len * d_model**2


@dataclass(frozen=True)
class FlopsComponent:
    """One row of the Appendix J table: a name, its forward FLOPs and which part it is of."""

    name: str
    flops: int
    part: str


@dataclass(frozen=True)
class FlopsEstimate:
    """Per-component forward FLOPs; totals and shares as in the Appendix J table."""

    components: tuple[FlopsComponent, ...]

    def _sum(self, part: str | None) -> int:
        return sum(c.flops for c in self.components if part is None or c.part == part)

    @property
    def frame_head(self) -> int:
        return self._sum(FRAME_HEAD)

    @property
    def main(self) -> int:
        return self._sum(MAIN)

    @property
    def total(self) -> int:
        return self._sum(None)

    def component(self, name: str) -> int:
        """FLOPs of the component called `name`; KeyError listing the names if none."""
        for c in self.components:
            if c.name == name:
                return c.flops
        raise KeyError(f"no component {name!r}: expected one of {[c.name for c in self.components]}")

    def share(self, flops: int) -> float:
        """`flops` as a fraction of the total."""
        return flops / self.total


def frame_head_components(
    batch: int, d_model: int, n_cells: int, n_pool: int, n_frame_layers: int, *, mlp_ratio: int = 4
) -> tuple[FlopsComponent, ...]:
    """The terms of Eq. 15 for B frames of N_f cells, one component per table row."""
    _check_count("batch", batch)
    _check_count("d_model", d_model)
    _check_count("mlp_ratio", mlp_ratio)
    _check_count("n_cells", n_cells)
    _check_count("n_pool", n_pool, 0)
    _check_count("n_frame_layers", n_frame_layers, 0)
    if n_cells % 2**n_pool != 0:
        raise ValueError(f"n_cells={n_cells!r}: expected a multiple of 2**n_pool={2**n_pool}")
    lengths = [n_cells // 2**s for s in range(n_pool + 1)]  # T_0 .. T_P
    rows = [
        FlopsComponent(
            f"frame-head TF block (T={t}) x1",
            transformer_block_flops(batch, d_model, t, mlp_ratio=mlp_ratio),
            FRAME_HEAD,
        )
        for t in lengths[:-1]
    ]
    t_p = lengths[-1]
    rows.append(
        FlopsComponent(
            f"frame-head TF blocks (T={t_p}) x{n_frame_layers}",
            n_frame_layers * transformer_block_flops(batch, d_model, t_p, mlp_ratio=mlp_ratio),
            FRAME_HEAD,
        )
    )
    rows.append(
        FlopsComponent(
            f"frame-head reduction LSTM (T={t_p})",
            lstm_flops(batch, d_model, d_model, t_p),
            FRAME_HEAD,
        )
    )
    return tuple(rows)


def main_components(
    batch: int, d_model: int, n_hidden: int, seq_len: int, n_main_layers: int, *, mlp_ratio: int = 4
) -> tuple[FlopsComponent, ...]:
    """The main-model terms for B sequences of T_s frames: LSTMs, then MLPs."""
    _check_count("batch", batch)
    _check_count("d_model", d_model)
    _check_count("mlp_ratio", mlp_ratio)
    _check_count("n_hidden", n_hidden)
    _check_count("seq_len", seq_len)
    _check_count("n_main_layers", n_main_layers)
    where = f"({n_main_layers} layers, T={seq_len})"
    return (
        FlopsComponent(
            f"main LSTM {where}",
            n_main_layers * lstm_flops(batch, d_model, n_hidden, seq_len),
            MAIN,
        ),
        FlopsComponent(
            f"main MLP {where}",
            n_main_layers * mlp_flops(batch, d_model, seq_len, mlp_ratio=mlp_ratio),
            MAIN,
        ),
    )


def estimate_flops(config: FrameModelConfig, batch: int, seq_len: int) -> FlopsEstimate:
    """The Appendix J table for `config`: frame head on B frames, main model on B x T_s steps."""
    head = frame_head_components(
        batch, config.d_model, config.n_cells, config.n_pool, config.n_frame_layers,
        mlp_ratio=config.mlp_ratio,
    )
    main = main_components(
        batch, config.d_model, config.n_hidden, seq_len, config.n_main_layers, mlp_ratio=config.mlp_ratio
    )
    return FlopsEstimate(head + main)


def frame_head_closed_form(
    batch: int, d_model: int, n_cells: int, n_pool: int, n_frame_layers: int, *, mlp_ratio: int = 4
) -> Fraction:
    """Eq. 16, the closed form of Eq. 15 (exact rational arithmetic), for MLP ratio r.

    B D N_f^2 [16/3 (1 - 4^-P) + 4 L_t 4^-P] + B D^2 N_f [(16 + 8r) + ((8 + 4r) L_t - 8r) 2^-P];
    the paper's r = 4 gives its B D^2 N_f [48 + (24 L_t - 32) 2^-P].
    """
    quarter = Fraction(1, 4**n_pool)
    half = Fraction(1, 2**n_pool)
    attention = Fraction(16, 3) * (1 - quarter) + 4 * n_frame_layers * quarter
    dense = 16 + 8 * mlp_ratio + ((8 + 4 * mlp_ratio) * n_frame_layers - 8 * mlp_ratio) * half
    return batch * d_model * n_cells**2 * attention + batch * d_model**2 * n_cells * dense


def window_flops(config: FrameModelConfig, batch: int, n_frames: int) -> int:
    """Forward FLOPs of one training window: the frame head on all B x L frames plus the main model."""
    per_frame_batch = estimate_flops(config, batch, n_frames)
    return n_frames * per_frame_batch.frame_head + per_frame_batch.main


def training_step_flops(config: FrameModelConfig, batch: int, n_frames: int, *, streaming: bool = True,
                        core_recompute: bool = False) -> int:
    """FLOPs of one training step (forward and backward) on B windows of L frames, from `window_flops`' parts.

    The backward pass counts twice the forward (the usual convention). Plain autograd: 3x the forward of
    everything. Streaming BPTT (Section 10.3): the frame head runs forward without gradients, again with
    gradients (the recomputation) and backward, 4x its forward; the main model 3x, or 4x when core
    checkpointing runs its segments again (at least once each; a binomial schedule with few slots more).
    """
    per_frame_batch = estimate_flops(config, batch, n_frames)
    head = n_frames * per_frame_batch.frame_head
    if not streaming:
        return 3 * (head + per_frame_batch.main)
    return 4 * head + (4 if core_recompute else 3) * per_frame_batch.main


def step_seconds(flops: int, peak_flops: float, utilization: float) -> float:
    """Seconds for `flops` at `utilization` (model FLOPs utilization, in (0, 1]) of a device's `peak_flops`."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization={utilization!r}: expected a fraction in (0, 1]")
    if not peak_flops > 0:
        raise ValueError(f"peak_flops={peak_flops!r}: expected a positive FLOP/s")
    return flops / (peak_flops * utilization)
