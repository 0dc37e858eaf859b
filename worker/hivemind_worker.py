"""A worker of the hivemind sync backend: DiLoCo rounds averaged peer to peer, no coordinator on the data path.

    rcswarm worker --backend hivemind (--config RUN.toml | --coordinator HOST:PORT --token T)
                   [--initial-peers MADDR ...] [--client-mode] [--host-maddrs MADDR ...]
                   [--announce-maddrs MADDR ...] [--identity-path F] [--out DIR]     (cli/worker.py)

Every peer builds θ_0 from the run's seed (so a fresh swarm starts from one θ_0) or, when a swarm already
trains, loads (version, θ, outer momentum) from the peer with the highest version. A round from version v: H
inner steps (the `RoundTrainer`'s, train/round.py) on the run's fixed schedule (`curriculum.schedule`, else
`data.seq_len` × `data.batch_size`) or, under `curriculum.worker_seq_lens` or the adaptive policy, on the
length the coordinator assigned this worker or the run's current rung (its TrainingAssignment, taken at round
boundaries; Δ̄ is weighted by tokens, so groupmates may train different lengths, as they briefly do around a
rung change); Δ = θ_v − θ_local, plus the error-feedback residual, as the codec sends it;
`HivemindPeer.average` with weight = tokens, each peer's weight counted at most the run's batch × seq_len ×
inner.steps (`round_token_bound`, by every reducer), gathering (version, tokens, norm); the group's Δ̄ is checked
(`trust_problem`: finite, norm ≤ hivemind.trust_factor (4) × ‖Δ‖, cosine with Δ ≥ hivemind.min_cosine (0)) and
then θ_{v+1}, b = outer_step(θ_v, b, Δ̄)
— the coordinator's step (sync/outer.py). Without a group the peer steps with its own Δ; a refused Δ̄ skips
the step (θ_{v+1} = θ_v). A peer whose group was at a higher version, or whose digest is off the
highest-version majority's by more than the tolerance (hivemind.drift_tolerance), re-syncs from peers, judged
once its round's group has published its digests (or hivemind.settle_s passed); at the last version, which no
later round repairs, the group ends on one replica (`_settle`), and each peer serves its state a few seconds
longer (hivemind.state_grace_s), then on while a live peer of the run is still behind, up to an all-reduce
timeout (one whose round ended after the group finished re-syncs from it at once and ends at the last
version). The rules in force are logged at start-up. Each round's digest and the newest metric rows go to the
DHT (worker/hivemind_sync.py), where `rcswarm dht --state-dir` mirrors them. With `--out DIR` the final θ goes
to DIR/final.safetensors and the per-round history to DIR/summary.json. With `--coordinator`
the worker also joins a coordinator for the control plane only (the run spec, a data seed, heartbeats, metrics
and Leave on a thread of its own, worker/hivemind_control.py): training never waits for the coordinator, and
goes on while it is down. SIGTERM or SIGINT ends the worker after its current step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import socket
import threading
import time
import typing
from collections import deque
from pathlib import Path
from typing import Any

import torch

from rcswarm.config.run_step import RunSteps
from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import REFUSED_LEAVE
from rcswarm.sync import codec as codecs
from rcswarm.sync.files import save_tensors
from rcswarm.sync.outer import outer_step
from rcswarm.train.bptt.segment_store import SpillSpaceError
from rcswarm.train.inner import make_task_from, typing_config_for, worker_data_seed
from rcswarm.train.round import MAX_DIVERGED_ROUNDS, Diverged, RoundTrainer, StepRow, check_finite
from rcswarm.worker import hivemind_sync as hs
from rcswarm.worker.data_root import dataset_problem
from rcswarm.worker.hivemind_control import ControlPlane
from rcswarm.worker.limits import ModelLimit
from rcswarm.worker.worker import first_line

log = logging.getLogger("rcswarm.worker")
# A fresh swarm's first matchmaking window, as a fraction of this peer's measured start-up. A constant, not a
# [hivemind] key: it follows from a measurement of this implementation's start-up, not an operator's choice. Peers
# launched together become ready within a fraction of a start-up of one another (measured on a loaded 2-core box,
# three peers launched at once, four runs: start-ups 13-15 s ready within 1.8 s, 0.14 of a start-up at
# most; 16-19 s within 0.5 s); 0.3 leaves twice that.
FIRST_WINDOW_FRACTION = 0.3
# What the group's reference replica adds to its declared version at the last one (`_settle`): above every peer's
# version, so a peer loading state reaches it first, and below the next version.
FINAL_PRIORITY = 0.5


class WindowRefused(RuntimeError):
    """The coordinator assigned a window beyond this worker's step limit (`ModelLimit.window_problem`)."""


def schedule_for(spec: RunSpec, version: int) -> tuple[int, int]:
    """(seq_len, batch) of the round from `version`: the `curriculum.schedule` row in force at the run step the
    version starts after; every hivemind round trains inner.steps (config/run_step.py)."""
    return spec.curriculum.at(RunSteps(spec.inner.steps).before(version), (spec.data.seq_len, spec.data.batch_size))


# Keys of the run spec left out of the spec digest the peers of a swarm compare (`spec_digest`): those that name a
# path on the peer's own host (each peer's config may live elsewhere), and those that describe a launch rather than the
# training (`rcswarm run --workers/--minutes` rewrite them in the spec its local peers get; the coordinator table
# configures a control coordinator, not the averaging).
UNHASHED_KEYS = (("curriculum", "law_from"), ("data", "task_config", "dataset"), ("run", "workers"),
                  ("run", "minutes"), ("sync", "min_reports"), ("coordinator",))


def spec_digest(spec: RunSpec) -> str:
    """SHA-256 (hex) of the run spec every peer of a swarm must share: the JSON (sorted keys) of `canonical_spec`.
    A peer's name and its flags are not in the spec. ValueError as `canonical_spec` raises it."""
    return hashlib.sha256(json.dumps(canonical_spec(spec), sort_keys=True).encode()).hexdigest()


def canonical_spec(spec: RunSpec) -> dict[str, Any]:
    """The run spec as `spec_digest` hashes it: `RunSpec.to_dict()` less UNHASHED_KEYS, its free-form tables replaced
    by the typed configs they become, so specs that train the same model on the same task hash alike (a default
    written out or left out, 0 or 0.0 in a float field, another preset overridden to the same config) and any other
    value differs: [model] as its name and the family's config (`registry.make_config`: preset and overrides
    applied), [data.task_config] as its task's config (`_typed_task_config`). Every other value is a typed RunSpec
    field already, and [data.task_config] of "stdlib" (no keys) or "git" (its one key in UNHASHED_KEYS) holds none.
    ValueError, as the worker's data check (`data_problem`) raises it, for overrides or a task config the model or
    task refuses."""
    canonical = spec.to_dict()
    for *tables, key in UNHASHED_KEYS:
        table: Any = canonical
        for name in tables:
            table = table.get(name) if isinstance(table, dict) else None
        if isinstance(table, dict):
            table.pop(key, None)
    model_config = registry.make_config(spec.model.name, spec.model.preset, spec.model.overrides)
    canonical["model"] = {"name": spec.model.name, "config": _declared_values(model_config)}
    task_config = _typed_task_config(spec, model_config)
    if task_config is not None:
        canonical["data"]["task_config"] = _declared_values(task_config)
    return canonical


def _typed_task_config(spec: RunSpec, model_config: Any) -> Any:
    """The config dataclass [data.task_config] becomes: the diagnostic task's (source "diag"), the typing task's
    `TypingConfig` (source "typing", its geometry the model's, whose config is `model_config`); None for a source
    without one."""
    if spec.data.source == "diag":
        return make_task_from(spec.data).config
    if spec.data.source == "typing":
        return typing_config_for(spec.data, model_config)
    return None


def _declared_values(config: Any) -> dict[str, Any]:
    """The fields of the config dataclass `config`, each as its declared type holds it: an integer in a field
    declared float (or float | None) as that float, as TOML's `0` and `0.0` set one dropout; the other values as
    they are (the config validated them: an int field holds an int)."""
    hints = typing.get_type_hints(type(config))

    def declared(name: str, value: Any) -> Any:
        floats = hints[name] is float or float in typing.get_args(hints[name])
        return float(value) if floats and isinstance(value, int) and not isinstance(value, bool) else value

    return {f.name: declared(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)}


def round_token_bound(spec: RunSpec, version: int) -> float:
    """The most tokens an honest peer trains in the round from `version`: batch × seq_len × inner.steps of the run's
    largest assignment around it (the schedule's rows at `version` and the next, as groupmates may be a version
    apart; the largest length of curriculum.worker_seq_lens or of the adaptive ladder, as their peers train
    different lengths), the bound the coordinator backend puts on a push's tokens (`sync.bound_tokens`; without it,
    none)."""
    if not spec.sync.bound_tokens:
        return math.inf
    section, data = spec.curriculum, spec.data
    lengths = section.worker_seq_lens or section.seq_lens
    if lengths:
        windows = [length * section.batch_for(length, data.batch_size) for length in lengths]
    else:
        windows = [seq_len * batch for seq_len, batch in (schedule_for(spec, version), schedule_for(spec, version + 1))]
    return float(max(windows) * spec.inner.steps)


class HivemindWorker:
    """One peer's training loop (the worker thread); `state()` is also called by hivemind's state server.

    `_snapshot`, the (version, θ, momentum) served to late joiners, is replaced whole after each
    round, so `state()` needs no lock.

    `started`: the time.monotonic() its start-up began, from which the first round's matchmaking window is
    measured (FIRST_WINDOW_FRACTION of the seconds until the peer is ready). `rcswarm worker` passes its process's
    start (imports included); by default the worker's construction, so a worker built in a long-lived process
    (a notebook, a test, a host program) does not wait a fraction of that process's age for its first group.
    """

    def __init__(self, spec: RunSpec, options: hs.HivemindOptions, *, name: str = "", device: str = "cpu",
                 out: Path | None = None, stop: threading.Event | None = None, control: ControlPlane | None = None,
                 data_seed: int | None = None, max_params: int = 0, started: float | None = None,
                 max_step_tokens: int = 0, data_root: Path | None = None) -> None:
        self._started = time.monotonic() if started is None else started
        if spec.sync.backend != "hivemind":
            raise ValueError(f"sync.backend = {spec.sync.backend!r}: a hivemind worker needs sync.backend = \"hivemind\"")
        if spec.is_sweep:
            raise ValueError("a hivemind swarm trains one run: expected no [sweep] (a sweep's runs are the coordinator "
                             "backend's)")
        if spec.curriculum.worker_seq_lens and control is None:
            raise ValueError(f"curriculum.worker_seq_lens = {spec.curriculum.worker_seq_lens}: a hivemind worker needs "
                             "--coordinator HOST:PORT, which assigns each worker its length")
        if spec.curriculum.adaptive and control is None:
            raise ValueError(f'curriculum.policy = "adaptive" (seq_lens {spec.curriculum.seq_lens}): a hivemind worker '
                             "needs --coordinator HOST:PORT, which decides the run's rung from the workers' metrics")
        # A spec a coordinator served reads a git dataset only under `data_root`; the caller's own spec is its consent.
        unreadable = dataset_problem(spec, data_root) if control is not None else ""
        if unreadable:
            raise ValueError(f"the run spec of {spec.run.name} is refused: {unreadable}")
        self.limit = ModelLimit.of(device, max_params, max_step_tokens)
        too_large = self.limit.problem(spec)
        if too_large:
            raise ValueError(f"the run spec of {spec.run.name} is refused before allocating: {too_large}")
        self.spec, self.options, self.out, self.control = spec, options, out, control
        self.spec_digest = spec_digest(spec)
        self.data_seed = data_seed
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.device = torch.device(device)
        self.stop = stop or threading.Event()
        # The model (θ_0 from the run's seed), its inner optimizer and data stream, the step count, compute seconds.
        self.trainer = RoundTrainer(self.device)
        self.model = self.trainer.build(spec, model_seed=spec.run.seed)
        self.names = [name for name, _ in self.model.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in self.model.named_parameters()]
        self.momentum = [torch.zeros(shape) for shape in self.shapes]
        self.codec = codecs.WireFormat.from_sync(spec.sync)
        self.error_feedback = codecs.ErrorFeedback(spec.sync.error_decay) if spec.sync.error_feedback else None
        self.version = 0
        self.sync_seconds = 0.0
        self._diverged_rounds = 0  # rounds in a row whose Δ was not finite (`_diverged`)
        self.exit_reason, self._refused = "", False  # why `run` returned 1 (`_end`)
        self.history: list[dict[str, Any]] = []
        self.recent_rows: deque[list[float]] = deque(maxlen=hs.MAX_METRIC_ROWS)
        self._published: dict[str, Any] | None = None  # the digest of this peer's current version, once stored
        self._snapshot: tuple[int, list[torch.Tensor]] = (0, self._params() + self.momentum)
        self.peer: hs.HivemindPeer | None = None
        self._startup_s = 0.0  # from `started` until this peer was ready: the first round's matchmaking window

    def _params(self) -> list[torch.Tensor]:
        return list(self.trainer.snapshot().values())

    def state(self) -> tuple[dict[str, Any], list[torch.Tensor]]:
        version, tensors = self._snapshot
        return {"run": self.spec.run.name, "version": version, "spec": self.spec_digest}, tensors

    def run(self) -> int:
        """Train until run.rounds versions exist (run.rounds = 0: until stopped) or a stop is requested; returns the
        exit code."""
        try:
            log.info("%s: hivemind rules: %s", self.name, self.spec.hivemind.describe())
            self.peer = hs.HivemindPeer(self.spec.run.name, self.shapes, self.spec.sync.codec,
                                        self.spec.sync.block_size, self.options, self.state, rules=self.spec.hivemind,
                                        value_bits=self.spec.sync.value_bits, spec_digest=self.spec_digest,
                                        stop=self.stop)
            self._startup_s = time.monotonic() - self._started
            log.info("%s: run spec digest %s (peers of another spec form another swarm)", self.name,
                     self.spec_digest[:hs.PREFIX_DIGEST_CHARS])
            log.info("%s: ready %.1fs after its start; first matchmaking window %.1fs", self.name, self._startup_s,
                     max(FIRST_WINDOW_FRACTION * self._startup_s, self.options.matchmaking_s))
            if self.data_seed is None:  # without a coordinator's data seed, one from the peer id
                seed = int.from_bytes(hashlib.sha256(self.peer.peer_id.encode()).digest()[:4], "little")
                self.data_seed = worker_data_seed(self.spec.run.seed, seed)
            newest = self.peer.newest_declared_version()
            if newest > 0:  # a swarm past θ_0 trains; at version 0 every peer holds θ_0 from the seed already
                self._resync(f"joining a swarm at version {newest}")
            else:
                self._warn_other_specs()
                self._publish_start()
            self.peer.set_state_version(self.version)
            while not self.stop.is_set() and not self._last_reached():
                self._round()
            if self._last_reached() and not self.stop.is_set():
                self._settle()
        except hs.PeerRefused as exc:
            return self._end(f"{self.name} cannot join the swarm: {exc}")
        except hs.P2PDaemonError as exc:  # its p2pd did not start: a flag's value (a port in use, no initial peer up)
            return self._end(f"{self.name} cannot start its hivemind peer: {hs.p2pd_problem(exc, self.options)}")
        except hs.PeerDied as exc:
            # A signal to the whole process group (a terminal's Ctrl-C, `kill -- -PGID`) ends the peer's processes as
            # it stops this worker (whose stop may come a moment after), or the stop came during the peer's start
            # (PeerStopped): the worker stopped.
            if not self.stop.wait(hs.STOP_GRACE_S):
                return self._end(f"{self.name} leaves the swarm at version {self.version}: {exc}; exits for its "
                                 "supervisor to start it again")
            log.info("%s: its hivemind peer ended with its stop (%s)", self.name, exc)
        except SpillSpaceError as exc:
            return self._end(f"{self.name} cannot train this window: {exc}")
        except WindowRefused as exc:
            return self._end(f"{self.name} cannot train this run: {exc}", refused=True)
        except torch.OutOfMemoryError as exc:  # one line, not a traceback: the device cannot hold this run's window
            data = self.trainer.data
            window = f", seq_len {data.seq_len} × batch {data.batch_size}" if data is not None else ""
            return self._end(f"{self.name} cannot train this run: out of memory on {self.device} at version "
                             f"{self.version}{window}: {first_line(exc)}", refused=True)
        except Diverged as exc:
            return self._end(f"{self.name} exits: the local training diverged {self._diverged_rounds} rounds in a row "
                             f"({exc}); lower inner.lr or check the data")
        finally:
            if self.peer is not None:
                self._write_out()
                self.peer.shutdown()
            if self.control is not None:
                self.control.close(self._leave_reason())
        log.info("%s %s at version %d", self.name, self._leave_reason(), self.version)
        return 0

    def _leave_reason(self) -> str:
        """What the Leave says: why the worker ends (`exit_reason`, "refused: ..." when it cannot train the run), or
        that it finished or stopped."""
        if self.exit_reason:
            return f"{REFUSED_LEAVE}{self.exit_reason}" if self._refused else self.exit_reason
        return "finished" if self._last_reached() else "stopped"

    def _last_reached(self) -> bool:
        """Whether this peer holds the run's last version (never with run.rounds = 0, a run until stopped: before,
        such a peer trained nothing and exited 0 as finished at version 0)."""
        return 0 < self.spec.run.rounds <= self.version

    def _end(self, reason: str, refused: bool = False) -> int:
        """Log why the worker ends (one ERROR line), keep it as `exit_reason` (`refused`: the run cannot be trained
        here, said in the Leave); exit status 1."""
        log.error("%s", reason)
        self.exit_reason, self._refused = reason, refused
        return 1

    def _assigned(self) -> tuple[int, int, str]:
        """(seq_len, batch, why) of the round from this version.

        Under curriculum.worker_seq_lens the coordinator's assignment for this worker (its own length,
        whatever the version); under the adaptive policy its newest assignment, the run's current rung
        (decided as the workers' metrics report each version, coordinator/curriculum.py): the peers
        of one group each switch at their first round boundary after their next heartbeat, so around
        a rung change they may train different lengths for a round, which their average takes as
        it takes worker_seq_lens (Δ̄ weighted by tokens). Otherwise the run spec's schedule row at
        this peer's version, the function the coordinator applies, so the peers of one group (one
        version) agree even while the coordinator's view of the version lags or it is down.
        """
        assignment = self.control.assignment() if self.control is not None else None
        assigned = self.spec.curriculum.worker_seq_lens or self.spec.curriculum.adaptive
        if assigned and assignment is not None:
            if assignment.seq_len < 1 or assignment.batch_size < 1:
                raise RuntimeError(f"the coordinator assigned seq_len {assignment.seq_len}, batch "
                                   f"{assignment.batch_size}: expected positive sizes")
            too_large = self.limit.window_problem(assignment.seq_len, assignment.batch_size,
                                                  f"the coordinator's assignment for version {self.version}")
            if too_large:
                raise WindowRefused(f"{too_large}; refused before allocating")
            return assignment.seq_len, assignment.batch_size, assignment.reason
        return (*schedule_for(self.spec, self.version), "the run spec")

    def _follow_assignment(self) -> None:
        """At a round boundary: switch the sampler to this round's (seq_len, batch) when it differs."""
        seq_len, batch, why = self._assigned()
        if self.trainer.follow(seq_len, batch, self.data_seed + self.version):
            log.info("%s: from version %d: seq_len %d, batch %d (%s)", self.name, self.version, seq_len, batch, why)

    def _row(self, row: StepRow) -> list[float]:
        """The row as the DHT records carry it: version, step, loss, tokens, wall, compute, sync, seq_len, batch."""
        return [float(row.version), float(row.step), float(row.loss), float(row.tokens), row.wall_time,
                row.compute_seconds, self.sync_seconds, float(row.seq_len), float(row.batch)]

    def pseudo_gradient(self, base: list[torch.Tensor]) -> list[torch.Tensor]:
        """Δ = θ_v − θ_local as the codec delivers it (with the error-feedback residual); a hook for tests. Diverged
        when Δ is not finite, before the residual takes any of it."""
        deltas = self.trainer.delta(dict(zip(self.names, base)))
        check_finite(self.version, deltas)
        if self.error_feedback is None:
            return list(deltas.values())
        _, sent = self.error_feedback.compress_decoded(deltas, self.codec, consume=True)
        return [sent[name] for name in self.names]

    def _round(self) -> None:
        failure = self.peer.failure()
        if failure:
            raise hs.PeerDied(failure)
        self._follow_assignment()
        base = self._params()
        trained = time.monotonic()
        result = self.trainer.train(self.version, self.spec.inner.steps, stop=self.stop)
        tokens, rows = result.tokens, [self._row(row) for row in result.rows]
        self.peer.timer.train_s = time.monotonic() - trained
        if self.stop.is_set():
            return
        started = time.perf_counter()
        try:
            deltas = self.pseudo_gradient(base)
        except Diverged as exc:  # nothing is sent: its groupmates average without it
            self._diverged(exc, base)
            return
        self._diverged_rounds = 0
        gather = {"version": self.version, "tokens": tokens, "norm": hs.global_norm(deltas)}
        window = FIRST_WINDOW_FRACTION * self._startup_s if self.version == 0 else None
        bound = round_token_bound(self.spec, self.version)
        result = self.peer.average(deltas, tokens, gather, window_s=window, max_tokens=bound, alone=self._alone,
                                   stop=self.stop)
        if self.stop.is_set():  # the step was cancelled (or ended as the stop came): no outer step, nothing published
            log.info("%s: stopped during round %d's averaging step; the round is not applied (θ stays at version "
                     "%d)", self.name, self.version, self.version)
            self._load(base)
            return
        if result is not None and result.group_version > self.version:
            self._resync(f"the group was at version {result.group_version}", ahead=True)
            return
        problem = self._step(base, deltas, deltas if result is None else result.deltas)
        self.version += 1
        self._snapshot = (self.version, self._params() + [m.clone() for m in self.momentum])
        self.peer.set_state_version(self.version)
        self.sync_seconds += time.perf_counter() - started
        group = len(result.gathered) if result is not None else 1
        measured = self._publish(rows, base, group)
        self.history.append({
            "version": self.version, "loss": sum(r[2] for r in rows) / max(len(rows), 1), "group": group,
            "skipped": problem, "drift": measured, "allreduce_s": result.seconds if result else None,
            "seq_len": self.trainer.data.seq_len, "batch": self.trainer.data.batch_size,
        })
        log.info("%s: version %d (group of %d, loss %.4f, drift %.3g); %s", self.name, self.version, group,
                 self.history[-1]["loss"], measured, self.peer.timer.describe())

    def _diverged(self, exc: Diverged, base: list[torch.Tensor]) -> None:
        """After a round whose Δ was not finite: drop it (θ_v back, the residual as before), start the inner optimizer
        afresh (its moments hold the divergence too, so every later round diverged again), one WARNING; re-raised
        at the MAX_DIVERGED_ROUNDS-th in a row, which ends the worker (before: it trained forever without a version,
        or without error feedback sent a NaN Δ that made every groupmate skip the round)."""
        self._diverged_rounds += 1
        if self._diverged_rounds >= MAX_DIVERGED_ROUNDS:
            raise exc
        self._load(base)
        self.trainer.reset_optimizer()
        log.warning("%s: round %d not averaged: %s; θ goes back to version %d and the inner optimizer starts afresh "
                    "(%d of %d such rounds in a row before the worker exits)", self.name, self.version, exc,
                    self.version, self._diverged_rounds, MAX_DIVERGED_ROUNDS)

    def _alone(self) -> bool:
        """Whether no other peer of the run may average this version with this one, read for
        hivemind.state_declare_s and a half (a declaration is renewed as it expires, so one read may fall between
        two): no other averager declares its state (every peer not in client mode does) and no other peer's digest
        is within one version of this one (a peer in client mode, which declares nothing, publishes one on its
        start in a fresh swarm and each round; one still training its round to this version has published the
        one before; peers that finished the run, far ahead, do not count). A client-mode peer that joined or
        re-synced is seen once its first round from there ends. A peer alone then ends its step soon
        after its window (`HivemindPeer.average`) instead of looking for a group until its step timeout."""
        deadline = time.monotonic() + self.spec.hivemind.state_declare_s + 0.5
        while not (self.peer.declared_versions() or self._digest_near()):
            if time.monotonic() >= deadline or self.stop.is_set():
                return True
            time.sleep(0.25)
        return False

    def _digest_near(self) -> bool:
        """Whether another peer's digest is within one version of this peer's."""
        digests = self.peer.records(hs.DIGEST_KEY, self.spec.run.name)
        return any(abs(r["version"] - self.version) <= 1 for peer, r in digests.items() if peer != self.peer.peer_id)

    def _warn_other_specs(self) -> None:
        """At the start, no averager of this run spec declaring a state: warn when peers of the run's name published
        digests past version 0 all the same (peers of another config or rcswarm version, whose averagers this one never
        meets)."""
        others = self.peer.records(hs.DIGEST_KEY, self.spec.run.name, other_specs=True)
        newest = max((r["version"] for r in others.values()), default=0)
        if newest > 0:
            log.warning("%s: peers of run %s published version %d, but no peer of this peer's run spec (digest %s) "
                        "serves a state: their config differs from this one, or their rcswarm version digests it "
                        "otherwise (every peer of a swarm needs the same run spec and rcswarm version); this peer "
                        "starts from θ_0", self.name, self.spec.run.name, newest,
                        self.spec_digest[:hs.PREFIX_DIGEST_CHARS])

    def _publish_start(self) -> None:
        """Store the digest of θ_0, which a peer of a fresh swarm starts from: a client-mode peer is then seen by
        `_alone` before its first round ends. Only at version 0, where every peer holds the same θ_0 and no drift
        is judged: a loaded state published as this peer's own would count as one more vote for the replica it
        was copied from (`resync_reason`, `final_reference`)."""
        params = dict(zip(self.names, self._params()))
        record = hs.digest_record(self.spec.run.name, self.version, params, spec=self.spec_digest)
        self.peer.publish(hs.DIGEST_KEY, record)

    def _step(self, base: list[torch.Tensor], deltas: list[torch.Tensor], averaged: list[torch.Tensor]) -> str:
        """θ_{v+1}, b = outer_step(θ_v, b, Δ̄) into the model, or θ_v again when Δ̄ fails the trust check (the reason)."""
        rules = self.spec.hivemind
        problem = hs.trust_problem(averaged, deltas, rules.trust_factor, rules.min_cosine)
        if problem:
            log.warning("%s: round %d skipped locally: %s", self.name, self.version, problem)
            self._load(base)
            return problem
        new, momentum = outer_step(dict(zip(self.names, base)), dict(zip(self.names, self.momentum)),
                                   dict(zip(self.names, averaged)), self.spec.outer)
        self.momentum = list(momentum.values())
        self._load(list(new.values()))
        return ""

    def _settle(self) -> None:
        """At the last version, which no later round repairs, the group ends on one replica: every peer waits up
        to hivemind.settle_s for the last group's digests, and they name the same reference (`final_reference`:
        the replica with the most peers within the drift tolerance). The reference declares its state above the
        version and waits for the others; each other peer whose θ differs loads the reference's state (checked
        against its digest, `same_replica`). Replicas that each applied a differently compressed Δ̄ drift apart
        by the codec's error round after round (a random walk the re-sync rule lets grow to the tolerance); this
        makes the run's result one θ. The drift measured after it is the history's `settled_drift`; then each
        serves its state hivemind.state_grace_s longer for a peer still loading."""
        mine = self._published
        if mine is None or mine["version"] != self.version:
            return
        rules = self.spec.hivemind
        others = {peer: r for peer, r in self._group_digests(self.history[-1]["group"]).items()
                  if r["version"] == self.version}
        reference = hs.final_reference(self.peer.peer_id, mine, others, rules.drift_tolerance)
        if reference == self.peer.peer_id:
            settled = self._serve_final(mine, set(others))
        else:
            settled = self._load_final(mine, others[reference])
        self.history[-1]["settled_drift"] = settled
        self._serve_late_peers()

    def _serve_late_peers(self) -> None:
        """Serve the final state hivemind.state_grace_s, then on while another live peer of the run declares an
        earlier version or none (one whose all-reduce ended after this group finished, or that began loading a
        state), up to the longest all-reduce of the run (hivemind.initial_allreduce_s for a first round, this
        peer's all-reduce timeout, at least hivemind.settle_s): such a peer re-syncs from it and ends at the last
        version, where without it it would find nobody and train the run's last rounds alone, each waiting its
        whole step timeout for a group. A peer that began loading declares "none" once, which lives
        hivemind.state_declare_s: the state is served on state_grace_s (at least that) after the last late peer
        was seen, so a load that takes longer than both may still lose its server."""
        rules = self.spec.hivemind
        if self.stop.wait(rules.state_grace_s):
            return
        late = self._late_peers()
        if not late:
            return
        longest = max(rules.settle_s, rules.initial_allreduce_s, self.peer.timer.allreduce_timeout())
        log.info("%s: serves its final state up to %.0fs more for %d peer(s) behind version %d", self.name, longest,
                 late, self.version)
        linger_s = max(rules.state_grace_s, rules.state_declare_s + 0.5)
        late = self._serve_while_late(late, time.monotonic() + longest, linger_s)
        if late:
            log.warning("%s: %d peer(s) still behind version %d after %.0fs; ends", self.name, late, self.version,
                        longest)

    def _serve_while_late(self, late: int, deadline: float, linger_s: float) -> int:
        """Wait, `late` peers seen now, until none was seen for `linger_s`, `deadline` (time.monotonic) passed, or a
        stop; the late peers seen last (0 unless the deadline cut the wait)."""
        seen = time.monotonic()
        while time.monotonic() < deadline and not self.stop.wait(0.5):
            late = self._late_peers()
            if late:
                seen = time.monotonic()
            elif time.monotonic() - seen >= linger_s:
                return 0
        return 0 if self.stop.is_set() else late

    def _late_peers(self) -> int:
        """How many other live peers of the run declare a version below this one's, or none."""
        return sum(v is None or v < self.version for v in self.peer.declared_versions())

    def _serve_final(self, mine: dict[str, Any], others: set[str]) -> float:
        """As the reference: declare this state above the version, wait until the group's other peers published
        this θ (or hivemind.settle_s passed); the largest drift of theirs left from it."""
        self.peer.set_state_version(self.version + FINAL_PRIORITY)
        deadline = time.monotonic() + self.spec.hivemind.settle_s
        while True:
            records = {peer: r for peer, r in self.peer.records(hs.DIGEST_KEY, self.spec.run.name).items()
                       if peer in others and r["version"] == self.version}
            settled = len(records) == len(others) and all(r["sha256"] == mine["sha256"] for r in records.values())
            if settled or time.monotonic() >= deadline or self.stop.is_set():
                break
            time.sleep(0.2)
        log.info("%s: the group ends on this replica (%d of %d others hold it)", self.name,
                 sum(r["sha256"] == mine["sha256"] for r in records.values()), len(others))
        return max((hs.drift(mine, r) for r in records.values()), default=0.0)

    def _load_final(self, mine: dict[str, Any], reference: dict[str, Any]) -> float:
        """Load the reference's state unless this θ is it (within hivemind.settle_s: a load may reach another peer
        first, one that serves another state, which `load_state` then asks no more); the drift left from it."""
        if mine["sha256"] == reference["sha256"]:
            return 0.0
        run, count = self.spec.run.name, len(self.names)
        found: list[dict[str, Any]] = []

        def the_reference(state: tuple[int, list[torch.Tensor]]) -> str:
            version, tensors = state
            if version != self.version:
                return f"version {version}, not the group's final version {self.version}"
            own = dict(zip(self.names, tensors[:count]))
            record = {**hs.digest_record(run, self.version, own, spec=self.spec_digest),
                      "steps": reference["steps"]}
            if not hs.same_replica(record, reference):
                return f"θ {record['sha256'][:12]}, not the group's reference replica {reference['sha256'][:12]}"
            found.append(record)
            return ""

        self.peer.set_state_version(self.version, shareable=False)  # the reference is the one state declared
        try:
            loaded = self.peer.load_state(self.names, self.shapes, self.spec.hivemind.settle_s,
                                          accept=the_reference, stop=self.stop)
            if loaded is not None:
                self._adopt(loaded[1])
                self._published = found[-1]
                self.peer.publish(hs.DIGEST_KEY, found[-1])
                log.info("%s: ends on the group's reference replica (drift %.3g from it before)",
                         self.name, hs.drift(mine, reference))
                return 0.0
        finally:
            self.peer.set_state_version(self.version)  # shareable again, serving the reference once loaded
        left = hs.drift(mine, reference)
        log.warning("%s: the reference replica was not loaded within %gs; ends on its own (drift %.3g from it)",
                    self.name, self.spec.hivemind.settle_s, left)
        return left

    def _group_digests(self, group: int) -> dict[str, dict[str, Any]]:
        """The other peers' digest records by peer id, once the `group` − 1 others of this version's group have
        published theirs or hivemind.settle_s passed: judged on part of its group, a peer could see one drifted
        groupmate (a cheat stepping alone) as large a cluster as its own and re-sync from it. At once when another
        peer is already past this version: this one is behind and re-syncs whatever its group publishes (waiting,
        a peer whose all-reduce ended after the others finished the run missed their last state)."""
        deadline = time.monotonic() + self.spec.hivemind.settle_s
        while True:
            others = {peer: r for peer, r in self.peer.records(hs.DIGEST_KEY, self.spec.run.name).items()
                      if peer != self.peer.peer_id}
            level = sum(r["version"] == self.version for r in others.values())
            behind = any(r["version"] > self.version for r in others.values())
            if level >= group - 1 or behind or time.monotonic() >= deadline or self.stop.is_set():
                return others
            time.sleep(0.2)

    def _publish(self, rows: list[list[float]], base: list[torch.Tensor], group: int) -> float:
        """Store this version's digest and metrics; re-sync when off the majority of its group (waiting for the
        group's digests, `_group_digests`). Returns the measured drift."""
        run = self.spec.run.name
        params = dict(zip(self.names, self._snapshot[1]))
        step = {n: p - b for n, p, b in zip(self.names, params.values(), base)}
        mine = hs.digest_record(run, self.version, params, step, self.spec_digest)
        self.peer.publish(hs.DIGEST_KEY, mine)
        self._published = mine
        self.recent_rows.extend(rows)
        if self.control is not None:
            self.control.report([self._metric(row) for row in rows]
                                + [self._metric(self._row(self.trainer.row(self.version, float("nan"), 0)),
                                                param_sha256=mine["sha256"])])
        self.peer.publish(hs.METRICS_KEY, {"run": run, "name": self.name, "rows": list(self.recent_rows)})
        others = self._group_digests(group)
        same = [hs.drift(mine, r) for r in others.values() if r["version"] == self.version]
        reason = hs.resync_reason(self.peer.peer_id, mine, others, self.spec.hivemind.drift_tolerance)
        if reason:
            self._resync(reason, ahead=any(r["version"] > self.version for r in others.values()))
        return max(same, default=0.0)

    @staticmethod
    def _metric(row: list[float], **fields: str) -> pb.Metric:
        version, step, loss, tokens, wall, compute, sync, seq_len, batch = row
        return pb.Metric(version=int(version), step=int(step), seq_len=int(seq_len), batch=int(batch), loss=loss,
                         tokens=int(tokens), wall_time=wall, compute_seconds=compute, sync_seconds=sync, **fields)

    def _resync(self, why: str, ahead: bool = False) -> None:
        """Load (version, θ, momentum) from the highest-version peer, at this peer's version or later, and past it when
        `ahead` (the re-sync is for being behind a peer or a group); a donor below that is refused (the peer whose
        digest asked for the re-sync may have left, its record outliving it, and a state at or below this peer's
        version would train old rounds again). Without such a state, or once stopped, it keeps training from the
        local state."""
        log.warning("%s re-syncs from peers: %s", self.name, why)
        self.peer.set_state_version(self.version, shareable=False)  # nobody loads a drifted state meanwhile
        lowest = self.version + 1 if ahead else self.version

        def not_behind(state: tuple[int, list[torch.Tensor]]) -> str:
            if 0 < self.spec.run.rounds < state[0]:  # no honest peer trains past the run's end (a claim to end it at once)
                return f"its version {state[0]} is past the run's last, run.rounds = {self.spec.run.rounds}"
            return "" if state[0] >= lowest else f"its version {state[0]} is below {lowest}, the least this re-sync takes"

        loaded = self.peer.load_state(self.names, self.shapes, self.options.join_timeout_s, accept=not_behind,
                                      stop=self.stop)
        if loaded is None:
            log.warning("%s: no peer served a state at version %d or later within %gs; training on from version %d",
                        self.name, lowest, self.options.join_timeout_s, self.version)
        else:
            self.version, tensors = loaded
            self._adopt(tensors)
            log.info("%s loaded version %d from peers", self.name, self.version)
        self.peer.set_state_version(self.version)

    def _adopt(self, tensors: list[torch.Tensor]) -> None:
        """Take a peer's state as this one's: θ tensors, then the outer momentum (the state's order), and the
        snapshot served to others."""
        count = len(self.names)
        self._load(tensors[:count])
        self.momentum = [t.clone() for t in tensors[count:]]
        self._snapshot = (self.version, self._params() + [m.clone() for m in self.momentum])

    def _load(self, tensors: list[torch.Tensor]) -> None:
        self.trainer.load(dict(zip(self.names, tensors)))

    def _write_out(self) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        save_tensors({name: p.detach().cpu().contiguous() for name, p in self.model.named_parameters()},
                     self.out / "final.safetensors")
        summary = {"name": self.name, "version": self.version, "history": self.history,
                   "peer_id": self.peer.peer_id if self.peer else ""}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
