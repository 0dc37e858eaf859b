"""The dashboard's fixtures (tests/helpers/dashboard.py): an in-process coordinator fed metrics from a known law,
a sweep, and a pruned sweep with forecasts (tests/helpers/forecasts.py)."""

from tests.helpers.dashboard import swarm, sweep  # noqa: F401  (fixtures)
from tests.helpers.forecasts import served  # noqa: F401  (fixture)
