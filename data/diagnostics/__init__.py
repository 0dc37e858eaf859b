"""rcswarm.data.diagnostics."""
