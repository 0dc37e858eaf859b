"""What a coordinator's state dir says about its rounds: the parameter digests of each version, as workers
reported them and as the coordinator made them, and the mean training loss of each round."""

from __future__ import annotations

from tests.conftest import sql


def worker_digests(state_dir) -> dict[int, set[str]]:
    """version -> the parameter digests workers reported right after pulling it."""
    rows = sql(state_dir, "SELECT version, param_sha256 FROM metrics WHERE param_sha256 != ''")
    digests: dict[int, set[str]] = {}
    for version, digest in rows:
        digests.setdefault(version, set()).add(digest)
    return digests


def coordinator_digests(state_dir) -> dict[int, str]:
    """version -> digest of the global parameters of that version (from the rounds that made them)."""
    rows = sql(state_dir, "SELECT version + 1, param_sha256 FROM rounds")
    return dict(rows)


def round_losses(state_dir) -> list[float]:
    rows = sql(state_dir, "SELECT version, AVG(loss) FROM metrics WHERE tokens > 0 GROUP BY version ORDER BY version")
    return [loss for _, loss in rows]
