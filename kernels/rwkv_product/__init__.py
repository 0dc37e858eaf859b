"""rcswarm.kernels.rwkv_product: the RWKV-7 generalized delta rule and RWKV-Product substeps.

After ChainGPT, Section 3.2 and Appendix D.1. Per head, S_t = S_{t-1} diag(w_t) +
(S_{t-1} a_t) b_tᵀ + v_t k_tᵀ, y_t = S_t r_t, w_t = exp(-exp(w_raw_t)).

- `rwkv_product`: the dispatcher: Triton kernels for CUDA tensors when triton is importable
  (`triton_kernel.rwkv_product_triton`, imported on demand), the chunked path otherwise,
  `naive=True` for the loop.
- `rwkv_product_naive`: the per-step loop, the definition (`naive.py`).
- `rwkv_product_chunked`: the WY / UT-transform chunked form with log-space relative decays
  and a hand-written backward for the sequential state passing.
- `expand_substeps`, `collapse_substeps`, `rwkv_product_substeps`: M substeps per token by
  token expansion.
"""

from rcswarm.kernels.rwkv_product.chunked import (
    DEFAULT_CHUNK_SIZE,
    rwkv_product_chunked,
)
from rcswarm.kernels.rwkv_product.dispatch import rwkv_product, rwkv_product_substeps
from rcswarm.kernels.rwkv_product.naive import rwkv_product_naive
from rcswarm.kernels.rwkv_product.substeps import collapse_substeps, expand_substeps

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "collapse_substeps",
    "expand_substeps",
    "rwkv_product",
    "rwkv_product_chunked",
    "rwkv_product_naive",
    "rwkv_product_substeps",
]
