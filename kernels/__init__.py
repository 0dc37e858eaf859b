"""rcswarm.kernels: the sequence kernels (rwkv_product, sgsa, scan) and the one Triton probe (`triton_probe.py`) their dispatches share."""
