"""`rcswarm worker` with TLS settings that do not match the coordinator's ends at once (exit 1, one ERROR line naming
the problem and the fix) instead of retrying for its whole patience (300 s by default): plaintext against a
coordinator started with TLS, and a --tls-ca from another quick-start directory."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rcswarm.coordinator import TLSFiles
from rcswarm.coordinator.tls import ensure_quick_start
from tests.helpers.processes import worker_env
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.tls import QUICK_NAMES


@pytest.mark.slow
@pytest.mark.parametrize("ca", ["none", "stranger"])
def test_a_worker_with_tls_settings_the_coordinator_does_not_match_ends_at_once(
        start_coordinator: Any, tmp_path: Path, ca: str) -> None:
    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    local = start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key))
    flags = [] if ca == "none" else ["--tls-ca", str(ensure_quick_start(tmp_path / "stranger", QUICK_NAMES).ca)]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli", "worker", "--coordinator", local.target, *flags, "--name", "lost",
         "--threads", "1"],  # the default patience, 300 s
        env=worker_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < 60, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert "lost gives up: Join: " in errors[0] and "pass --tls-ca with the coordinator's CA certificate" in errors[0]
    if ca == "none":
        assert f"{local.target} requires TLS" in errors[0], errors[0]
    else:
        assert "does not verify against --tls-ca" in errors[0] and "CERTIFICATE_VERIFY_FAILED" in errors[0], errors[0]
    assert "retrying in" not in result.stderr, "no retry: retrying cannot change the settings"
    assert local.service.status().workers == []


@pytest.mark.parametrize("ca", ["none", "stranger"])
def test_rcswarm_status_names_tls_settings_the_coordinator_does_not_match(
        start_coordinator: Any, tmp_path: Path, ca: str, capsys: pytest.CaptureFixture[str]) -> None:
    from rcswarm.cli.status import main

    quick = ensure_quick_start(tmp_path / "tls", QUICK_NAMES)
    local = start_coordinator(tiny_spec(), tls=TLSFiles(quick.cert, quick.key))
    flags = [] if ca == "none" else ["--tls-ca", str(ensure_quick_start(tmp_path / "stranger", QUICK_NAMES).ca)]
    assert main(["--coordinator", local.target, "--token", TOKEN, *flags]) == 1
    said = capsys.readouterr().err
    assert "pass --tls-ca with the coordinator's CA certificate" in said, said  # before: gRPC's "Socket closed" alone
    assert (f"{local.target} requires TLS" if ca == "none" else "does not verify against --tls-ca") in said, said
