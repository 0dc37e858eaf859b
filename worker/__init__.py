"""rcswarm.worker."""
