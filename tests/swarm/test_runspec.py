"""`rcswarm coordinator` refuses a bad run config, and a missing join token, at start (its own process)."""

import os
import subprocess
import sys

from tests.helpers.specs import tiny_spec, write_spec


def test_coordinator_refuses_a_bad_config_at_start(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[sync]\ncodec = "zstd"\n')
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir", str(tmp_path / "s"),
         "--port", "0", "--token", "x"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert "sync.codec = 'zstd'" in result.stderr


def test_a_coordinator_without_a_token_refuses_before_touching_the_state_dir(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RCSWARM_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(write_spec(tiny_spec(), tmp_path / "run.toml")),
         "--state-dir", str(tmp_path / "state"), "--port", "0"],
        check=False, capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 2
    assert "rcswarm coordinator: a join token is required" in result.stderr
    assert not (tmp_path / "state").exists()
