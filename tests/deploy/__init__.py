"""Tests of what ships: the Helm chart and images, the layering, the README and the examples."""
