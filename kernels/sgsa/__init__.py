"""rcswarm.kernels.sgsa: state-guided sparse attention (ChainGPT, Section 3.3, Appendix D.2).

Causal attention where query i sees key j ≤ i when i - j < W (local window) or
j mod G = G - 1 (periodic anchors), with grouped-query heads.

- `sgsa_attention`: the dispatcher, sparse by default, `naive=True` for the dense mask.
- `sgsa_naive`, `sgsa_mask`: the dense [T, T] definition (`naive.py`).
- `sgsa_sparse`: window blocks plus gathered anchors merged by log-sum-exp (`sparse.py`).
"""

from rcswarm.kernels.sgsa.dispatch import sgsa_attention
from rcswarm.kernels.sgsa.naive import sgsa_mask, sgsa_naive
from rcswarm.kernels.sgsa.sparse import sgsa_sparse

__all__ = ["sgsa_attention", "sgsa_mask", "sgsa_naive", "sgsa_sparse"]
