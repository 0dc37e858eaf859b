"""Tests of coordinator/: in-process coordinators on loopback (real gRPC), decisions, aggregation, the round close."""
