"""Tests of models/: the registry and the model families."""
