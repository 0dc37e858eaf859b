"""rcswarm.models.chaingpt."""
