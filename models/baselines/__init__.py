"""rcswarm.models.baselines."""
