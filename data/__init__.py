"""rcswarm.data."""
