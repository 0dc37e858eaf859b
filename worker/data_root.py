"""Where a worker reads the git dataset a run spec names: only at or under its `--data-root`.

A coordinator names the dataset (`[data.task_config] dataset`: absolute, or relative to the worker's working
directory, as the worker opens it). Before, a worker opened whatever path it was sent, so a coordinator could make
a worker started among its operator's own frame datasets train on one of them and send updates computed from it
(review of a hostile coordinator, 2026-11-28). Now the worker reads a dataset only where its operator allowed:
the path, resolved (symlinks followed, so a link that leads out of the root is refused), must be the data root or
lie under it; a worker without a data root reads none. A run spec from the operator's own file
(`rcswarm worker --backend hivemind --config RUN.toml` without a coordinator) is the operator's consent, and the
launchers (`rcswarm run`, the chart's `workers.dataRoot`, `rcswarm launch ray --data-root`) pass the root on.
"""

from __future__ import annotations

from pathlib import Path

from rcswarm.config.runspec import RunSpec

FLAG = "--data-root"


def data_root_problem(data_root: Path | None) -> str:
    """Why `data_root` (the --data-root flag) is not a data root ("" when it is, or is not given)."""
    if data_root is None or Path(data_root).is_dir():
        return ""
    return f"{FLAG} {data_root}: no such directory; expected the folder that holds the git datasets this worker may read"


def dataset_path(spec: RunSpec) -> Path | None:
    """The git dataset `spec` trains on, resolved from this process's working directory (None: it reads none)."""
    if spec.data.source != "git":
        return None
    return Path(str(spec.data.task_config.get("dataset", ""))).resolve()


def dataset_problem(spec: RunSpec, data_root: Path | None) -> str:
    """Why this worker does not read the git dataset `spec` names ("" when it may, or when the run reads none)."""
    resolved = dataset_path(spec)
    if resolved is None:
        return ""
    named = spec.data.task_config.get("dataset")
    if data_root is None:
        return (f"data.task_config.dataset = {named!r}: this worker reads a git dataset only at or under the folder "
                f"its operator names ({FLAG} DIR, the folder that holds it)")
    root = Path(data_root).resolve()
    if resolved == root or root in resolved.parents:
        return ""
    return (f"data.task_config.dataset = {named!r} is {resolved}, outside this worker's data root {root} "
            f"({FLAG}); expected a dataset at or under it")


def data_root_args(spec: RunSpec) -> list[str]:
    """The flags a launcher that read `spec` from its operator's file passes its local workers: the dataset that file
    names as their data root (they share the launcher's disk and working directory); none for a run without one."""
    path = dataset_path(spec)
    return [FLAG, str(path)] if path is not None else []
