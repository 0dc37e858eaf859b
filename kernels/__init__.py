"""rcswarm.kernels."""
