"""Plot a `sync_bench.py --json` run: the coordinator backend against the hivemind backend as N grows.

    python benchmarks/sync_bench.py --preset base10m base50m --workers 2 4 8 --codecs int8 --json run.json
    python benchmarks/sync_bench_plot.py run.json docs/img/sync_backends.png

One row of panels per preset: bytes per round through the busiest machine's link (the coordinator's
for the coordinator backend, one peer's for the hivemind backend), CPU seconds per round of the
busiest machine (one machine per process group), and the round's wall time on the machine that ran
the benchmark (Δ in hand to θ_{v+1} in hand: the coordinator rows with their workers' encode).
Medians over the measured rounds; the configurations that failed are left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

SYSTEMS = {"rcswarm": ("coordinator backend", "tab:blue", "o"), "hivemind backend": ("hivemind backend", "tab:orange", "s")}


def series(configs: list[dict[str, Any]], system: str) -> dict[str, list[float]]:
    """Per worker count (ascending): busiest link MB, busiest machine CPU s, wall s with encode (medians)."""
    out: dict[str, list[float]] = {"n": [], "link_mb": [], "cpu_s": [], "wall_s": []}
    for config in sorted((c for c in configs if c["system"] == system and not c["error"]), key=lambda c: c["workers"]):
        rounds, n = config["rounds"], config["workers"]
        if system == "rcswarm":
            link = statistics.median(r["total_bytes"] for r in rounds)  # every push and pull crosses the coordinator's link
            wall = statistics.median(r["seconds"] + r["encode_phase_s"] for r in rounds)
        else:
            link = statistics.median(r["lo_bytes"] for r in rounds) / n  # what one peer sends (and receives)
            wall = statistics.median(r["seconds"] for r in rounds)
        out["n"].append(n)
        out["link_mb"].append(link / 1e6)
        out["cpu_s"].append(statistics.median(max(max(r["cpu_s"]), r["coordinator_cpu_s"]) for r in rounds))
        out["wall_s"].append(wall)
    return out


def plot(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = run["presets"]
    figure, axes = plt.subplots(len(presets), 3, figsize=(13, 3.6 * len(presets)), squeeze=False)
    titles = ("MB per round through the busiest link", "CPU s per round, busiest machine", "s per round on this 2-core box")
    for row, (preset, data) in enumerate(presets.items()):
        for system, (label, color, marker) in SYSTEMS.items():
            values = series(data["configs"], system)
            for col, key in enumerate(("link_mb", "cpu_s", "wall_s")):
                axes[row][col].plot(values["n"], values[key], marker=marker, color=color, label=label)
        for col, title in enumerate(titles):
            ax = axes[row][col]
            ax.set_title(f"{preset} ({data['n_params'] / 1e6:.1f} M params): {title}", fontsize=9)
            ax.set_xlabel("workers / peers")
            ax.set_xticks(sorted({c["workers"] for c in data["configs"]}))
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plot a sync_bench.py --json run (coordinator vs hivemind backend).")
    parser.add_argument("run", type=Path, help="the JSON sync_bench.py --json wrote")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    try:
        run = json.loads(args.run.read_text())
        if not isinstance(run.get("presets"), dict) or not run["presets"]:
            raise ValueError("expected a 'presets' object with at least one preset")
    except (OSError, ValueError) as exc:
        parser.error(f"{args.run}: {exc}")
    plot(run, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
