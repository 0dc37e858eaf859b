"""rcswarm.models.psm: Transformer-PSM (prefix-scannable model), registered as "psm".

Presets (chunk size c, width d, heads, Agg/Inf layers):

- "tiny": c 4, d 32, 2 heads, 1/1 layers; for tests.
- "small": c 8, d 128, 4 heads, 1/2 layers; CPU diagnostics.
- "s5": c 1, d 128, 1 head, 1/1 layers; the paper's S5 setting (Section 4.1) scaled down.
- "mqar": c 32, d 128, 1 head, 2/2 layers, linear compression; Section 4.2 scaled down.
"""

from rcswarm.models.psm.config import TransformerPSMConfig
from rcswarm.models.psm.model import PSMStream, TransformerPSM
from rcswarm.models.psm.presets import PRESETS
from rcswarm.models.registry import ModelEntry, register

register(
    ModelEntry(
        name="psm",
        config_cls=TransformerPSMConfig,
        build=TransformerPSM,
        presets=PRESETS,
        description="Transformer-PSM: chunked causal Transformer over Blelloch-scanned chunk states.",
    )
)

__all__ = ["PRESETS", "PSMStream", "TransformerPSM", "TransformerPSMConfig"]
