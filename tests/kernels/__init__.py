"""Tests of kernels/: scans, the RWKV product and SGSA against their references (Triton's interpreter: tests/swarm/)."""
