"""Named presets of the residual LSTM LM (parameter counts in the package docstring)."""

from __future__ import annotations

PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 1},
    "small": {"d_model": 192, "n_layers": 2},
    "base10m": {"d_model": 448, "n_layers": 3},
    "base50m": {"d_model": 1024, "n_layers": 3},
}
