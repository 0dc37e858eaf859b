"""rcswarm.coordinator."""
