"""rcswarm.kernels.sgsa: state-guided sparse attention (ChainGPT, Section 3.3, Appendix D.2).

Causal attention where query i sees key j ≤ i when i - j < W (local window) or
j mod G = G - 1 (periodic anchors), with grouped-query heads.

- `sgsa_attention`: the dispatcher: Triton kernels for CUDA tensors when triton is installed,
  the blocked CPU path otherwise, `naive=True` for the dense mask.
- `sgsa_naive`, `sgsa_mask`: the dense [T, T] definition (`naive.py`).
- `sgsa_sparse`: query blocks against exactly their window's key blocks plus the anchors before
  the window, one softmax, hand-written backward (`sparse.py`).
- `rcswarm.kernels.sgsa.triton_flash.sgsa_triton`: flash-attention-style Triton kernels, forward
  and backward, visiting only the window's key blocks and the gathered anchors (not imported
  here, so importing this package never imports triton).
"""

from rcswarm.kernels.sgsa.dispatch import sgsa_attention
from rcswarm.kernels.sgsa.naive import sgsa_mask, sgsa_naive
from rcswarm.kernels.sgsa.sparse import sgsa_sparse

__all__ = ["sgsa_attention", "sgsa_mask", "sgsa_naive", "sgsa_sparse"]
