"""`rcswarm dht`: a stable bootstrap peer for a hivemind swarm, optionally mirroring its metrics.

    rcswarm dht [--host-maddrs /ip4/0.0.0.0/tcp/31337] [--announce-maddrs MADDR ...] [--identity-path F]
                [--initial-peers MADDR ...] [--maddrs-file F] [--config RUN.toml --state-dir DIR]

It runs one DHT node (no averager, no training) with rcswarm's record validator and prints its
multiaddrs, which workers pass as `--initial-peers`; with `--identity-path` the peer id, hence the
multiaddrs, survive restarts. With `--config` and `--state-dir` it polls the run's metric records
(worker/hivemind_sync.py) every `--poll-s` seconds and appends the rows it has not seen to the
state dir's SQLite (coordinator/store.py), so `rcswarm fit DIR` and the dashboard's readers work
as with a coordinator. SIGTERM or SIGINT stops it (and its p2pd).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rcswarm.cli.usage import new_parser, parse_or_status, usage_error
from rcswarm.config.runspec import RunSpec

log = logging.getLogger("rcswarm.dht")


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
    parser.add_argument("--state-dir", type=Path, help="mirror the run's metric records into this state dir")
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between mirror polls")
    return parser


class Mirror:
    """Appends the metric rows of the DHT's records that it has not written yet (one thread)."""

    def __init__(self, spec: RunSpec, state_dir: Path) -> None:
        from rcswarm.coordinator.store import StateStore

        self.spec = spec
        self.store = StateStore(state_dir)
        self.run_id = self.store.get("run_id") or spec.run.name
        self.store.set_many({"run_id": self.run_id, "spec_json": spec.to_json()})
        # Per peer: the newest step written.
        self.seen: dict[str, float] = {}

    def rows(self, records: dict[str, dict[str, Any]], now: float) -> list[tuple[Any, ...]]:
        """New METRIC_COLUMNS rows from metric records {peer: {run, name, rows}}."""
        out = []
        for peer, record in sorted(records.items()):
            worker = f"{record['name']}@{peer[-8:]}"
            for version, step, loss, tokens, wall, compute, sync, seq_len, batch in record["rows"]:
                if step <= self.seen.get(peer, 0.0):
                    continue
                self.seen[peer] = step
                out.append((self.run_id, worker, int(version), int(step), int(seq_len), int(batch), loss, int(tokens),
                            wall, compute, sync, 0, 0, None, now))
        return out

    def poll(self, dht: Any) -> int:
        from rcswarm.worker import hivemind_sync as hs

        rows = self.rows(hs.read_records(dht, hs.METRICS_KEY, self.spec.run.name), time.time())
        return self.store.add_metrics(rows) if rows else 0

    def close(self) -> None:
        self.store.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s dht %(levelname)s %(message)s")
    args = parse_or_status(parser(), argv)
    if isinstance(args, int):
        return args
    if (args.config is None) != (args.state_dir is None):
        return usage_error("rcswarm dht", "--config and --state-dir go together (the run whose metrics to mirror, and where)")
    if not args.poll_s > 0:
        return usage_error("rcswarm dht", f"--poll-s {args.poll_s}: expected seconds > 0")
    try:
        spec = RunSpec.from_toml(args.config) if args.config is not None else None
        from rcswarm.worker import hivemind_sync as hs

        options = hs.HivemindOptions(initial_peers=tuple(args.initial_peers), host_maddrs=tuple(args.host_maddrs),
                                     announce_maddrs=tuple(args.announce_maddrs), identity_path=args.identity_path)
    except (ValueError, OSError) as exc:
        return usage_error("rcswarm dht", str(exc))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    dht = hs.start_dht(options)
    mirror = None
    try:
        maddrs = hs.visible_maddrs(dht)
        for maddr in maddrs:
            print(maddr, flush=True)
        if args.maddrs_file is not None:
            args.maddrs_file.write_text("".join(f"{m}\n" for m in maddrs))
        log.info("bootstrap peer %s up; workers: --initial-peers %s", dht.peer_id, " ".join(maddrs))
        mirror = Mirror(spec, args.state_dir) if spec is not None else None
        while not stop.wait(args.poll_s if mirror is not None else 1.0):
            if mirror is not None:
                written = mirror.poll(dht)
                if written:
                    log.info("mirrored %d metric rows into %s", written, args.state_dir)
        if mirror is not None:
            mirror.poll(dht)
    finally:
        if mirror is not None:
            mirror.close()
        dht.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
