"""Tests that start processes (workers, coordinators, Ray, hivemind peers, git, Chromium, a build, Triton's
interpreter); tests/swarm/conftest.py marks every one of them slow."""
