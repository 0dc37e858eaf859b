"""Tests of state/: verified checkpoints, the store under dashboard load."""
