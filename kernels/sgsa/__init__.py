"""rcswarm.kernels.sgsa."""
