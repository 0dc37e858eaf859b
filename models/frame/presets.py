"""Named configurations of the frame model and parameter counting without allocation.

- "tiny": 8 x 16 frames, D 32, H 48 (so the H -> D projection is exercised); tests.
- "small": 12 x 40 frames, D 128, H 256; CPU experiments.
- "82m", "103m", "145m": the paper's rows (Section 10.4): 48 x 160 frames,
  d_model = n_hidden = 768, n_pool 2, n_layer (= L_t) 3 / 6 / 12, n_seq (= L_s) 2,
  action vocabulary 20000 (the paper's tokenizer). The character vocabulary
  (8192 hash buckets) and the 256 styles (8-bit style channel) are our choice.
  Exact counts: 81,075,456 / 102,339,072 / 144,866,304 (-1.1%, -0.6%, -0.1%
  of the names). Each frame-head block adds 12 D^2 + 13 D = 7,087,872, which is
  the step between the paper's 82M -> 103M (+3 layers) and 103M -> 145M
  (+6 layers), so n_layer is the number of blocks after pooling.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rcswarm.models.frame.config import FrameModelConfig
from rcswarm.models.frame.model import FrameActionModel

_PAPER_COMMON: dict[str, object] = {
    "action_vocab": 20000,
    "char_vocab": 8192,
    "n_styles": 256,
    "rows": 48,
    "cols": 160,
    "d_model": 768,
    "n_heads": 12,
    "n_pool": 2,
    "n_hidden": 768,
    "n_main_layers": 2,
    "mlp_ratio": 4,
}

PRESETS: dict[str, dict[str, object]] = {
    "tiny": {
        "action_vocab": 64,
        "char_vocab": 128,
        "n_styles": 8,
        "rows": 8,
        "cols": 16,
        "d_model": 32,
        "n_heads": 2,
        "n_pool": 2,
        "n_frame_layers": 1,
        "n_hidden": 48,
        "n_main_layers": 2,
    },
    "small": {
        "action_vocab": 512,
        "char_vocab": 256,
        "n_styles": 16,
        "rows": 12,
        "cols": 40,
        "d_model": 128,
        "n_heads": 4,
        "n_pool": 2,
        "n_frame_layers": 2,
        "n_hidden": 256,
        "n_main_layers": 2,
    },
    "82m": {**_PAPER_COMMON, "n_frame_layers": 3},
    "103m": {**_PAPER_COMMON, "n_frame_layers": 6},
    "145m": {**_PAPER_COMMON, "n_frame_layers": 12},
}

NOMINAL_PARAMETERS: Mapping[str, int] = {"82m": 82_000_000, "103m": 103_000_000, "145m": 145_000_000}
"""The paper's stated sizes of the presets named after them."""


def count_parameters(config: FrameModelConfig) -> int:
    """Number of scalar parameters of `FrameActionModel(config)`, built on the meta device.

    Nothing is allocated and the global RNG is not advanced.
    """
    with torch.device("meta"):
        model = FrameActionModel(config)
    return sum(p.numel() for p in model.parameters())
