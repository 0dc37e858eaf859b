"""The HTTP dashboard, /metrics and `rcswarm status` against a real in-process coordinator."""

from __future__ import annotations

import itertools
import json
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rcswarm.cli import status as status_cli
from rcswarm.observe.dashboard.render import PLOTS
from tests.helpers.dashboard import ALPHA_INF, LENGTHS, STEPS, assert_png_not_blank, feed, feed_spec, get, true_loss
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for


def test_page_shows_workers_fit_and_crossovers(swarm: Any) -> None:
    status, content_type, body = get(swarm.base)
    assert status == 200 and content_type.startswith("text/html")
    page = body.decode()
    for length in LENGTHS:
        assert f"gpu-{length}" in page
    fit = json.loads(get(swarm.base + "api/status")[2])["fits"]["fit"]
    # α∞ with its interval, τ, R² and the verdict stand together; this law's data identify it.
    assert f"<td>{fit['alpha_inf']:.4f} [{fit['alpha_inf_low']:.4f}, {fit['alpha_inf_high']:.4f}]</td>" in page
    # The law's own section (the forecasts' table above it may say "not enough data" for a run's few rounds).
    law = page[page.index("<h2>scaling law"):page.index("<h2>wall-time crossovers")]
    assert f"<td>{fit['r_squared']:.4f}</td>" in law and "no caveats" in law and "not enough data" not in law
    assert fit["valid"] and fit["caveats"] == [] and fit["alpha_inf_low"] <= fit["alpha_inf"] <= fit["alpha_inf_high"]
    assert abs(fit["alpha_inf"] - ALPHA_INF) < 0.05
    assert "wall-time crossovers" in page and "32 → 64" in page and "counted once both curves" in page
    for plot in ("loss_step", "loss_time"):
        assert f'src="/plot/{plot}.png?smoothing=0.9"' in page
    for plot in ("alpha", "law"):
        assert f'src="/plot/{plot}.png"' in page
    assert "assigned L × batch" in page and all(f"<td>{length} × 4</td>" in page for length in LENGTHS)
    assert "fixed: L per worker" in page
    workers = json.loads(get(swarm.base + "api/status")[2])["workers"]
    assert {(w["assignment"]["seq_len"], w["assignment"]["batch_size"]) for w in workers} == {(n, 4) for n in LENGTHS}


def test_plots_are_nonblank_pngs(swarm: Any) -> None:
    for plot in ("loss_step", "loss_time", "alpha", "law"):
        status, content_type, body = get(swarm.base + f"plot/{plot}.png")
        assert status == 200 and content_type == "image/png"
        assert_png_not_blank(body)
    # The TensorBoard smoothing weight is one of the page's choices: 0 draws the raw curve alone.
    raw = get(swarm.base + "plot/loss_time.png?smoothing=0")[2]
    assert_png_not_blank(raw) is not None and raw != get(swarm.base + "plot/loss_time.png?smoothing=0.99")[2]
    for bad in ("0.5", "1", "abc"):
        status, _, body = get(swarm.base + f"plot/loss_time.png?smoothing={bad}")
        assert status == 400 and b"expected one of 0, 0.6, 0.8, 0.9, 0.95, 0.99" in body
    page = get(swarm.base + "?smoothing=0.99")[2].decode()
    assert 'src="/plot/loss_step.png?smoothing=0.99"' in page and "<b>0.99</b>" in page


def test_too_few_lengths_says_so(start_coordinator: Any) -> None:
    local = start_coordinator(feed_spec((32, 64)), http_port=0)
    feed(local.service, (32, 64))
    base = local.running.dashboard.url
    page = get(base)[2].decode()
    assert "not enough lengths for a fit" in page and "α∞ =" not in page
    # One line says what a fit needs; no empty α panel, no crossover table; the loss plots stay.
    assert page.count("not enough lengths for a fit") == 1 and "[sweep] seq_lens" in page
    assert 'src="/plot/alpha.png"' not in page and "crossovers" not in page
    assert 'src="/plot/loss_step.png?' in page and 'src="/plot/loss_time.png?' in page
    data = json.loads(get(base + "api/status")[2])
    assert data["fits"]["fit"] is None and "not enough lengths" in data["fits"]["message"]
    assert_png_not_blank(get(base + "plot/alpha.png")[2])
    assert_png_not_blank(get(base + "plot/loss_step.png")[2])


def test_api_status_and_metrics(swarm: Any) -> None:
    data = json.loads(get(swarm.base + "api/status")[2])
    assert data["run_id"] == swarm.service.run_id and data["version"] == 0 and data["run_state"] == "running"
    assert data["total_tokens"] == sum(4 * length * len(STEPS) for length in LENGTHS)
    by_name = {w["name"]: w for w in data["workers"]}
    assert set(by_name) == {f"gpu-{length}" for length in LENGTHS}
    w = by_name["gpu-64"]
    assert w["state"] == "active" and w["seq_len"] == 64 and w["last_step"] == STEPS[-1]
    assert w["tokens"] == 4 * 64 * len(STEPS) and w["bytes_received"] == 2000 * STEPS[-1]
    assert w["tokens_per_second"] == pytest.approx(4 * 64 * len(STEPS) / ((STEPS[-1] - STEPS[0]) * 64 / 1000.0))
    assert w["loss"] == pytest.approx(true_loss(STEPS[-1], 64))
    assert data["rounds"][-1]["open"] is True and data["rounds"][-1]["version"] == 0
    assert [c["length_short"] for c in data["fits"]["fit"]["crossovers"]] == list(LENGTHS[:-1])

    first = json.loads(get(swarm.base + "api/metrics?since=0&limit=100")[2])
    assert first["count"] == 100 and first["more"] is True
    assert first["rows"][0]["rowid"] == 1 and first["next_since"] == 100
    assert {"worker_id", "step", "seq_len", "loss", "wall_time", "bytes_sent"} <= set(first["rows"][0])
    rest = json.loads(get(swarm.base + f"api/metrics?since={first['next_since']}&limit=10000")[2])
    assert rest["count"] == len(LENGTHS) * len(STEPS) - 100 and rest["more"] is False
    assert rest["rows"][0]["rowid"] == 101
    empty = json.loads(get(swarm.base + f"api/metrics?since={rest['next_since']}")[2])
    assert empty["count"] == 0 and empty["next_since"] == rest["next_since"]


def test_prometheus_metrics(swarm: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    status, content_type, body = get(swarm.base + "metrics")
    assert status == 200 and content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    expected = {
        "rcswarm_version", "rcswarm_workers_active", "rcswarm_workers", "rcswarm_loss", "rcswarm_tokens",
        "rcswarm_tokens_per_second", "rcswarm_worker_loss", "rcswarm_worker_tokens", "rcswarm_worker_bytes_sent",
        "rcswarm_worker_bytes_received", "rcswarm_worker_seconds_since_heartbeat", "rcswarm_worker_tokens_per_second",
        "rcswarm_rounds_closed", "rcswarm_round_duration_seconds", "rcswarm_fit_alpha_inf",
    }
    assert expected <= set(families), expected - set(families)
    run = swarm.service.run_id

    def samples(name: str) -> list[Any]:
        return families[name].samples

    assert [(s.labels, s.value) for s in samples("rcswarm_version")] == [({"run_id": run}, 0.0)]
    assert samples("rcswarm_workers_active")[0].value == len(LENGTHS)
    assert families["rcswarm_tokens"].type == "counter"
    assert samples("rcswarm_tokens")[0].name == "rcswarm_tokens_total"
    assert samples("rcswarm_tokens")[0].value == sum(4 * length * len(STEPS) for length in LENGTHS)
    losses = {s.labels["name"]: s for s in samples("rcswarm_worker_loss")}
    assert set(losses) == {f"gpu-{length}" for length in LENGTHS}
    sample = losses["gpu-128"]
    assert sample.labels == {"run_id": run, "worker_id": swarm.workers[128], "name": "gpu-128"}
    assert sample.value == pytest.approx(true_loss(STEPS[-1], 128))
    sent = {s.labels["worker_id"]: s.value for s in samples("rcswarm_worker_bytes_sent")}
    assert sent[swarm.workers[32]] == 1000 * STEPS[-1]
    assert families["rcswarm_round_duration_seconds"].type == "histogram"
    assert abs(samples("rcswarm_fit_alpha_inf")[0].value - ALPHA_INF) < 0.05


NOT_FOUND = ["nope", "plot/other.png", "api", "api/status/x", "plot/alpha.svg", "metrics/x", "plot/.png"]
BAD_QUERIES = [
    ("api/metrics?since=abc", "since='abc': expected an integer"),
    ("api/metrics?since=-1", "since=-1"),
    ("api/metrics?limit=0", "limit=0"),
    ("api/metrics?limit=1000000", "limit=1000000"),
    ("api/metrics?since=1&since=2", "given 2 times"),
    ("api/metrics?colour=red", "unknown query parameter"),
    ("api/status?x=1", "unknown query parameter"),
    ("plot/alpha.png?v=x", "expected an integer"),
    ("api/metrics?since", "malformed query string"),
    ("api/metrics?since=", "since='': expected an integer"),
    ("api/metrics?limit=%D9%A3", "expected an integer in ASCII digits"),  # an Arabic-Indic 3, which int() takes
]


def test_unknown_paths_are_404_and_bad_queries_400(swarm: Any) -> None:
    for path in NOT_FOUND:
        status, content_type, body = get(swarm.base + path)
        assert (status, content_type) == (404, "application/json"), path
        assert "error" in json.loads(body)
    for query, words in BAD_QUERIES:
        status, _, body = get(swarm.base + query)
        assert status == 400, query
        assert words in json.loads(body)["error"], (query, body)


def test_post_is_refused(swarm: Any) -> None:
    request = urllib.request.Request(swarm.base + "api/status", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=10)
    assert error.value.code == 405


def test_dashboard_is_off_by_default(start_coordinator: Any) -> None:
    local = start_coordinator(tiny_spec())
    assert local.running.dashboard is None


def test_status_cli_prints_workers_and_fit(swarm: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = status_cli.main(["--coordinator", swarm.target, "--token", TOKEN, "--state-dir", str(swarm.state_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert swarm.service.run_id in out
    for length in LENGTHS:
        assert f"gpu-{length}" in out
    assert "active" in out and "α∞" in out and "32 → 64" in out


def test_status_cli_token_from_env_and_errors(swarm: Any, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RCSWARM_TOKEN", TOKEN)
    assert status_cli.main(["--coordinator", swarm.target, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == swarm.service.run_id
    assert status_cli.main(["--coordinator", swarm.target, "--token", "wrong"]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    monkeypatch.delenv("RCSWARM_TOKEN")
    assert status_cli.main(["--coordinator", swarm.target]) == 2
    assert "token is required" in capsys.readouterr().err


def test_rcswarm_status_is_a_command() -> None:
    from rcswarm.cli import main as cli

    assert cli.COMMANDS["status"][0] == "rcswarm.cli.status"


def test_dashboard_binds_ipv6_loopback(start_coordinator: Any) -> None:
    import socket

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    try:
        local = start_coordinator(tiny_spec(), http_port=0, http_host="::1")
    except RuntimeError as error:
        pytest.skip(f"cannot bind ::1 here: {error}")
    assert local.running.dashboard.url.startswith("http://[::1]:")
    assert get(local.running.dashboard.url + "healthz")[0] == 200


def test_concurrent_requests_and_idle_connections_time_out(swarm: Any) -> None:
    import socket
    import time
    from concurrent.futures import ThreadPoolExecutor

    from rcswarm.observe.dashboard import Dashboard

    paths = ["", "api/status", "metrics", "plot/loss_step.png", "plot/loss_time.png", "plot/alpha.png"] * 3
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda p: get(swarm.base + p)[0], paths))
    assert statuses == [200] * len(paths)

    short = Dashboard(swarm.service, request_timeout_s=0.5).start()
    try:
        with socket.create_connection(("127.0.0.1", short.port), timeout=10) as idle:
            started = time.monotonic()
            assert idle.recv(1024) == b""  # the server gave up on a client that sent nothing
            assert time.monotonic() - started < 5
        assert get(short.url + "healthz")[0] == 200
    finally:
        short.stop()


def _closed_within(connection: Any, seconds: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closes `connection` (None if it is open after `seconds`), sending `trickle` a byte
    every 0.2 s meanwhile: a client that never lets a read time out."""
    import select

    started = time.monotonic()
    for index in itertools.count():
        if index < len(trickle):
            try:
                connection.sendall(trickle[index:index + 1])
            except OSError:
                return time.monotonic() - started
        readable, _, _ = select.select([connection], [], [], 0.2)
        if readable:
            try:
                if connection.recv(4096) == b"":
                    return time.monotonic() - started
            except OSError:
                return time.monotonic() - started
        if time.monotonic() - started > seconds:
            return None
    return None


def test_a_trickling_client_meets_its_deadline_and_connections_are_capped(swarm: Any) -> None:
    """Slow clients (one header byte now and then: every read comes in under the socket timeout) are closed at the
    connection's deadline, and connections past the cap are closed at once: neither holds the coordinator's
    threads or file descriptors, and the dashboard answers again once they are gone."""
    import socket

    from rcswarm.observe.dashboard import Dashboard

    short = Dashboard(swarm.service, request_timeout_s=5.0, request_deadline_s=1.5, max_connections=3).start()
    try:
        with socket.create_connection(("127.0.0.1", short.port), timeout=10) as slow:
            took = _closed_within(slow, 8.0, b"GET /api/status HTTP/1.0\r\nX-Slow: " + b"a" * 100)
        assert took is not None and 1.3 < took < 4.0, took
        places = short.server._slots  # the server's BoundedSemaphore of connections
        wait_for(lambda: places._value == 3, 10, "the slow connection's place given back")
        held = [socket.create_connection(("127.0.0.1", short.port), timeout=10) for _ in range(3)]
        try:
            wait_for(lambda: places._value == 0, 10, "the 3 connections accepted, holding every place")
            with socket.create_connection(("127.0.0.1", short.port), timeout=10) as extra:
                took = _closed_within(extra, 1.0)
            assert took is not None and took < 1.0, took
        finally:
            for connection in held:
                connection.close()
        time.sleep(0.3)
        assert get(short.url + "healthz")[0] == 200
    finally:
        short.stop()


def test_a_loopback_dashboard_answers_loopback_host_names_only(swarm: Any, caplog: pytest.LogCaptureFixture) -> None:
    """DNS rebinding: a page of another site whose name now points at 127.0.0.1 sends its own Host; refused (421)
    before anything is read, and the path, the client's bytes, is logged escaped."""
    import http.client
    import logging
    import socket

    port = int(swarm.base.rstrip("/").rsplit(":", 1)[1])

    def status_for(host: str | None) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.putrequest("GET", "/api/status", skip_host=True)
            if host is not None:
                connection.putheader("Host", host)
            connection.endheaders()
            return connection.getresponse().status
        finally:
            connection.close()

    # The first refusal is logged (the later ones within LOG_EVERY_S are left out of the log).
    with caplog.at_level(logging.INFO, logger="rcswarm.dashboard"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(b"GET /x\x1b[2Jcleared HTTP/1.0\r\nHost: attacker.example\r\n\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.0 421")
    lines = [record.getMessage() for record in caplog.records if "attacker.example" in record.getMessage()]
    assert lines and all("\x1b" not in line and "\\x1b" in line for line in lines), lines
    for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", None):
        assert status_for(host) == 200, host
    for host in (f"attacker.example:{port}", "attacker.example", f"10.0.0.1:{port}"):
        assert status_for(host) == 421, host


def test_fit_report_explains_missing_fits() -> None:
    from rcswarm.observe.analysis import fit_step_means

    disjoint = [(length, step + offset, true_loss(step, length), step * length / 1000.0)
                for offset, length in ((0, 32), (100, 64), (200, 128)) for step in range(1, 20)]
    report = fit_step_means(disjoint)
    assert report.analysis is None and report.message.startswith("no fit: common step range")
    single = [(32, 5, 1.0, 1.0)] + [(length, step, 1.0, float(step)) for length in (64, 128) for step in (1, 2, 3)]
    report = fit_step_means(single)
    assert report.analysis is None and "L=32 has fewer than 2 steps" in report.message
    assert [c.length for c in report.curves] == [64, 128]
    frozen = [(length, step, true_loss(step, length), 10.0 - 0.1 * step if length == 32 else step * 0.1)
              for length in (32, 64, 128) for step in range(1, 30)]
    report = fit_step_means(frozen)
    assert report.analysis is None and "wall time does not increase" in report.message


def test_sweep_api_lists_every_run_with_its_length_and_metrics(sweep: Any) -> None:
    status, content_type, body = get(sweep.base + "api/status")
    assert status == 200 and content_type == "application/json"
    data = json.loads(body)
    assert data["kind"] == "sweep" and data["run_id"] == "test" and data["run_state"] == "running"
    runs = data["runs"]
    assert [r["seq_len"] for r in runs] == list(LENGTHS)
    assert [r["run_id"] for r in runs] == [run.run_id for run in sweep.coordinator.runs]
    for run in runs:
        length = run["seq_len"]
        assert run["batch_size"] == 4 and run["version"] == 0 and run["active_workers"] == 1
        assert run["workers"] == [{"worker_id": sweep.workers[length], "name": sweep.names[length]}]
        assert run["total_tokens"] == 4 * length * len(STEPS)
        assert run["latest_loss"] == pytest.approx(true_loss(STEPS[-1], length))
        metrics = run["metrics"]
        assert metrics["steps"] == len(STEPS) and metrics["last_step"] == STEPS[-1] and metrics["seq_lens"] == [length]
        assert metrics["last_loss"] == pytest.approx(true_loss(STEPS[-1], length))
        assert metrics["seconds"] == pytest.approx((STEPS[-1] - STEPS[0]) * length / 1000.0)
    by_worker = {w["worker_id"]: w for w in data["workers"]}
    for run in runs:
        w = by_worker[sweep.workers[run["seq_len"]]]
        assert (w["run_id"], w["run_seq_len"], w["state"], w["seq_len"]) == (run["run_id"], run["seq_len"], "active",
                                                                          run["seq_len"])
    assert {r["run_id"] for r in data["rounds"]} == {r["run_id"] for r in runs}
    fit = data["fits"]["fit"]
    assert data["fits"]["lengths"] == list(LENGTHS)
    assert abs(fit["alpha_inf"] - ALPHA_INF) < 0.05
    assert [c["length_short"] for c in fit["crossovers"]] == list(LENGTHS[:-1])
    assert all(c["predicted_s"] is not None for c in fit["crossovers"])


def test_sweep_metrics_rows_are_per_run(sweep: Any) -> None:
    run = sweep.coordinator.runs[1]
    page = json.loads(get(sweep.base + f"api/metrics?run={run.run_id}&since=0&limit=10000")[2])
    assert page["count"] == len(STEPS) and page["more"] is False
    assert {(r["run_id"], r["seq_len"]) for r in page["rows"]} == {(run.run_id, LENGTHS[1])}
    status, _, body = get(sweep.base + "api/metrics?since=0")
    assert status == 400 and "add run=" in json.loads(body)["error"]
    status, _, body = get(sweep.base + "api/metrics?run=nope")
    assert status == 400 and "run='nope': no such run" in json.loads(body)["error"]


def test_sweep_prometheus_metrics_carry_every_run(sweep: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    status, content_type, body = get(sweep.base + "metrics")
    assert status == 200 and content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    run_of = {run.spec.data.seq_len: run.run_id for run in sweep.coordinator.runs}
    lengths = {s.labels["run_id"]: s.value for s in families["rcswarm_run_seq_len"].samples}
    assert lengths == {run_id: float(length) for length, run_id in run_of.items()}
    versions = {s.labels["run_id"]: s.value for s in families["rcswarm_version"].samples}
    assert versions == {run_id: 0.0 for run_id in run_of.values()}
    tokens = {s.labels["run_id"]: s.value for s in families["rcswarm_tokens"].samples}
    assert tokens == {run_of[length]: 4 * length * len(STEPS) for length in LENGTHS}
    losses = {(s.labels["run_id"], s.labels["worker_id"], s.labels["name"]): s.value
              for s in families["rcswarm_worker_loss"].samples}
    assert set(losses) == {(run_of[length], sweep.workers[length], sweep.names[length]) for length in LENGTHS}
    for length in LENGTHS:
        assert losses[run_of[length], sweep.workers[length], sweep.names[length]] == pytest.approx(true_loss(STEPS[-1], length))
    active = {s.labels["run_id"]: s.value for s in families["rcswarm_workers_active"].samples}
    assert active == {run_id: 1.0 for run_id in run_of.values()}
    histograms = {s.labels["run_id"] for s in families["rcswarm_round_duration_seconds"].samples}
    assert histograms == set(run_of.values())
    [alpha] = families["rcswarm_fit_alpha_inf"].samples
    assert alpha.labels == {"run_id": "test"} and abs(alpha.value - ALPHA_INF) < 0.05


def test_sweep_page_shows_runs_workers_fit_and_plots(sweep: Any) -> None:
    status, content_type, body = get(sweep.base)
    assert status == 200 and content_type.startswith("text/html")
    page = body.decode()
    assert "rcswarm sweep test" in page
    for run in sweep.coordinator.runs:
        assert f"<td>{run.run_id}</td><td>{run.spec.data.seq_len}</td><td>4</td>" in page
    for length in LENGTHS:
        assert sweep.names[length] in page and sweep.workers[length] in page
    fit = json.loads(get(sweep.base + "api/status")[2])["fits"]["fit"]
    assert f"<td>{fit['alpha_inf']:.4f} [" in page and fit["valid"]
    assert "32 → 64" in page and "predicted (Eq. 11)" in page
    # A sweep's runs each have their own version: the overview names them all, not one number.
    assert "versions</td><td>L=32: 0, L=64: 0, L=128: 0, L=256: 0 of 3</td>" in page
    for plot in PLOTS:
        assert f'src="/plot/{plot}.png' in page
        status, content_type, png = get(sweep.base + f"plot/{plot}.png")
        assert (status, content_type) == (200, "image/png")
        assert_png_not_blank(png)


def test_sweep_page_without_metrics_explains_the_missing_fit(tmp_path: Path) -> None:
    from rcswarm.coordinator.server import RunningCoordinator
    from rcswarm.coordinator.sweep import SweepCoordinator

    base = tiny_spec()
    spec = base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [8, 16]}})
    running = RunningCoordinator(SweepCoordinator(spec, tmp_path / "state"), TOKEN, http_port=0).start()
    try:
        url = running.dashboard.url
        page = get(url)[2].decode()
        assert "not enough lengths for a fit" in page and "no workers have joined" in page
        data = json.loads(get(url + "api/status")[2])
        assert [(r["seq_len"], r["metrics"]["steps"], r["workers"]) for r in data["runs"]] == [(8, 0, []), (16, 0, [])]
        assert_png_not_blank(get(url + "plot/loss_step.png")[2])
    finally:
        running.stop(grace=0.5)


def test_status_cli_prints_the_sweep_fit_from_its_state_dir(sweep: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = status_cli.main(["--coordinator", sweep.target, "--token", TOKEN, "--state-dir", str(sweep.state_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "runs of the sweep" in out and "α∞" in out and "32 → 64" in out and "0.30" in out
    for run in sweep.coordinator.runs:
        assert run.run_id in out
    code = status_cli.main(["--coordinator", sweep.target, "--token", TOKEN,
                            "--state-dir", str(sweep.state_dir / sweep.coordinator.runs[0].store.state_dir.name)])
    assert code == 2
    assert "no state dir below it holds run(s)" in capsys.readouterr().err


def test_run_step_means_count_the_runs_steps_on_the_coordinators_clock(tmp_path: Path) -> None:
    from rcswarm.observe.analysis import run_step_means
    from rcswarm.state.store import StateStore

    store = StateStore(tmp_path / "state")
    try:
        # A worker that moved here from another run: its own step counter is at 500, its own clock at 900 s.
        rows = [("run", "w", 2, 499, 16, 2, math.nan, 0, 899.0, 0.0, 0.0, 0, 0, "digest", 95.0)]
        for version in (2, 3):
            for k in range(4):
                own = 500 + 4 * (version - 2) + k
                rows.append(("run", "w", version, own, 16, 2, 1.0 / own, 32, 900.0 + own, 0.0, 0.0, 0, 0, "",
                             100.0 + 10 * version + k))
        store.add_metrics(rows)
        means = run_step_means(store, 4)
    finally:
        store.close()
    assert [step for _, step, _, _ in means] == list(range(9, 17))
    assert [t for _, _, _, t in means] == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]
    assert {length for length, _, _, _ in means} == {16} and means[0][2] == pytest.approx(1.0 / 500)
    with pytest.raises(ValueError, match="inner_steps=0"):
        run_step_means(store, 0)


def test_a_fit_from_a_handful_of_steps_shows_not_enough_data(report_over_time: Any) -> None:
    """30 steps per length: the data rule leaves α∞ and τ unidentified, so the page, the JSON and /metrics
    say so, and no predicted crossover is shown."""
    from prometheus_client.parser import text_string_to_metric_families

    base = report_over_time((32, 64, 128), range(1, 31)).base
    fit = json.loads(get(base + "api/status")[2])["fits"]["fit"]
    assert not fit["valid"] and not fit["alpha_inf_identified"] and not fit["tau_identified"]
    assert fit["caveats"][0].startswith("too few recorded steps in the steps all lengths share [1, 30]")
    page = get(base)[2].decode()
    assert f"<td>not enough data (fitted {fit['alpha_inf']:.4f} [" in page
    assert "<li>too few recorded steps" in page and "The data identify the fit" not in page
    assert "not enough data (the fit has caveats)" in page
    families = {f.name: f for f in text_string_to_metric_families(get(base + "metrics")[2].decode())}
    assert [sample.value for sample in families["rcswarm_fit_valid"].samples] == [0.0]
    assert_png_not_blank(get(base + "plot/alpha.png")[2])


def test_a_sweep_with_idle_lengths_names_them_instead_of_asking_for_a_sweep(tmp_path: Path) -> None:
    from rcswarm.config.runspec import RunSpec
    from rcswarm.coordinator.server import RunningCoordinator
    from rcswarm.coordinator.sweep import SweepCoordinator
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from rcswarm.worker.client import CoordinatorClient, RetryPolicy

    base = tiny_spec()
    spec = base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [8, 16, 32]}})
    running = RunningCoordinator(SweepCoordinator(spec, tmp_path / "state"), TOKEN, http_port=0).start()
    client = CoordinatorClient(f"127.0.0.1:{running.port}", TOKEN, retry=RetryPolicy(max_elapsed_s=5.0))
    try:
        joined = client.join("only", "cpu", 1)
        length = RunSpec.from_json(joined.run_spec_json).data.seq_len
        client.report_metrics(joined, [pb.Metric(version=0, step=step, seq_len=length, batch=4,
                                                 loss=true_loss(step, length), tokens=4 * length, wall_time=step)
                                       for step in range(1, 20)], joined.run_id)
        page = get(running.dashboard.url)[2].decode()
        idle = ", ".join(str(x) for x in (8, 16, 32) if x != length)
        assert f"not enough data yet: the sweep&#x27;s L = {idle} have fewer than 2 steps of metrics" in page
        assert "train a sweep" not in page and "[sweep] seq_lens" not in page
    finally:
        client.close()
        running.stop(grace=0.5)


def test_workers_waiting_for_a_place_are_counted_on_every_surface(start_coordinator: Any,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Spares refused a place show in GetStatus, the page, /metrics and `rcswarm status`; one that joins or stops
    asking (three of its ask-again intervals) drops out of the count."""
    import grpc
    from prometheus_client.parser import text_string_to_metric_families

    from rcswarm.protos.v1 import coordinator_pb2 as pb

    local = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"max_workers": 1, "lease_s": 3.0}), http_port=0)
    base = f"http://127.0.0.1:{local.running.dashboard.port}/"
    client = local.client()
    seat = client.join("holder", "cpu", 1)
    for name in ("spare-a", "spare-b", "spare-a"):
        with pytest.raises(grpc.RpcError):
            client.stub.Join(pb.JoinRequest(worker_name=name, device="cpu", pid=2), timeout=5.0,
                             metadata=client.metadata)
    assert client.status().waiting_for_place == 2
    assert "<td>waiting for a place</td><td>2</td>" in get(base)[2].decode()
    families = {f.name: f for f in text_string_to_metric_families(get(base + "metrics")[2].decode())}
    (sample,) = families["rcswarm_workers_waiting_for_place"].samples
    assert sample.value == 2 and sample.labels == {"run_id": local.running.coordinator.run_id}
    assert status_cli.main(["--coordinator", local.target, "--token", TOKEN]) == 0
    assert "waiting for a place" in capsys.readouterr().out
    # spare-a takes the place once the holder has left; spare-b, which stopped asking, is forgotten after 3 s.
    client.leave(seat, "the test frees the place")
    client.stub.Join(pb.JoinRequest(worker_name="spare-a", device="cpu", pid=2), timeout=5.0, metadata=client.metadata)
    assert client.status().waiting_for_place == 1
    forgotten_by = time.monotonic() + 10
    while client.status().waiting_for_place and time.monotonic() < forgotten_by:
        time.sleep(0.2)
    assert client.status().waiting_for_place == 0
    client.close()
