"""Named presets of the baseline families: a "tiny" one for tests and a "small" one (about 1M parameters) for CPU experiments."""

from __future__ import annotations

LSTM_PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 2},
    "small": {"d_model": 256, "n_layers": 2},
}
TRANSFORMER_PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_len": 128},
    "small": {"d_model": 128, "n_layers": 4, "n_heads": 4, "max_len": 1024},
}
SSM_PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 2, "d_state": 8},
    "small": {"d_model": 192, "n_layers": 4},
}
SUM_PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 2},
    "small": {"d_model": 192, "n_layers": 3},
}
RWKV7_PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_model": 32, "n_layers": 2, "head_dim": 16},
    "small": {"d_model": 128, "n_layers": 4, "head_dim": 32},
}
