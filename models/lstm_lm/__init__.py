"""rcswarm.models.lstm_lm: the residual LSTM byte-level LM, registered as "lstm_lm".

Presets:

- "tiny": d_model 32, 1 layer (25,184 parameters); for tests.
- "small": d_model 192, 2 layers (1,235,712 parameters); the demo model.
- "base10m": d_model 448, 3 layers (9,772,224 parameters); for the sync benchmark.
- "base50m": d_model 1024, 3 layers (50,648,064 parameters); the sync benchmark at 50 M.
"""

from rcswarm.models.lstm_lm.config import ResidualLSTMConfig
from rcswarm.models.lstm_lm.model import LSTMState, ResidualLSTMLM
from rcswarm.models.lstm_lm.presets import PRESETS
from rcswarm.models.registry import ModelEntry, register

register(
    ModelEntry(
        name="lstm_lm",
        config_cls=ResidualLSTMConfig,
        build=ResidualLSTMLM,
        presets=PRESETS,
        description="Byte-level LM of pre-norm residual LSTM + MLP blocks, tied embeddings.",
    )
)

__all__ = ["PRESETS", "LSTMState", "ResidualLSTMConfig", "ResidualLSTMLM"]
