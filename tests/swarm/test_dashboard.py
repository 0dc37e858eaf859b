"""The dashboard with real processes: headless Chromium renders its pages (and measures that they fit the window
at common widths); `rcswarm coordinator --http-port 0` serves it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import dashboard
from tests.helpers.browser import CHROMIUM, Browser
from tests.helpers.dashboard import assert_png_not_blank, get
from tests.helpers.specs import tiny_spec

# The dashboard's fixtures (a coordinator fed metrics, a sweep), in place of tests/swarm/conftest.py's hivemind `swarm`.
swarm, sweep = dashboard.swarm, dashboard.sweep
needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                    reason=f"{CHROMIUM} is not installed (apt-get install -y chromium)")


def chromium(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess:
    """Headless Chromium with a throw-away profile in tmp_path."""
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", *arguments,
    ]
    try:
        return subprocess.run(command, check=False, capture_output=True, timeout=90, cwd=tmp_path,
                              env={**os.environ, "HOME": str(tmp_path)})
    finally:
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)


@needs_chromium
def test_headless_browser_renders_the_page(swarm: Any, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    result = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,900", swarm.base)
    assert shot.exists(), f"chromium exited {result.returncode} without a screenshot:\n{result.stderr.decode()[-2000:]}"
    image = assert_png_not_blank(shot.read_bytes(), min_size=(1000, 700))
    assert image.shape[1] == 1200


@contextlib.contextmanager
def coordinator_cli(config: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, dict[str, Any]]]:
    """`rcswarm coordinator --http-port 0` in a subprocess; yields it and its port file once serving."""
    import sys

    from tests.helpers.processes import worker_env
    from tests.helpers.waiting import wait_for

    port_file = tmp_path / "port.json"
    with open(tmp_path / "coordinator.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir",
             str(tmp_path / "state"), "--port", "0", "--http-port", "0", "--port-file", str(port_file)],
            env=worker_env(), stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        yield proc, wait_for(lambda: port_file.exists() and json.loads(port_file.read_text()), 60, "the port file")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_coordinator_cli_serves_the_dashboard(tmp_path: Path) -> None:
    import signal
    import time

    from prometheus_client.parser import text_string_to_metric_families

    from tests.helpers.specs import write_spec

    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    with coordinator_cli(config, tmp_path) as (proc, info):
        base = f"http://127.0.0.1:{info['http_port']}/"
        assert get(base + "healthz")[:2] == (200, "text/plain; charset=utf-8")
        data = json.loads(get(base + "api/status")[2])
        assert data["run_id"] == info["run_id"] and data["workers"] == []
        page = get(base)[2].decode()
        assert "no workers have joined" in page and "not enough lengths for a fit" in page
        for plot in ("loss_step", "loss_time", "alpha"):
            assert_png_not_blank(get(base + f"plot/{plot}.png")[2])  # a "no metrics yet" panel
        families = {f.name for f in text_string_to_metric_families(get(base + "metrics")[2].decode())}
        assert "rcswarm_version" in families and "rcswarm_workers_active" in families
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 15
    assert "dashboard on http://127.0.0.1:" in (tmp_path / "coordinator.log").read_text()


@needs_chromium
def test_headless_browser_renders_the_sweep_page(sweep: Any, tmp_path: Path) -> None:
    dom = chromium(tmp_path, "--dump-dom", sweep.base).stdout.decode()
    fit = json.loads(get(sweep.base + "api/status")[2])["fits"]["fit"]
    assert f"<td>{fit['alpha_inf']:.4f} [" in dom, dom[-2000:]
    shot = tmp_path / "page.png"
    result = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,2600", sweep.base)
    assert shot.exists(), f"chromium exited {result.returncode} without a screenshot:\n{result.stderr.decode()[-2000:]}"
    image = assert_png_not_blank(shot.read_bytes(), min_size=(1400, 2000))
    # matplotlib's first colour (#1f77b4) is drawn only by the plots' curves and points.
    pixels = (image[..., :3] * 255).round().reshape(-1, 3)
    curve = np.all(np.abs(pixels - np.array([31, 119, 180])) <= 12, axis=1)
    assert curve.sum() > 500, f"{curve.sum()} pixels of the plots' first colour: are the plots blank?"


def test_coordinator_cli_serves_a_sweep_dashboard(tmp_path: Path) -> None:
    import signal

    base = tiny_spec()
    config = tmp_path / "sweep.toml"
    config.write_text(base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [8, 16, 32]}}).to_toml())
    with coordinator_cli(config, tmp_path) as (proc, info):
        base_url = f"http://127.0.0.1:{info['http_port']}/"
        data = json.loads(get(base_url + "api/status")[2])
        assert data["kind"] == "sweep" and [r["seq_len"] for r in data["runs"]] == [8, 16, 32]
        assert "rcswarm sweep test" in get(base_url)[2].decode()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


@needs_chromium
@pytest.mark.parametrize("width", [1400, 1024])
def test_the_sweep_page_fits_common_window_widths(sweep: Any, tmp_path: Path, width: int) -> None:
    """Measured in the browser: nothing passes the window's right edge, and no table needs to scroll inside its
    own box. The screenshot is the whole page at that width."""
    with Browser() as browser:
        page = browser.page(sweep.base, width)
        layout = page.overflow()
        shot = page.screenshot(tmp_path / f"sweep-{width}.png")
    assert layout["width"] == width and layout["scrollWidth"] <= width, layout
    assert layout["over"] == [] and layout["scrolled"] == [], layout
    image = assert_png_not_blank(shot.read_bytes(), min_size=(width, 2000))
    assert image.shape[1] == width


@needs_chromium
def test_a_table_too_wide_for_the_window_scrolls_inside_its_box(sweep: Any) -> None:
    """A worker named with 128 characters and no space (the longest name a join keeps) widens the tables that
    show it past a 1,024 px window: they scroll inside their own boxes and the page does not."""
    from rcswarm.worker.client import CoordinatorClient, RetryPolicy
    from tests.helpers.specs import TOKEN

    client = CoordinatorClient(sweep.target, TOKEN, retry=RetryPolicy(max_elapsed_s=5.0))
    try:
        client.join("node-" + "x" * 123, "cpu", 1)
    finally:
        client.close()
    with Browser() as browser:
        layout = browser.page(sweep.base, 1024).overflow()
    assert layout["scrollWidth"] <= 1024 and layout["over"] == [], layout
    # The tables that show the name scroll: the workers, and the runs (their workers assigned).
    assert sorted(title.split(" ")[0] for title in layout["scrolled"]) == ["runs", "workers"], layout
