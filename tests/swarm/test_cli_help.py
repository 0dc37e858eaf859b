"""`rcswarm --version` as its own process."""

from __future__ import annotations

import subprocess
import sys


def test_version_names_the_installed_distribution() -> None:
    out = subprocess.run([sys.executable, "-m", "rcswarm.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("rcswarm ") and "unknown" not in out.stdout
