"""The wheel installs nothing but the `rcswarm` package (plus its dist-info) and the CLI."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    assert not any(name.startswith("rcswarm/tests/") for name in names)
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    assert "rcswarm = rcswarm.worker.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
