"""Observation of a run or a swarm from its state: analysis, fits, the report, the mirrored view, the dashboard."""
