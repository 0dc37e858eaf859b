"""The wheel installs nothing but the `rcswarm` package (plus its dist-info) and the CLI, and every package folder;
the offline GPU check's script (benchmarks/gpu_check_offline.sh, `make wheelhouse`) installs it beside a Python's own
packages and runs the check from there."""

import os
import shutil
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


def test_the_offline_gpu_check_installs_the_wheelhouse_aside_and_runs_from_it(tmp_path):
    """`sh wheelhouse/gpu-check.sh`: the wheels go to RCSWARM_SITE with pip --no-index, and `rcswarm bench gpu`
    runs from there (here: no CUDA, so its one line and exit 0). This Python stands in for a CUDA image's."""
    import torch

    house = tmp_path / "wheelhouse"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(house), str(ROOT)], check=True, capture_output=True, timeout=300)
    shutil.copy(ROOT / "benchmarks" / "gpu_check_offline.sh", house / "gpu-check.sh")
    python_dir = Path(sys.executable).parent  # `python3` first on the PATH is this one, as the image's is there
    assert (python_dir / "python3").exists(), f"no python3 beside {sys.executable}"
    site = tmp_path / "site"
    env = {**os.environ, "PATH": f"{python_dir}:{os.environ['PATH']}", "RCSWARM_SITE": str(site),
           "PIP_NO_INDEX": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["sh", str(house / "gpu-check.sh"), "--out", str(tmp_path / "check.json")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (site / "rcswarm" / "cli" / "bench_gpu.py").exists()
    if not torch.cuda.is_available():
        assert proc.stdout.startswith("rcswarm bench gpu: no CUDA device here"), proc.stdout
    where = subprocess.run([str(python_dir / "python3"), "-c", "import rcswarm.cli.bench_gpu as m; print(m.__file__)"],
                           env={**env, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip() == str(site / "rcswarm" / "cli" / "bench_gpu.py"), where
    # lease.sh (a lent GPU's one call): the check, then the CUDA-only tests, each with its log under $OUT.
    shutil.copy(ROOT / "benchmarks" / "gpu_lease.sh", house / "lease.sh")
    out = tmp_path / "out"
    out.mkdir()
    lease = subprocess.run(["sh", str(house / "lease.sh"), "1"], env={**env, "OUT": str(out)}, cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert lease.returncode == 0, lease.stdout + lease.stderr
    assert "check exit 0" in lease.stdout and "cuda tests exit 0" in lease.stdout, lease.stdout
    assert {path.name for path in out.iterdir()} >= {"check.log", "pytest.log"}
    assert " passed" in (out / "pytest.log").read_text()  # the CPU test of the side streams is among them
