"""rcswarm.models.psm."""
