"""Configuration of the recurrence-complete frame-based action model.

The field names follow the paper ("Recurrence-Complete Frame-based Action
Models", Section 10 and Appendix J) where it names them:

- `d_model` (D): width of the frame head and of the main model's residual stream.
- `n_hidden` (H): LSTM cell size of the main sequence model.
- `n_pool` (P): pooling stages in the frame head, each halving the cell sequence.
- `n_frame_layers` (L_t, the tables' n_layer): transformer blocks after the last pooling.
- `n_main_layers` (L_s, the tables' n_seq): LSTM + MLP layers of the main model.
- `rows` x `cols`: the frame's cell grid (N_f = rows * cols cells).

Everything else (vocabularies, heads, MLP ratio) is our choice; see the
package docstring for which is which.
"""

from __future__ import annotations

from dataclasses import dataclass

from rcswarm.models.validation import check_ints


@dataclass
class FrameModelConfig:
    """Hyperparameters of `FrameActionModel`; validated on construction.

    `vocab_size` (a read-only property) is `action_vocab`, as the registry's
    contract requires.
    """

    action_vocab: int = 20000
    char_vocab: int = 8192
    n_styles: int = 256
    rows: int = 48
    cols: int = 160
    d_model: int = 768
    n_heads: int = 12
    n_pool: int = 2
    n_frame_layers: int = 3
    n_hidden: int = 768
    n_main_layers: int = 2
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        check_ints(self, (
            "action_vocab",
            "char_vocab",
            "n_styles",
            "rows",
            "cols",
            "d_model",
            "n_heads",
            "n_hidden",
            "n_main_layers",
            "mlp_ratio",
        ))
        check_ints(self, ("n_pool", "n_frame_layers"), minimum=0)
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"FrameModelConfig.n_heads={self.n_heads!r}: expected a divisor of "
                f"d_model={self.d_model}"
            )
        if self.n_pool >= self.cols.bit_length():  # 2**n_pool > cols (and checked before computing a huge power)
            raise ValueError(
                f"FrameModelConfig.n_pool={self.n_pool!r}: expected at most {self.cols.bit_length() - 1} "
                f"(2**n_pool must divide cols={self.cols}; pooling merges horizontally adjacent cells)"
            )
        if self.cols % (2**self.n_pool) != 0:
            raise ValueError(
                f"FrameModelConfig.cols={self.cols!r}: expected a multiple of "
                f"2**n_pool={2**self.n_pool} (pooling merges horizontally adjacent cells)"
            )

    @property
    def vocab_size(self) -> int:
        """The action vocabulary (the registry's name for the output vocabulary)."""
        return self.action_vocab

    @property
    def n_cells(self) -> int:
        """N_f: cells per frame before pooling."""
        return self.rows * self.cols

    @property
    def n_pooled(self) -> int:
        """T_P: tokens per frame after the P pooling stages."""
        return self.n_cells // 2**self.n_pool
