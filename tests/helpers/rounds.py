"""What a coordinator's state dir says about its rounds: the parameter digests of each version, as workers
reported them and as the coordinator made them, and the mean training loss of each round."""

from __future__ import annotations

from tests.helpers.state import read_state


def worker_digests(state_dir) -> dict[int, set[str]]:
    """version -> the parameter digests workers reported right after pulling it."""
    digests: dict[int, set[str]] = {}
    for row in read_state(state_dir, lambda store: store.metric_rows()):
        if row.param_sha256:
            digests.setdefault(row.version, set()).add(row.param_sha256)
    return digests


def coordinator_digests(state_dir) -> dict[int, str]:
    """version -> digest of the global parameters of that version (from the rounds that made them)."""
    return {r.version + 1: r.param_sha256 for r in read_state(state_dir, lambda store: store.rounds())}


def round_losses(state_dir) -> list[float]:
    losses: dict[int, list[float]] = {}
    for row in read_state(state_dir, lambda store: store.metric_rows()):
        if row.tokens > 0 and row.loss is not None:
            losses.setdefault(row.version, []).append(row.loss)
    return [sum(values) / len(values) for _, values in sorted(losses.items())]


def assert_bases_match(state_dir, version0: str, versions: int) -> None:
    """Every digest a worker reported right after pulling (or merging onto) version v < `versions` is the
    coordinator's θ_v, bit for bit (`version0`: θ_0's)."""
    reported = worker_digests(state_dir)
    expected = {0: version0, **coordinator_digests(state_dir)}
    for version in range(versions):
        assert reported[version] == {expected[version]}, f"version {version}: {reported[version]} vs {expected[version]}"
