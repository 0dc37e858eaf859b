"""rcswarm.kernels.scan."""
