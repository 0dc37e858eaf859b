"""Named presets of Transformer-PSM (listed in the package docstring)."""

from __future__ import annotations

PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"chunk_size": 4, "d_model": 32, "n_heads": 2, "agg_layers": 1, "inf_layers": 1},
    "small": {"chunk_size": 8, "d_model": 128, "n_heads": 4, "agg_layers": 1, "inf_layers": 2},
    "s5": {"chunk_size": 1, "d_model": 128, "n_heads": 1, "agg_layers": 1, "inf_layers": 1},
    "mqar": {"chunk_size": 32, "d_model": 128, "n_heads": 1, "agg_layers": 2, "inf_layers": 2, "compression": "linear"},
}
