"""The local trainer: the loss, the inner step and optimizer, data streams, streaming BPTT (`bptt/`)."""
