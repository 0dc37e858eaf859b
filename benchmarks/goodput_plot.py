"""Several goodput soaks (`chaos_soak.py --goodput-cycles N --json F`) in one figure, one panel each.

    python benchmarks/goodput_plot.py --out docs/img/goodput_churn.png "before=a.json" "after=b.json"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_soak import Window, draw_goodput  # noqa: E402 - a benchmark's sibling


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="goodput_plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=JSON", help="a label and a soak's --json verdict")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    runs = []
    for item in args.runs:
        label, _, path = item.partition("=")
        if not path:
            parser.error(f"{item!r}: expected LABEL=JSON")
        runs.append((label, json.loads(Path(path).read_text())))
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.4 * len(runs)), squeeze=False, sharex=True)
    for ax, (label, verdict) in zip(axes[:, 0], runs):
        windows = [Window(**w) for w in verdict["windows"]]
        draw_goodput(ax, windows, [tuple(x) for x in verdict["series"]], [tuple(x) for x in verdict["fault_times"]],
                     f"{label}: goodput {verdict['goodput']:.3f}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"goodput_plot: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
