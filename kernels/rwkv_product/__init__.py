"""rcswarm.kernels.rwkv_product."""
