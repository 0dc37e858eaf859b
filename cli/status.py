"""`rcswarm status`: a coordinator's run, workers and rounds in the terminal, from GetStatus.

    rcswarm status --coordinator HOST:PORT [--token T | $RCSWARM_TOKEN] [--tls-ca CA.pem [--tls-cert C --tls-key K]]
                   [--timeout 10] [--state-dir DIR] [--json]
    rcswarm status --state-dir DIR [--stale-s 60] [--json]       a hivemind swarm that `rcswarm dht` mirrors

The RPC carries the `authorization: Bearer <token>` metadata and a deadline. GetStatus holds
no metrics, so the scaling-law fit (α∞, τ, crossovers) is printed when `--state-dir` names
the coordinator's state directory on this machine: every run GetStatus names (one, or a
sweep's runs in the state dirs below it) is read through its store, opened read-only, and
fitted as its dashboard fits it, and shown in the rows `rcswarm fit` prints (observe/analysis.py
`fit_rows`, `crossover_rows`): "not enough data" and the caveats in place of a number the data do
not identify, and no predicted crossover from such a fit.
Without `--coordinator`, `--state-dir` names a state dir `rcswarm dht --config RUN.toml --state-dir DIR`
mirrors a hivemind swarm into: the same tables come from the store, read-only
(observe/mirror_view.py `mirrored_status`: the swarm's version of the run's rounds, each peer a
worker, active while its records advanced within `--stale-s`, else stale), with the fit as above.
Every string GetStatus or the store carries (worker names and devices, run ids, reasons, notes) comes from a
peer: it is printed as text, never read as rich markup (`rich.markup.escape`), so a worker named "[/]" or
"[link=...]" shows as that.
Exit codes: 0 ok, 1 the coordinator refused or could not be reached, 2 bad arguments (or no mirrored state).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rcswarm.cli.client_flags import add_client_flags, client_options, client_token
from rcswarm.cli.usage import new_parser, parse_or_status, usage_error
from rcswarm.config.runspec import RunSpec
from rcswarm.observe import traffic
from rcswarm.observe.analysis import (
    CROSSOVER_RULE,
    NOT_ENOUGH_DATA,
    FitReport,
    StepMean,
    WorkerTotals,
    crossover_rows,
    fit_rows,
    fit_step_means,
    fit_summary,
    step_means,
    worker_totals,
)
from rcswarm.observe.dashboard.views import message_data
from rcswarm.observe.forecast import describe
from rcswarm.protos.transport import ClientTLS, not_grpc_problem, open_channel
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS
from rcswarm.state.errors import StoreError
from rcswarm.worker.client import TLS_PROBE_S, tls_settings_problem

# Columns of the tables when the output is not a terminal (a terminal's own width applies there).
REPORT_WIDTH = 100
STATES = {number: name.removeprefix("WORKER_STATE_").lower() for name, number in pb.WorkerState.items()}
RUN_STATES = {number: name.removeprefix("RUN_STATE_").lower() for name, number in pb.RunState.items()}


def fetch_status(target: str, token: str, tls: ClientTLS | None, timeout_s: float) -> pb.GetStatusResponse:
    with open_channel(target, tls, list(MESSAGE_SIZE_OPTIONS)) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        return stub.GetStatus(pb.GetStatusRequest(), timeout=timeout_s,
                              metadata=(("authorization", f"Bearer {token}"),))


def _num(value: float, spec: str = ".4g") -> str:
    return "–" if not math.isfinite(value) else format(value, spec)


def held_out_cell(loss: float, version: int) -> str:
    """A run's newest held-out loss measured along the way (issue #30) and the version it was of."""
    return f"{loss:.4g} (θ_{version})"


def forecast_cell(forecast: pb.ForecastStatus) -> str:
    """A run's newest forecast (issue #30) in words, with what it was fitted to when that is the held-out loss."""
    prefix = "held-out: " if forecast.basis == "held-out" and not forecast.note else ""
    return prefix + escape(describe(forecast.loss, forecast.low, forecast.high, forecast.at_round, forecast.note,
                             forecast.stopped, forecast.target_loss, forecast.target_seconds))


def _run_labels(status: pb.GetStatusResponse) -> dict[str, str]:
    """A sweep's run ids by their short label, "L=<seq_len>" (the lengths tell a sweep's runs apart); {} for one run.
    (The labels are numbers: no markup to escape.)"""
    return {r.run_id: f"L={r.seq_len}" for r in status.runs}


def report(status: pb.GetStatusResponse, console: Console, fits: FitReport | None = None,
           totals: dict[str, WorkerTotals] | None = None) -> None:
    """The status as tables that fit the console's width (100 columns when not a terminal): the run (or the
    sweep, with one row per run), its workers, what happened to their updates, its recent rounds, the fit."""
    labels = _run_labels(status)
    run = Table(title=f"{'sweep' if status.runs else 'run'} {escape(status.run_id)}")
    run.add_column("field")
    run.add_column("value", justify="right")
    active = sum(1 for w in status.workers if w.state == pb.WORKER_STATE_ACTIVE)
    run.add_row("state", RUN_STATES.get(status.run_state, "unknown"))
    if status.runs:
        versions = (f"{labels[r.run_id]}: {r.version} / {r.target_rounds or '∞'}" for r in status.runs)
        run.add_row("versions", ", ".join(versions))
    else:
        run.add_row("version", f"{status.version} / {status.target_rounds or '∞'}")
    run.add_row("workers active", f"{active} of {len(status.workers)}")
    if status.waiting_for_place:
        run.add_row("waiting for a place", str(status.waiting_for_place))
    run.add_row("latest loss", _num(status.latest_loss))
    run.add_row("tokens trained", str(status.total_tokens))
    run.add_row("tokens applied", str(status.applied_tokens))
    if status.pace:
        run.add_row("pace", escape(status.pace))
    run.add_row("tokens/s", _num(status.tokens_per_second))
    if status.fp32_bytes:
        run.add_row("traffic per worker per round", traffic.describe(
            status.fp32_bytes, status.bytes_up_per_round, status.bytes_down_per_round))
    if status.param_sha256:
        run.add_row("θ sha256", escape(status.param_sha256[:16]) + "…")
    if status.HasField("curriculum"):
        _curriculum_rows(run, status.curriculum)
    if status.val_loss > 0:
        run.add_row("held-out loss (along the way)", held_out_cell(status.val_loss, status.val_version))
    if status.HasField("forecast"):
        run.add_row(f"forecast of the final {status.forecast.basis or 'training'} loss (90%)",
                    forecast_cell(status.forecast))
    console.print(run)

    if status.runs:
        sweep = Table(title="runs of the sweep")
        for name in ("run", "L × batch", "state", "version", "active workers", "refused by", "loss", "held-out",
                     "tokens", "tokens/s", "forecast (90%)"):
            sweep.add_column(name, justify="left" if name in ("run", "state", "forecast (90%)") else "right",
                             no_wrap=name == "run")
        for r in status.runs:
            sweep.add_row(escape(r.run_id), f"{r.seq_len} × {r.batch_size}", RUN_STATES.get(r.run_state, "unknown"),
                          f"{r.version} / {r.target_rounds or '∞'}", str(r.active_workers),
                          str(r.refused_by) if r.refused_by else "–", _num(r.latest_loss),
                          held_out_cell(r.val_loss, r.val_version) if r.val_loss > 0 else "–", str(r.total_tokens),
                          _num(r.tokens_per_second),
                          forecast_cell(r.forecast) if r.HasField("forecast") else "–")
        console.print(sweep)
        for r in status.runs:  # a run its workers cannot train waits for one that can: said, with why
            if r.refused_by:
                console.print(f"{escape(labels[r.run_id])}: refused by {r.refused_by} worker"
                              f"{'s' if r.refused_by != 1 else ''}, the last: "
                              f"{escape(r.last_refusal)}")
    _workers(status, console, labels, totals)
    _rounds(status, console, labels)
    newest = next((r for r in reversed(status.rounds) if r.closed_at > 0 and r.aggregation), None)
    if newest is not None:
        console.print(f"aggregation of round {newest.version}: {escape(newest.aggregation)}")

    if fits is None:
        return
    if fits.analysis is None:
        console.print(f"fit: {escape(fits.message)}")
        return
    # The rows `rcswarm fit` prints (observe/analysis.py `fit_rows`, `crossover_rows`): where a caveat leaves a
    # number unidentified, "not enough data" stands in its place, and no crossover is predicted from such a fit.
    summary = fit_summary(fits.analysis)
    fit = Table(title="loss(L | s) ≈ A(s)·L^(−α(s)),  α(s) = α∞·(1 − e^(−s/τ))")
    fit.add_column("quantity")
    fit.add_column("value", justify="right")
    fit.add_row("lengths", ", ".join(f"{c.length:g}" for c in fits.curves))
    for quantity, value in fit_rows(summary):
        fit.add_row(quantity, escape(value))
    console.print(fit)
    for caveat in fits.analysis.caveats:
        console.print(f"{NOT_ENOUGH_DATA}: {escape(str(caveat))}", style="bold red")
    cross = Table(title="wall-time crossovers: longer L below shorter L from then on")
    for name in ("L short → long", "observed", "predicted (Eq. 11)"):
        cross.add_column(name, justify="right")
    for row in crossover_rows(summary):
        cross.add_row(*(escape(text) for text in row))
    console.print(cross)
    console.print(f"crossovers: {CROSSOVER_RULE.format(smooth=fits.analysis.smooth)}", style="dim")


def _workers(status: pb.GetStatusResponse, console: Console, labels: dict[str, str],
             totals: dict[str, WorkerTotals] | None) -> None:
    """Two tables that fit 100 columns: the workers (a run column for a sweep), then what each worker's updates
    became, with tokens/s and loss from the store when `totals` is given (every worker; else only those with a
    late, stale, clipped or dropped update or an ended or flagged membership)."""
    workers = Table(title="workers")
    for name in ("worker", *(["run"] if labels else []), "state", "device", "L × B", "base v", "seen (s)",
                 "tokens trained / applied", "s/step\nutil", "last up / down"):
        # A long name folds; an id (r0w12-0123abcd) fits.
        width = {"min_width": 13, "max_width": 24} if name == "worker" else {}
        workers.add_column(name, justify="left" if name in ("worker", "run", "state", "device") else "right",
                           overflow="fold", **width)
    for w in status.workers:
        assigned = f"{w.assignment.seq_len} × {w.assignment.batch_size}" if w.HasField("assignment") else "–"
        workers.add_row(escape(f"{w.name}\n{w.worker_id}"), *([labels.get(w.run_id, "–")] if labels else []),
                        STATES.get(w.state, "unknown"), escape(w.device), assigned, str(w.base_version),
                        f"{w.seconds_since_heartbeat:.1f}", f"{w.trained_tokens} / {w.applied_tokens}",
                        (_num(w.step_seconds) if w.step_seconds else "–") + "\n"
                        + (f"{w.utilization:.0%}" if w.utilization else "–"),
                        f"{traffic.size(w.round_bytes_up)} / {traffic.size(w.round_bytes_down)}")
    if not status.workers:
        workers.caption = "no workers have joined"
    console.print(workers)
    noted = [w for w in status.workers if totals is not None or _worker_reason(w) or w.late_updates
             or w.stale_updates or w.clipped_updates or w.dropped_updates]
    if not noted:
        return
    updates = Table(title="workers' updates and memberships")
    for name in ("worker", *(["tokens/s", "loss"] if totals is not None else []), "late / stale / clipped / dropped",
                 "reason"):
        updates.add_column(name, justify="left" if name in ("worker", "reason") else "right", no_wrap=name == "worker")
    for w in noted:
        measured = []
        if totals is not None:
            t = totals.get(w.worker_id)
            measured = ["–", "–"] if t is None else [_num(t.tokens_per_second), _num(t.last_loss)]
        updates.add_row(escape(w.worker_id), *measured,
                        f"{w.late_updates} / {w.stale_updates} / {w.clipped_updates} / {w.dropped_updates}",
                        escape(_worker_reason(w)))
    console.print(updates)


def _rounds(status: pb.GetStatusResponse, console: Console, labels: dict[str, str]) -> None:
    """The recent rounds (each run's for a sweep, with a run column), newest last."""
    rounds = Table(title="rounds (newest last)")
    for name in (*(["run"] if labels else []), "version", "state", "reports", "tokens", "seconds", "update norm",
                 "clipped / dropped", "close reason"):
        rounds.add_column(name, justify="left" if name in ("run", "close reason") else "right")
    for r in status.rounds:
        closed = r.closed_at > 0
        seconds = f"{r.closed_at - r.opened_at:.3g}" if closed else "–"
        rounds.add_row(*([labels.get(r.run_id, "–")] if labels else []), str(r.version),
                       "closed" if closed else "open", str(r.reports), str(r.tokens), seconds,
                       _num(r.update_norm) if closed else "–", f"{r.clipped if closed else '–'} / {r.dropped}",
                       escape(r.close_reason))
    console.print(rounds)


def _worker_reason(worker: pb.WorkerStatus) -> str:
    """Why the membership ended, and the latest outlier flag with the rounds flagged among the recent ones."""
    flagged = f"flagged in {worker.outlier_rounds} recent rounds; latest {worker.outlier}" if worker.outlier else ""
    return "; ".join(part for part in (worker.reason, flagged) if part)


def _curriculum_rows(table: Table, curriculum: pb.CurriculumStatus) -> None:
    """The run's curriculum: policy, current L and batch, and for the adaptive ladder its state."""
    table.add_row("curriculum", escape(curriculum.policy))
    table.add_row("L × batch", "per worker" if curriculum.seq_len == 0
                  else f"{curriculum.seq_len} × {curriculum.batch_size}")
    if curriculum.ladder:
        table.add_row("ladder (rung)", f"{list(curriculum.ladder)} ({curriculum.rung})")
        measured = ", ".join(f"L={length}: {seconds:.3g}" for length, seconds in sorted(curriculum.seconds_per_step.items()))
        table.add_row("s/step measured", measured or "–")
        table.add_row("budget used", f"{curriculum.elapsed_seconds:.0f} of {curriculum.budget_seconds:.0f} s")
        table.add_row("law", escape(curriculum.law))
    if curriculum.reason:
        table.add_row("last decision", escape(curriculum.reason))


def _stores(state_dir: Path) -> list[Path]:
    """The state dirs at `state_dir`: itself when it holds state.sqlite, and those one level below (a sweep's runs)."""
    return sorted(db.parent for db in [state_dir / "state.sqlite", *state_dir.glob("*/state.sqlite")] if db.is_file())


def read_fits(state_dir: Path, status: pb.GetStatusResponse,
              mirrored: bool = False) -> tuple[FitReport, dict[str, WorkerTotals]]:
    """The fit over the runs GetStatus names and every run's per-worker totals, as the dashboard shows them.

    Each run's state dir (the coordinator's, or one below a sweep's, coordinator/sweep.py
    `run_state_dir`) is the one whose state.sqlite stores its run id; it is opened read-only. `mirrored`: a hivemind
    swarm `rcswarm dht` mirrors, whose curves count its peers' own steps (`views.presentation`).
    """
    from rcswarm.observe.dashboard.views import presentation
    from rcswarm.state.store import StateStore

    wanted = [run.run_id for run in status.runs] or [status.run_id]
    _, clock = presentation(wanted != [status.run_id], mirrored)
    means: list[StepMean] = []
    totals: dict[str, WorkerTotals] = {}
    found: set[str] = set()
    for path in _stores(state_dir):
        store = StateStore.open_read_only(path)
        try:
            identity = store.run_identity()
            if identity is None or identity[0] not in wanted:
                continue
            run_id, spec_json = identity
            means.extend(step_means(store, clock, run_id, RunSpec.from_json(spec_json).inner.steps))
            totals.update(worker_totals(store.worker_rows(run_id)))
            found.add(run_id)
        finally:
            store.close()
    missing = [run_id for run_id in wanted if run_id not in found]
    if missing:
        raise FileNotFoundError(f"{state_dir}: no state dir below it holds run(s) {', '.join(missing)} "
                                "(is --state-dir the coordinator's state directory?)")
    return fit_step_means(means), totals


def parser() -> argparse.ArgumentParser:
    result = new_parser("rcswarm status", "print a coordinator's run, workers, rounds and fits")
    add_client_flags(result, "HOST:PORT of the coordinator's gRPC server (without it: --state-dir of a mirrored swarm)")
    result.add_argument("--timeout", type=float, default=10.0, help="deadline of the call in seconds")
    result.add_argument("--state-dir", type=Path, default=None,
                        help="the coordinator's state directory on this machine: also print the scaling-law fit; "
                             "without --coordinator, the state dir `rcswarm dht` mirrors a hivemind swarm into")
    result.add_argument("--stale-s", type=float, default=None,
                        help="without --coordinator: a peer whose records did not advance for this long (or 3 × its "
                             "last gap, if longer) is stale (default 60)")
    result.add_argument("--json", action="store_true", help="print GetStatus as JSON instead of tables (numbers as numbers, null for a missing one)")
    return result


def mirrored(state_dir: Path, stale_s: float) -> tuple[pb.GetStatusResponse, float]:
    """GetStatus of the swarm mirrored into `state_dir` and the seconds since the mirror's last poll."""
    import time

    from rcswarm.observe.mirror_view import mirrored_status, open_mirror, read_view

    store = open_mirror(state_dir)
    try:
        now = time.time()
        return mirrored_status(store, now, stale_s), now - read_view(store)[2].polled_at
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_or_status(parser(), argv)
    if isinstance(args, int):
        return args
    if args.coordinator is None:
        return main_mirrored(args)
    if args.stale_s is not None:
        return usage_error("rcswarm status", "--stale-s is for a mirrored swarm: give --state-dir without --coordinator")
    try:
        token = client_token(args)
    except ValueError as error:
        return usage_error("rcswarm status", str(error))
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        return usage_error("rcswarm status", f"--timeout {args.timeout}: expected a positive number of seconds")
    try:
        client = client_options(args)
        status = fetch_status(client.coordinator, token, client.tls(), args.timeout)
    except ValueError as error:
        return usage_error("rcswarm status", str(error))
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else str(error)
        name = code.name if code is not None else "ERROR"
        found = not_grpc_problem(args.coordinator, code, details or "") or tls_settings_problem(
            args.coordinator, args.tls_ca, code, details or "", min(TLS_PROBE_S, args.timeout))
        print(f"rcswarm status: {found or f'{args.coordinator}: {name}: {details}'}", file=sys.stderr)
        return 1
    return show(args, status)


def main_mirrored(args: argparse.Namespace) -> int:
    """`rcswarm status --state-dir DIR` without a coordinator: the mirrored swarm, read from its store."""
    from rcswarm.observe.mirror_view import STALE_S

    if args.state_dir is None:
        return usage_error("rcswarm status", "expected --coordinator HOST:PORT, or --state-dir DIR of a hivemind swarm "
                                             "that `rcswarm dht --config RUN.toml --state-dir DIR` mirrors")
    stale_s = STALE_S if args.stale_s is None else args.stale_s
    if not (stale_s > 0 and math.isfinite(stale_s)):
        return usage_error("rcswarm status", f"--stale-s {args.stale_s}: expected a positive number of seconds")
    try:
        status, polled = mirrored(args.state_dir, stale_s)
    except (OSError, StoreError, ValueError) as error:
        return usage_error("rcswarm status", f"--state-dir {args.state_dir}: {error}")
    return show(args, status, f"mirrored by `rcswarm dht` (no coordinator); its last poll {polled:.0f} s ago; "
                              f"a peer is active while its records advanced within {stale_s:g} s")


def show(args: argparse.Namespace, status: pb.GetStatusResponse, note: str = "") -> int:
    """Print `status` as JSON, or as tables with the fit when --state-dir is given."""
    if args.json:
        print(json.dumps(message_data(status), indent=1, allow_nan=False))
        return 0
    fits, totals = None, None
    if args.state_dir is not None:
        try:
            fits, totals = read_fits(args.state_dir, status, mirrored=args.coordinator is None)
        except (OSError, StoreError, ValueError) as error:
            return usage_error("rcswarm status", f"--state-dir {args.state_dir}: {error}")
    # emoji=False: names, devices and run ids come from peers, and ":skull:" in one is text, not an emoji.
    console = Console(emoji=False)
    if not console.is_terminal:
        console = Console(width=REPORT_WIDTH, emoji=False)  # piped or captured: the width tables are laid out for
    report(status, console, fits, totals)
    if note:
        console.print(escape(note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
