"""`rcswarm dht`: a stable bootstrap peer for a hivemind swarm, optionally mirroring it into a state dir.

    rcswarm dht [--host-maddrs /ip4/0.0.0.0/tcp/31337] [--announce-maddrs MADDR ...] [--identity-path F]
                [--initial-peers MADDR ...] [--maddrs-file F] [--config RUN.toml --state-dir DIR [--poll-s 2]
                [--http-port P [--http-host 127.0.0.1] [--http-token-required | --http-insecure | --http-plaintext]
                [--view-token-file F] [--http-trusted-proxy CIDR ...] [--stale-s 60]]]

It runs one DHT node (no averager, no training) with rcswarm's record validator and prints its
multiaddrs, which workers pass as `--initial-peers`; with `--identity-path` the peer id, hence the
multiaddrs, survive restarts. With `--config` and `--state-dir` it polls the run's digest and metric
records (worker/hivemind_sync.py) every `--poll-s` seconds, appends the metric rows it has not seen to
the state dir's SQLite (state/store.py; only the run's members' rows: peers whose digest holds this
RUN.toml's spec digest) and stores the swarm's view (its version, each peer's version, newest row and
when it was last seen; observe/mirror_view.py), so `rcswarm fit DIR`,
`rcswarm status --state-dir DIR` and the dashboard work as with a coordinator. With `--http-port` it
serves the coordinator's dashboard over that state dir, read-only, while it mirrors: loopback by
default; elsewhere the join token ($RCSWARM_TOKEN) is required unless `--http-insecure`
(observe/dashboard/auth.py); it serves plain HTTP only, so off loopback a dashboard that takes the
token is refused unless `--http-plaintext` says a TLS proxy or a tunnel is in front. `--view-token-file F` gives
the dashboard read-only view tokens (one per line, re-read when F changes: coordinator/tokens.py `ViewTokens`),
accepted besides $RCSWARM_TOKEN or without it: a mirror that serves viewers need not hold the join token at all.
`--http-trusted-proxy CIDR` (repeatable) names the reverse proxies in front of the dashboard, as the coordinator's
(observe/dashboard/proxies.py): their X-Forwarded-For says which client a request is from.
SIGTERM or SIGINT stops it (and its p2pd).
"""

from __future__ import annotations

import argparse
import hmac
import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rcswarm.cli.signals import StopSignal
from rcswarm.cli.usage import (
    TRUSTED_PROXY_HELP,
    empty_path_problem,
    new_parser,
    output_file_problem,
    parse_or_status,
    path_arg,
    usage_error,
)
from rcswarm.config.runspec import RunSpec
from rcswarm.protos.transport import host_port
from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.state.lock import StateDirBusy, StateDirLock
from rcswarm.worker.log_lines import log_to_stderr
from rcswarm.worker.options import seconds_problem

log = logging.getLogger("rcswarm.dht")
# Peers whose ignored metrics the mirror names: at most this many a poll (the rest counted in one line), and it
# remembers at most _MAX_IGNORED_LOGGED (peer, reason) pairs (then forgets them all, repeating a line, not growing).
_IGNORED_NAMED_PER_POLL = 8
_MAX_IGNORED_LOGGED = 4096
# The usage error of a command that needs the hivemind extra without it (as `rcswarm launch`'s RAY_EXTRA), and the
# top-level modules whose absence means that extra is missing.
HIVEMIND_EXTRA = "needs the hivemind extra: pip install 'rcswarm[hivemind]'"
HIVEMIND_MODULES = ("hivemind", "multihash")


def parser() -> argparse.ArgumentParser:
    parser = new_parser("rcswarm dht", "Run a bootstrap peer of a hivemind swarm.")
    parser.add_argument("--host-maddrs", nargs="+", default=["/ip4/0.0.0.0/tcp/0"], metavar="MADDR",
                        help="multiaddrs to listen on")
    parser.add_argument("--announce-maddrs", nargs="+", default=[], metavar="MADDR",
                        help="multiaddrs other peers should dial (default: what libp2p observes)")
    parser.add_argument("--initial-peers", nargs="+", default=[], metavar="MADDR", help="other bootstrap peers")
    parser.add_argument("--identity-path", type=Path, help="private key file: a stable peer id (created if missing)")
    parser.add_argument("--maddrs-file", type=Path, help="also write the multiaddrs here, one per line")
    parser.add_argument("--config", type=Path, help="RUN.toml of the run whose metrics --state-dir mirrors")
    parser.add_argument("--state-dir", type=Path, help="mirror the run's metric records and swarm view into this state dir")
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between mirror polls")
    parser.add_argument("--http-port", type=int, default=None,
                        help="serve the dashboard over --state-dir on this port (0 = any free port; default: off)")
    parser.add_argument("--http-host", default="127.0.0.1",
                        help=f"address the dashboard binds (default loopback; elsewhere it requires ${TOKEN_ENV})")
    parser.add_argument("--http-token-required", action="store_true",
                        help=f"require the token (${TOKEN_ENV}) on the dashboard on loopback too")
    parser.add_argument("--http-insecure", action="store_true",
                        help="serve the dashboard on a non-loopback --http-host without the token")
    parser.add_argument("--http-plaintext", action="store_true",
                        help="serve a dashboard that requires the token over plain HTTP on a non-loopback --http-host "
                             "(refused otherwise: rcswarm dht serves no HTTPS): for a TLS proxy or a tunnel in front")
    parser.add_argument("--view-token-file", type=path_arg, default=None, metavar="PATH",
                        help="file of read-only view tokens for the dashboard, one per line (# comments), re-read when "
                             f"it changes: each opens the dashboard and /metrics; with it ${TOKEN_ENV} is not needed "
                             "(still accepted when set), and a token is required on loopback too")
    parser.add_argument("--http-trusted-proxy", action="append", default=[], metavar="CIDR", help=TRUSTED_PROXY_HELP)
    parser.add_argument("--stale-s", type=float, default=None,
                        help="the dashboard lists a peer as stale when its records did not advance for this long "
                             "(or 3 × its last gap, if longer; default 60)")
    return parser


class Mirror:
    """Appends the metric rows of the DHT's records that it has not written yet and stores the swarm's view
    (one thread). A restarted mirror resumes after the newest step its stored view holds per peer. It holds the
    state dir's lock (state/lock.py, role "mirror") while it lives, and takes only a state dir of its own:
    ValueError for a coordinator's (one with checkpoints) or another run's, StateDirBusy for one in use.

    It mirrors the members of the run alone (`members_metrics`): a peer's metrics count once its digest holds this
    run's spec digest, in this poll or an earlier one (a version in the view)."""

    def __init__(self, spec: RunSpec, state_dir: Path) -> None:
        self.lock = StateDirLock.acquire(state_dir, role="mirror")
        try:
            self._open(spec, state_dir)
        except BaseException:
            self.lock.release()
            raise

    def _open(self, spec: RunSpec, state_dir: Path) -> None:
        from rcswarm.observe.mirror_view import VIEW_KEY, SwarmView
        from rcswarm.state.store import StateStore
        from rcswarm.worker.hivemind_worker import spec_digest

        self.spec, self.spec_digest = spec, spec_digest(spec)  # peers of another digest are another swarm
        self.store = StateStore(state_dir)
        problem = _not_a_mirror_dir(self.store, spec)
        if problem:
            self.store.close()
            raise ValueError(f"state dir {state_dir} {problem}; give the mirror a state dir of its own")
        self.run_id = self.store.get("run_id") or spec.run.name
        stored = self.store.get(VIEW_KEY)
        self.view = (SwarmView.from_json(stored, str(self.store.db_path)) if stored is not None
                     else SwarmView(spec.run.name, time.time(), 0))
        self.store.set_many({"run_id": self.run_id, "spec_json": spec.to_json(), VIEW_KEY: self.view.to_json()})
        # Per peer: the newest step written.
        self.seen: dict[str, float] = {p.peer_id: float(p.step) for p in self.view.peers}
        # (peer, why) pairs whose ignored metrics were logged; the peers left out (told once they become members).
        self._ignored_logged: set[tuple[str, str]] = set()
        self._held_back: set[str] = set()

    def rows(self, records: dict[str, dict[str, Any]], now: float) -> list[tuple[Any, ...]]:
        """New METRIC_COLUMNS rows from metric records {peer: {run, name, rows}}.

        A row's `received_at` (the run's clock, which `rcswarm fit DIR` and a sweep's curves use) is when
        the peer trained it on the mirror's clock: `now` less how long before its record's newest row it
        was (the worker's own clock), so the rows of one record do not share one time. A record whose rows
        cannot be read as numbers of the mirror's columns is left out (logged), the others are written.
        """
        out = []
        for peer, record in sorted(records.items()):
            try:
                rows, newest_step = self._record_rows(peer, record, now)
            except (ValueError, TypeError, KeyError, OverflowError) as error:
                log.warning("the metrics record of peer %.80s is left out: %s", peer, error)
                continue
            out += rows
            self.seen[peer] = newest_step
        return out

    def _record_rows(self, peer: str, record: dict[str, Any], now: float) -> tuple[list[tuple[Any, ...]], float]:
        """(the new rows of one peer's metrics record, the newest step written for it); ValueError, TypeError,
        OverflowError or KeyError for a record that is not one (`rows` writes none of its rows then)."""
        from rcswarm.observe.mirror_view import peer_name
        from rcswarm.state.schema import INT64_MAX

        worker = f"{peer_name(record['name'])}@{peer[-8:]}"
        newest = max((row[4] for row in record["rows"]), default=0.0)
        seen, out = self.seen.get(peer, 0.0), []
        for version, step, loss, tokens, wall, compute, sync, seq_len, batch in record["rows"]:
            if step <= seen:
                continue
            seen = step
            received = now - max(0.0, newest - wall)
            if not all(math.isfinite(x) for x in (wall, compute, sync, received)):
                raise ValueError(f"times {wall!r}, {compute!r}, {sync!r}: expected finite seconds")
            counts = [int(version), int(step), int(seq_len), int(batch), int(tokens)]
            if not all(abs(n) <= INT64_MAX for n in counts):
                raise ValueError(f"version, step, seq_len, batch, tokens {counts}: expected SQLite integers (< 2**63)")
            out.append((self.run_id, worker, *counts[:4], loss, counts[4], wall, compute, sync, 0, 0, None, received))
        return out, seen

    def poll(self, dht: Any) -> int:
        """Read the run's records, append the new rows, store the updated view; the number of rows written.
        `read_records` leaves out records the schema refuses; a record the mirror still cannot read is left out by
        `rows` and `update_view`."""
        from rcswarm.observe.mirror_view import VIEW_KEY, update_view
        from rcswarm.worker import hivemind_sync as hs

        now = time.time()
        metrics = hs.read_records(dht, hs.METRICS_KEY, self.spec.run.name)
        found = hs.read_records(dht, hs.DIGEST_KEY, self.spec.run.name)
        hs.warn_specless(found)
        digests = {peer: record for peer, record in found.items() if record.get("spec", "") == self.spec_digest}
        metrics = self.members_metrics(metrics, found, digests)
        seen = dict(self.seen)
        rows = self.rows(metrics, now)
        try:
            written = self.store.add_metrics(rows) if rows else 0
        except BaseException:
            self.seen = seen  # none of these rows was written: the next poll tries them again
            raise
        self.view = update_view(self.view, self.spec.run.name, digests, metrics, now)
        self.store.set_many({VIEW_KEY: self.view.to_json()})
        return written

    def members_metrics(self, metrics: dict[str, dict[str, Any]], found: dict[str, dict[str, Any]],
                        digests: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The metric records of `metrics` (by peer id) whose peers are members of this run: its digest of this poll
        holds this run's spec digest (`digests`), or, with no digest of it in this poll (`found`: every digest record
        read, any spec), an earlier one did (a version >= 0 in the view). The others are left out, logged once per peer
        and reason: a digest of another config under the run's name, one that names no spec (an older rcswarm), or
        none at all. A peer whose metrics come a poll before its digest is held back, not dropped: nothing of it is
        written or listed, its newest step written stays where it was, so the poll that reads its digest writes
        every row its metrics record still holds (the newest round's), and one INFO line says it is mirrored now."""
        earlier = {p.peer_id for p in self.view.peers if p.version >= 0}
        kept: dict[str, dict[str, Any]] = {}
        ignored: list[tuple[str, str, str]] = []
        for peer, record in sorted(metrics.items()):
            digest = found.get(peer)
            if peer in digests or (digest is None and peer in earlier):
                kept[peer] = record
                if peer in self._held_back:
                    self._held_back.discard(peer)
                    log.info("peer %.80s published a digest of this run: its metrics are mirrored from now on", peer)
                continue
            self._held_back.add(peer)
            if digest is None:
                why = ("it published no digest of this run (a peer outside the swarm, or a member whose digest this "
                       "node has not read yet: its rows are written once it has)")
            elif not digest.get("spec"):
                why = "its digest names no run spec (an older rcswarm): it is not counted as a member"
            else:
                why = (f"its digest holds another run spec ({str(digest['spec'])[:16]}..., this run's "
                       f"{self.spec_digest[:16]}...): a peer of another config under the run name "
                       f"{self.spec.run.name!r} is another swarm")
            ignored.append((peer, str(record.get("name", "")), why))
        self._log_ignored(ignored)
        if len(self._held_back) > _MAX_IGNORED_LOGGED:
            self._held_back.clear()
        return kept

    def _log_ignored(self, ignored: list[tuple[str, str, str]]) -> None:
        """One WARNING per (peer, reason) not logged before, at most _IGNORED_NAMED_PER_POLL a poll, the rest of
        this poll's new ones counted in one more line (a DHT flooded with made-up peer ids floods no log)."""
        from rcswarm.observe.mirror_view import peer_name

        new = [(peer, name, why) for peer, name, why in ignored if (peer, why) not in self._ignored_logged]
        for peer, name, why in new[:_IGNORED_NAMED_PER_POLL]:
            if len(self._ignored_logged) >= _MAX_IGNORED_LOGGED:
                self._ignored_logged.clear()
            self._ignored_logged.add((peer, why))
            log.warning("the metrics of peer %.80s (named %r) are not mirrored: %s", peer, peer_name(name)[:80], why)
        if len(new) > _IGNORED_NAMED_PER_POLL:
            log.warning("the metrics of %d more peers are not mirrored either (named in later polls): they are not "
                        "members of this run", len(new) - _IGNORED_NAMED_PER_POLL)

    def close(self) -> None:
        self.store.close()
        self.lock.release()


def _poll(mirror: Mirror, dht: Any) -> int:
    """`mirror.poll(dht)`, a failing poll logged and counted as 0 rows: the bootstrap peer and the next poll go on
    (hivemind_sync.PeerDied, the DHT's process gone, is raised: nothing is left to poll)."""
    from rcswarm.worker import hivemind_sync as hs

    try:
        return mirror.poll(dht)
    except hs.PeerDied:
        raise
    except Exception as error:  # noqa: BLE001 - one bad poll must not end the bootstrap peer the swarm dials
        log.warning("mirror poll failed, the next one goes on: %s: %s", type(error).__name__, error)
        return 0


def _not_a_mirror_dir(store: Any, spec: RunSpec) -> str | None:
    """Why the opened state dir is not one this run's mirror may write (a coordinator's, another run's), or None."""
    if store.get("checkpoint") is not None:
        return "holds a coordinator's run (its checkpoints)"
    stored = store.get("spec_json")
    if stored is not None:
        name = RunSpec.from_json(stored).run.name
        if name != spec.run.name:
            return f"mirrors run {name!r}, not {spec.run.name!r}"
    return None


def import_hivemind_sync() -> Any:
    """worker/hivemind_sync.py, imported now; None when the hivemind extra is not installed (HIVEMIND_EXTRA)."""
    try:
        from rcswarm.worker import hivemind_sync
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in HIVEMIND_MODULES:
            raise
        return None
    return hivemind_sync


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line's values, or None (before anything starts)."""
    if (args.config is None) != (args.state_dir is None):
        return "--config and --state-dir go together (the run whose metrics to mirror, and where)"
    for flag, seconds in (("--poll-s", args.poll_s), ("--stale-s", args.stale_s)):
        problem = seconds_problem(flag, seconds) if seconds is not None else None
        if problem is not None:
            return problem
    if args.maddrs_file is not None:
        problem = output_file_problem("--maddrs-file", args.maddrs_file)
        if problem is not None:
            return problem
    problem = empty_path_problem("--view-token-file", args.view_token_file)
    if problem is not None:
        return problem
    if args.http_port is None:
        extra = [flag for flag, given in (("--stale-s", args.stale_s is not None), ("--http-insecure", args.http_insecure),
                                          ("--http-token-required", args.http_token_required),
                                          ("--http-plaintext", args.http_plaintext),
                                          ("--view-token-file", args.view_token_file is not None),
                                          ("--http-trusted-proxy", bool(args.http_trusted_proxy))) if given]
        return f"{', '.join(extra)}: only with --http-port (the dashboard)" if extra else None
    if args.state_dir is None:
        return "--http-port serves the dashboard over the mirror: add --config RUN.toml --state-dir DIR"
    if not 0 <= args.http_port <= 65535:
        return f"--http-port {args.http_port}: expected 0..65535"
    from rcswarm.observe.dashboard.auth import dashboard_transport_problem, decide_dashboard_auth
    from rcswarm.observe.dashboard.proxies import trusted_proxies_problem

    problem = trusted_proxies_problem(args.http_trusted_proxy, args.http_port)
    if problem is not None:
        return problem

    try:
        required, _ = decide_dashboard_auth(args.http_host, args.http_token_required, args.http_insecure,
                                            view_tokens=args.view_token_file is not None)
    except ValueError as exc:
        return str(exc)
    if required and not os.environ.get(TOKEN_ENV) and args.view_token_file is None:
        return (f"the dashboard on {args.http_host} requires a token: set ${TOKEN_ENV} or give --view-token-file "
                "(or bind 127.0.0.1, or --http-insecure)")
    # The coordinator's rule (no --http-tls here: rcswarm dht serves plain HTTP only, and has no gRPC of its own).
    if dashboard_transport_problem(args.http_host, required, False, False, args.http_plaintext) is not None:
        what = "the join token" if os.environ.get(TOKEN_ENV) else "its view tokens"
        return (f"the dashboard on {args.http_host} would take {what} over plain HTTP, and rcswarm dht serves "
                "no HTTPS: put a TLS proxy or a tunnel (ssh -L, a VPN) in front and add --http-plaintext, or bind "
                "127.0.0.1")
    return None


def dashboard_auth(host: str, token_required: bool, insecure: bool, view_tokens: bool = False,
                   join_token: bool = True) -> tuple[bool, str | None]:
    """(whether the mirror's dashboard requires a token, a warning for the log or None): the coordinator's rule
    (`decide_dashboard_auth`; `view_tokens`: --view-token-file given), but `rcswarm dht` has no `--http-tls` (it
    serves plain HTTP only), so its warning for the token over plain HTTP names what does protect it: a TLS proxy or
    a tunnel in front, and what a reader of the traffic gets: the join token, or (`join_token` False: no
    $RCSWARM_TOKEN) a view token (pure; ValueError as `decide_dashboard_auth` raises it)."""
    from rcswarm.observe.dashboard.auth import decide_dashboard_auth

    required, warning = decide_dashboard_auth(host, token_required, insecure, view_tokens=view_tokens)
    if required and warning is not None:  # off loopback, the token over plain HTTP
        what, gets = ("the join token", "join the swarm") if join_token else ("its view tokens", "watch the run")
        warning = (f"the dashboard on {host} takes {what} over plain HTTP: anyone on the network path can "
                   f"read one and {gets}; rcswarm dht serves no HTTPS, so put a TLS proxy (one that "
                   "terminates HTTPS and forwards to this address) or a tunnel (ssh -L, a VPN) in front of it, "
                   "and let clients reach it only that way")
    return required, warning


def read_view_tokens(path: Path | None) -> Any:
    """--view-token-file's tokens (a `ViewTokens`, None without it), read and checked as the coordinator's
    --token-file; none of them $RCSWARM_TOKEN (`view_tokens_problem`; a reload that would add it is refused,
    `AcceptedTokens.keep_apart`). ValueError naming the flag and the path."""
    if path is None:
        return None
    from rcswarm.coordinator.tokens import JoinTokens, ViewTokens, view_tokens_problem

    view_tokens = ViewTokens.from_file(path)
    join_token = os.environ.get(TOKEN_ENV, "").strip()
    if join_token:
        join = JoinTokens([join_token])
        problem = view_tokens_problem(view_tokens, join)
        if problem is not None:
            raise ValueError(problem)
        view_tokens.keep_apart(join)  # a reload that would make it a view token is refused
    return view_tokens


def start_dashboard(args: argparse.Namespace, view_tokens: Any = None) -> Any:
    """The dashboard over the mirrored state dir (a `MirrorRun`), started; auth as the coordinator's: the join token
    ($RCSWARM_TOKEN, when set) and `view_tokens` (--view-token-file's `ViewTokens`, when given)."""
    from rcswarm.observe.dashboard import Dashboard
    from rcswarm.observe.dashboard.auth import JOIN_CREDENTIAL, VIEW_CREDENTIAL, SessionAuth, token_check
    from rcswarm.observe.mirror_view import STALE_S, MirrorRun

    required, warning = dashboard_auth(args.http_host, args.http_token_required, args.http_insecure,
                                       view_tokens=view_tokens is not None, join_token=bool(os.environ.get(TOKEN_ENV)))
    if warning:
        log.warning("%s", warning)
    token = os.environ.get(TOKEN_ENV, "").strip().encode()  # as the token is read everywhere (`one_token`)
    join = (lambda presented: hmac.compare_digest(presented.encode(), token)) if token else None
    auth = None
    if required:
        view = view_tokens.accepts_token if view_tokens is not None else None
        auth = SessionAuth(token_check(join, view), credential=JOIN_CREDENTIAL if view is None else VIEW_CREDENTIAL)
    run = MirrorRun(args.state_dir, args.stale_s or STALE_S)
    try:
        dashboard = Dashboard(run, args.http_host, args.http_port, auth=auth,
                              trusted_proxies=args.http_trusted_proxy).start()
    except BaseException:
        run.close()
        raise
    log.info("dashboard over %s at %s", args.state_dir, dashboard.url)
    if args.http_trusted_proxy:
        from rcswarm.observe.dashboard.proxies import trusted_proxies_line

        log.info("dashboard: %s", trusted_proxies_line(args.http_trusted_proxy))
    return dashboard


def main(argv: list[str] | None = None, stop: threading.Event | None = None) -> int:
    """The bootstrap peer until SIGTERM/SIGINT (or `stop`, set by an in-process caller)."""
    log_to_stderr("dht")
    args = parse_or_status(parser(), argv)
    if isinstance(args, int):
        return args
    problem = _argument_problem(args)
    if problem:
        return usage_error("rcswarm dht", problem)
    try:
        spec = RunSpec.from_toml(args.config) if args.config is not None else None
        if spec is not None and spec.sync.backend != "hivemind":
            raise ValueError(f"--config {str(args.config)!r}: sync.backend is {spec.sync.backend!r}, not \"hivemind\": "
                             "its workers send their metrics to the coordinator, not to the DHT, so a mirror of it would "
                             "mirror nothing (the coordinator's state dir holds them)")
        view_tokens = read_view_tokens(args.view_token_file)  # a bad file is told before anything starts
        hs = import_hivemind_sync()
        if hs is None:
            return usage_error("rcswarm dht", HIVEMIND_EXTRA)
        from hivemind.p2p import P2PDaemonError

        options = hs.HivemindOptions(initial_peers=tuple(args.initial_peers), host_maddrs=tuple(args.host_maddrs),
                                     announce_maddrs=tuple(args.announce_maddrs), identity_path=args.identity_path)
        mirror = Mirror(spec, args.state_dir) if spec is not None else None
    except (ValueError, OSError, StateDirBusy) as exc:
        return usage_error("rcswarm dht", str(exc))
    if stop is None:
        stop = StopSignal().install(signal.SIGTERM, signal.SIGINT)
    dht = dashboard = None
    try:
        dht = hs.start_dht(options)
        maddrs = hs.visible_maddrs(dht)
        for maddr in maddrs:
            print(maddr, flush=True)
        if args.maddrs_file is not None:
            try:
                args.maddrs_file.parent.mkdir(parents=True, exist_ok=True)  # made if missing (`output_file_problem`)
                args.maddrs_file.write_text("".join(f"{m}\n" for m in maddrs))
            except OSError as exc:
                log.error("bootstrap peer stops: cannot write --maddrs-file %s: %s", args.maddrs_file, exc)
                return 1
        log.info("bootstrap peer %s up; workers: --initial-peers %s", dht.peer_id, " ".join(maddrs))
        if args.http_port is not None:
            try:
                dashboard = start_dashboard(args, view_tokens)
            except OSError as exc:  # its port in use, an address not on this machine
                log.error("bootstrap peer stops: the dashboard cannot serve on %s: %s",
                          host_port(args.http_host, args.http_port), exc.strerror or exc)
                return 1
        while not stop.wait(args.poll_s if mirror is not None else 1.0):
            if mirror is not None:
                written = _poll(mirror, dht)
                if written:
                    log.info("mirrored %d metric rows into %s", written, args.state_dir)
        if mirror is not None:
            _poll(mirror, dht)
    except hs.PeerDied as exc:
        log.error("bootstrap peer stops: %s", exc)
        return 1
    except P2PDaemonError as exc:  # a --host-maddrs p2pd cannot parse or listen on (a port over 65535, another host's)
        log.error("bootstrap peer cannot start: %s", " ".join(str(exc).split()) or type(exc).__name__)
        return 1
    finally:
        if dashboard is not None:
            dashboard.stop()
            dashboard.coordinator.close()
        if mirror is not None:
            mirror.close()
        if dht is not None:
            dht.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
