"""The wheel installs nothing but the `rcswarm` package (plus its dist-info) and the CLI, and every package folder."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def package_folders() -> list[str]:
    """Every folder of the tree with an `__init__.py`, tests/ aside."""
    tracked = subprocess.run(["git", "ls-files", "*__init__.py"], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=60).stdout.split()
    folders = sorted({str(Path(path).parent) for path in tracked} - {"."})
    return [folder for folder in folders if folder.split("/")[0] != "tests"]


def test_wheel_top_level_names(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("rcswarm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"rcswarm"}, top
    for module in ("coordinator/server.py", "worker/worker.py", "protos/v1/coordinator_pb2.py",
                   "protos/v1/coordinator.proto", "models/lstm_lm/model.py", "data/text/stdlib.py"):
        assert f"rcswarm/{module}" in names, module
    for package in package_folders():
        assert f"rcswarm/{package}/__init__.py" in names, f"{package}/ is a package but not in the wheel"
    assert not any(name.startswith("rcswarm/tests/") for name in names)
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    assert "rcswarm = rcswarm.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
