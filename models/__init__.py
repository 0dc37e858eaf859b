"""rcswarm.models."""
