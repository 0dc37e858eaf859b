"""The dashboard's fixtures (tests/helpers/dashboard.py): an in-process coordinator fed metrics from a known law,
and a sweep."""

from tests.helpers.dashboard import swarm, sweep  # noqa: F401  (fixtures)
