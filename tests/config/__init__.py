"""Tests of config/: the run spec, typed and validated."""
