"""Tests of observe/: the dashboard, fits, the mirrored swarm view."""
