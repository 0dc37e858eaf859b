"""Generated stubs of the rcswarm.v1 wire contract (see coordinator.proto)."""
