"""A hivemind swarm without a coordinator, as `rcswarm dht` mirrors it into a state dir (issue #17).

The mirror (cli/dht.py `Mirror`) polls the DHT's records (worker/hivemind_sync.py: per peer its
digest, {run, version, sha256, ...}, and its metrics, {run, name, rows}) and keeps, besides the metric
rows it appends to the store, a view of the swarm: `SwarmView`, stored as JSON (never pickle) under
the state dir's run_state key `VIEW_KEY` (the store's `set_many`/`get`). `update_view` is the pure
step from one poll's records to the next view:

* per peer: its name (`peer_name`: printable, at most 128 characters before escaping) and worker id
  (`name@<last 8 characters of the peer id>`, as the mirrored metric rows name it), the version of its
  digest, its newest metric row's step, seq_len, loss and time (the worker's own clock), and
  `seen_at`, the mirror's time when its records last advanced (a new version or a newer row; a
  record lingers in the DHT for its TTL after the peer died, so presence alone says nothing), with
  `gap_s`, the seconds between its last two advances;
* the swarm's version: the highest version any peer's digest holds, the reference hivemind peers
  re-sync to (`hivemind_sync.resync_reason`: a peer behind it loads the state);
* at most `MAX_PEERS` peers, those seen last.

Which peers' records reach `update_view` is the mirror's choice (`Mirror.poll`): the digests that hold the run's
spec digest, and the metrics of those peers alone (a peer of another config under the same run name, or anyone on
the open DHT with a schema-valid metrics record, is not a member of this swarm).

`peer_state` says whether a peer is active: it advanced within max(`stale_s`, `STALE_FACTOR` ×
its gap) seconds; otherwise it is stale (listed as WORKER_STATE_LEFT with the reason "stale: ...").
A peer whose digest reached the run's last version (0 < run.rounds <= its version) has finished,
however recently its records advanced: WORKER_STATE_LEFT with the reason "finished: reached round
N" (a hivemind peer trains no round past run.rounds and ends there, `HivemindWorker._last_reached`;
it publishes no record that it ended, its Leave goes to a coordinator only, so its version is what
says so). `mirrored_status` builds the GetStatusResponse `rcswarm status --state-dir` prints and
the dashboard serves from the view and the store's per-worker totals (the mirror writes no rounds:
a hivemind round has no central record); `MirrorRun` is the read-only run the dashboard takes in
place of a coordinator.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rcswarm.config.runspec import RunSpec
from rcswarm.observe.analysis import worker_totals
from rcswarm.observe.summary import run_summary
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import printable
from rcswarm.state.schema import INT64_MAX
from rcswarm.state.store import StateStore

VIEW_KEY = "mirror_view"
VIEW_FORMAT = 1
MAX_PEERS = 512
# A peer is active while its records advanced within max(stale_s, STALE_FACTOR × its last gap) seconds.
STALE_S = 60.0
STALE_FACTOR = 3.0
MIRROR_HINT = "a state dir that `rcswarm dht --config RUN.toml --state-dir DIR` mirrors a hivemind swarm into"
# Metric row fields (hivemind_sync.MetricsRecord): version, step, loss, tokens, wall, compute, sync, seq_len, batch.
ROW_STEP, ROW_LOSS, ROW_WALL, ROW_SEQ_LEN = 1, 2, 4, 7
# A peer's name keeps at most this many of its characters (before escaping), as a coordinator's joining worker's.
MAX_NAME_CHARS = 128

log = logging.getLogger("rcswarm.mirror")


def peer_name(raw: Any) -> str:
    """A peer's own name (its metrics record's `name`, any string up to the schema's 200 characters) as the mirror
    stores and shows it: its first `MAX_NAME_CHARS` characters, each that is not printable (ESC, CR, NUL, a newline)
    written as its Python escape (`protos.wire.printable`, as a coordinator takes a joining worker's name). Both the
    view's `PeerView.name` and the worker id of the mirrored metric rows (cli/dht.py `Mirror`) come from it, so they
    match; nothing raw reaches `rcswarm status --state-dir`, the dashboard or its Prometheus labels (pure)."""
    return printable(str(raw)[:MAX_NAME_CHARS])


@dataclass(frozen=True)
class PeerView:
    """One peer as the mirror last saw it (times `first_seen`, `seen_at` on the mirror's clock)."""

    peer_id: str
    name: str
    version: int  # its digest's version; -1 before it published one
    step: int  # its newest metric row's step (0: none yet)
    seq_len: int
    loss: float | None
    wall_time: float  # the newest row's time on the worker's own clock
    first_seen: float
    seen_at: float
    gap_s: float = 0.0

    @property
    def worker_id(self) -> str:
        """The id the mirrored metric rows carry for this peer."""
        return f"{self.name}@{self.peer_id[-8:]}"


@dataclass(frozen=True)
class SwarmView:
    """The swarm at the mirror's last poll: its version and peers (newest `seen_at` first)."""

    run: str
    polled_at: float
    version: int
    peers: tuple[PeerView, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"format": VIEW_FORMAT, "run": self.run, "polled_at": self.polled_at, "version": self.version,
                           "peers": [asdict(p) for p in self.peers]}, allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, source: str) -> SwarmView:
        """The view stored as `text`; ValueError naming `source` when it is not one."""
        try:
            data = json.loads(text)
            if data.get("format") != VIEW_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {VIEW_FORMAT}")
            # A view stored by a mirror from before `peer_name` may hold a raw name: shown printable all the same.
            peers = tuple(PeerView(**{**peer, "name": printable(str(peer["name"]))}) for peer in data["peers"])
            return cls(str(data["run"]), float(data["polled_at"]), int(data["version"]), peers)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise ValueError(f"{source}: the mirrored swarm view is malformed ({error}): expected {MIRROR_HINT}") from None


def _newest_row(record: Mapping[str, Any] | None) -> list[float] | None:
    rows = record.get("rows") if record is not None else None
    return max(rows, key=lambda row: row[ROW_STEP]) if rows else None


def _peer(peer_id: str, old: PeerView | None, digest: Mapping[str, Any] | None, metrics: Mapping[str, Any] | None,
          now: float) -> PeerView:
    """`old` updated with this poll's records of the peer; ValueError, TypeError, KeyError or OverflowError for
    records that are not ones (`update_view` keeps `old` then)."""
    row = _newest_row(metrics)
    name = peer_name(metrics["name"]) if metrics is not None else old.name if old is not None else "peer"
    version = int(digest["version"]) if digest is not None else old.version if old is not None else -1
    loss = row[ROW_LOSS] if row is not None and math.isfinite(row[ROW_LOSS]) else None
    fresh = PeerView(
        peer_id, name, version, int(row[ROW_STEP]) if row is not None else 0,
        int(row[ROW_SEQ_LEN]) if row is not None else 0, loss, float(row[ROW_WALL]) if row is not None else 0.0,
        first_seen=now, seen_at=now,
    )
    if not all(-1 <= n <= INT64_MAX for n in (fresh.version, fresh.step, fresh.seq_len)):  # GetStatus's int64s
        raise ValueError(f"version {fresh.version}, step {fresh.step}, seq_len {fresh.seq_len}: expected int64 counts")
    if not math.isfinite(fresh.wall_time):
        raise ValueError(f"time {fresh.wall_time!r}: expected a finite time")
    if old is None:
        return fresh
    if row is None:
        fresh = replace(fresh, step=old.step, seq_len=old.seq_len, loss=old.loss, wall_time=old.wall_time)
    advanced = fresh.version > old.version or fresh.step > old.step
    return replace(fresh, first_seen=old.first_seen, seen_at=now if advanced else old.seen_at,
                   gap_s=now - old.seen_at if advanced else old.gap_s)


def update_view(previous: SwarmView | None, run: str, digests: Mapping[str, Mapping[str, Any]],
                metrics: Mapping[str, Mapping[str, Any]], now: float) -> SwarmView:
    """The view after a poll that read `digests` and `metrics` (by peer id, hivemind_sync.read_records) (pure).

    Peers whose records left the DHT keep their last state; the `MAX_PEERS` seen last are kept. A peer whose records
    cannot be read (`_peer`) keeps its last state too (logged).
    """
    known = {p.peer_id: p for p in previous.peers} if previous is not None else {}
    for peer_id in sorted(set(digests) | set(metrics)):
        try:
            peer = _peer(peer_id, known.get(peer_id), digests.get(peer_id), metrics.get(peer_id), now)
        except (ValueError, TypeError, KeyError, OverflowError) as error:
            log.warning("the records of peer %.80s are left out of the swarm's view: %s", peer_id, error)
            continue
        known[peer_id] = peer
    peers = sorted(known.values(), key=lambda p: (-p.seen_at, p.peer_id))[:MAX_PEERS]
    version = max((p.version for p in peers), default=-1)
    return SwarmView(run, now, max(version, 0), tuple(peers))


def finished(peer: PeerView, target_rounds: int) -> bool:
    """Whether `peer`'s digest holds the run's last version (never with run.rounds = 0, a run until stopped)."""
    return 0 < target_rounds <= peer.version


def peer_state(now: float, peer: PeerView, stale_s: float, target_rounds: int = 0) -> tuple[int, str]:
    """(WORKER_STATE_LEFT, "finished: reached round N") once `peer` holds the run's last version (`target_rounds`,
    run.rounds; 0: unbounded, never), else (WORKER_STATE_ACTIVE, "") while it advanced recently enough, else
    (WORKER_STATE_LEFT, why it is stale) (pure)."""
    if finished(peer, target_rounds):
        return pb.WORKER_STATE_LEFT, f"finished: reached round {target_rounds}"
    limit = max(stale_s, STALE_FACTOR * peer.gap_s)
    age = now - peer.seen_at
    if age <= limit:
        return pb.WORKER_STATE_ACTIVE, ""
    return pb.WORKER_STATE_LEFT, f"stale: no new record for {age:.0f} s (> {limit:.0f} s)"


def read_view(store: StateStore) -> tuple[str, RunSpec, SwarmView]:
    """(run id, spec, view) of a mirrored state dir; ValueError naming the database and what was expected."""
    identity = store.run_identity()
    if identity is None:
        raise ValueError(f"{store.db_path}: holds no run (no run_id or spec_json): expected {MIRROR_HINT}")
    text = store.get(VIEW_KEY)
    if text is None:
        raise ValueError(f"{store.db_path}: holds no mirrored swarm view (run_state key {VIEW_KEY!r}): expected {MIRROR_HINT}")
    run_id, spec_json = identity
    return run_id, RunSpec.from_json(spec_json), SwarmView.from_json(text, str(store.db_path))


def open_mirror(state_dir: Path) -> StateStore:
    """The mirrored state dir `state_dir`, opened read-only; FileNotFoundError naming it when it holds no state."""
    if not (Path(state_dir) / "state.sqlite").is_file():
        raise FileNotFoundError(f"{state_dir}: no state.sqlite here; expected {MIRROR_HINT}")
    return StateStore.open_read_only(state_dir)


def mirrored_status(store: StateStore, now: float, stale_s: float = STALE_S) -> pb.GetStatusResponse:
    """GetStatus of the mirrored swarm at `now` (no rounds: the mirror records none).

    The run is finished once the swarm's version reached run.rounds (> 0), each peer is a worker (`peer_state`:
    active, finished or stale). Tokens trained and applied both come from the mirrored rows (`worker_totals`): a
    peer publishes a round's rows only after that round's outer step made its next version
    (`HivemindWorker._publish`), so its mirrored tokens are those averaged into a version (a round whose Δ̄ its
    trust check refused, θ kept, is counted: its records do not say). Latest loss and tokens/s are over the active
    peers; when none is active, the loss is over every listed peer (as a coordinator's) and tokens/s over the
    finished ones (the rate the run ended at; 0 for a swarm whose peers all went stale)."""
    run_id, spec, view = read_view(store)
    rows = {row.worker_id: row for row in store.worker_rows(run_id)}
    totals = worker_totals(rows.values())
    target = spec.run.rounds
    tokens = min(sum(t.tokens for t in totals.values()), INT64_MAX)
    response = pb.GetStatusResponse(
        run_id=run_id, version=view.version, target_rounds=target,
        run_state=pb.RUN_STATE_FINISHED if 0 < target <= view.version else pb.RUN_STATE_RUNNING,
        total_tokens=tokens, applied_tokens=tokens,
    )
    active_losses: list[float] = []
    listed_losses: list[float] = []
    active, active_rate, finished_rate = False, 0.0, 0.0
    for peer in view.peers:
        state, reason = peer_state(now, peer, stale_s, target)
        row, total = rows.get(peer.worker_id), totals.get(peer.worker_id)
        steps = (row.last_wall_time - row.first_wall_time) / (row.rows - 1) if row is not None and row.rows > 1 else 0.0
        trained = total.tokens if total else 0
        response.workers.add(worker_id=peer.worker_id, name=peer.name, state=state, base_version=max(peer.version, 0),
                             seconds_since_heartbeat=max(0.0, now - peer.seen_at), device="hivemind peer",
                             reason=reason, trained_tokens=trained, applied_tokens=trained, step_seconds=steps)
        rate, loss = (total.tokens_per_second if total else 0.0), ([peer.loss] if peer.loss is not None else [])
        listed_losses += loss
        if state == pb.WORKER_STATE_ACTIVE:
            active, active_rate, active_losses = True, active_rate + rate, active_losses + loss
        elif finished(peer, target):
            finished_rate += rate
    losses = active_losses if active else listed_losses
    response.tokens_per_second = active_rate if active else finished_rate
    response.latest_loss = sum(losses) / len(losses) if losses else math.nan
    return response


class MirrorRun:
    """A mirrored swarm as the dashboard's run (read-only): `spec`, `run_id`, `store`, `status()`, `summary()`.

    Threads: called from the dashboard's request threads; it holds no state of its own besides the
    read-only store, whose reads take the store's lock.
    """

    # Its curves count the peers' own steps (`views.presentation`).
    mirrored = True

    def __init__(self, state_dir: Path, stale_s: float = STALE_S, clock: Callable[[], float] = time.time) -> None:
        self.store = open_mirror(state_dir)
        try:
            self.run_id, self.spec, _ = read_view(self.store)
        except BaseException:
            self.store.close()
            raise
        self.stale_s, self.clock = stale_s, clock

    def status(self) -> pb.GetStatusResponse:
        return mirrored_status(self.store, self.clock(), self.stale_s)

    def summary(self, status: pb.GetStatusResponse | None = None) -> pb.RunSummary:
        """The swarm in one line, as a coordinator's run gives it (`observe.summary.run_summary`)."""
        return run_summary(self.spec, status or self.status())

    def close(self) -> None:
        self.store.close()
