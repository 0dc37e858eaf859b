"""The state dir: SQLite (run state, rounds, events, metrics) and safetensors checkpoints; every SQL statement."""
