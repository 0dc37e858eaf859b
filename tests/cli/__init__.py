"""Tests of cli/: the commands' help and errors, `rcswarm fit`, `rcswarm bench diag`, the demo's spec."""
