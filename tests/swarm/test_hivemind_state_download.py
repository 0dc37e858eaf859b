"""A late joiner's state download (`HivemindPeer.load_state`, `_StateAverager.download_state`) against hostile donors:
a peer declaring a higher version whose state the run refuses is asked once, and a donor streaming far more than the
run's state holds, or trickling it, is read only up to `StateLimits` (its bytes and time), and no P2P message over
MAX_P2P_MESSAGE_BYTES is read; the joiner loads the honest donor's state either way. Real
averagers on 127.0.0.1; the donors' misbehaviour is their state or a subclass of the real averager. Without processes:
load_state's retries, and the group's final replica (`HivemindWorker._load_final`), which asks a donor serving
another state once."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, AsyncIterator  # typing's: hivemind tells a streaming RPC by its hint's _name

import pytest
import torch

from tests.helpers.specs import hivemind_spec
from tests.helpers.waiting import wait_for

hs = pytest.importorskip("rcswarm.worker.hivemind_sync")
from hivemind.p2p import P2PContext  # noqa: E402
from hivemind.proto import averaging_pb2, runtime_pb2  # noqa: E402
from hivemind.utils.streaming import STREAMING_CHUNK_SIZE_BYTES  # noqa: E402

from rcswarm.worker.hivemind_worker import HivemindWorker  # noqa: E402

RUN = "dl"
SHAPES = [(300,), (20, 10)]
NAMES = ["a", "b"]
HONEST_VERSION, HOSTILE_VERSION = 5, 9
LOAD_S = 10.0
# What the hostile donor of the second test streams: 256 MiB of one float32 tensor, ~67,000× this run's state (4 KB).
FLOOD_BYTES = 256 << 20
# More than `StateLimits` allows for SHAPES (4 KB of float32 values, 70 KB with its allowance): a joiner reads a donor
# at most this far.
READ_BOUND = 1 << 20
# Sent by the donor but not read by the joiner when it stops: what the sockets and the two p2pd hold meanwhile (seen:
# under 1 MB sent in all).
IN_FLIGHT_BYTES = 16 << 20
# How often the trickling donor of the third test sends a part: well within the per-message timeout (1 s or more).
TRICKLE_S = 0.2
# The bursting donor's burst: when (a little before the 1.07 s a donor of this state may take with loopback's 1 s
# message timeout), and how many parts (~47 KB of message cost, under the state's 70 KB).
BURST_AT_S, BURST_PARTS = 0.95, 350
# A state of ~22 MB (θ and momentum of 2.75M float32 values): at 1 MiB/s it takes longer than a 20 s load.
LARGE_SHAPES = [(2_750_000,)]


def _state(version: int, shapes: list[tuple[int, ...]], seed: int) -> tuple[dict[str, Any], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return {"run": RUN, "version": version}, [torch.randn(shape, generator=generator) for shape in shapes * 2]


class _Counted:
    """A peer's `state_fn` that counts its calls: hivemind calls it (in this process) once per download RPC the
    peer's averager serves."""

    def __init__(self, state: tuple[dict[str, Any], list[torch.Tensor]]) -> None:
        self.state, self.calls = state, 0

    def __call__(self) -> tuple[dict[str, Any], list[torch.Tensor]]:
        self.calls += 1
        return self.state


class _FloodingAverager(hs._StateAverager):
    """The real averager, except that it answers a download with this run's metadata and one float32 tensor of
    FLOOD_BYTES, in hivemind's parts, counting the downloads it answered in `asked` and the bytes it handed to the
    stream in `sent` (shared memory: the averager is forked from the test's process)."""

    asked: Any = None
    sent: Any = None

    async def rpc_download_state(self, request: averaging_pb2.DownloadRequest,
                                 context: P2PContext) -> AsyncIterator[averaging_pb2.DownloadData]:
        self.asked.value += 1
        chunk = bytes(STREAMING_CHUNK_SIZE_BYTES)
        first = runtime_pb2.Tensor(buffer=chunk, size=[FLOOD_BYTES // 4], dtype="float32",
                                   chunks=FLOOD_BYTES // len(chunk), compression=runtime_pb2.CompressionType.NONE)
        metadata = self.serializer.dumps({"run": RUN, "version": HOSTILE_VERSION})
        yield averaging_pb2.DownloadData(tensor_part=first, metadata=metadata)
        for _ in range(1, FLOOD_BYTES // len(chunk)):
            self.sent.value += len(chunk)
            yield averaging_pb2.DownloadData(tensor_part=runtime_pb2.Tensor(buffer=chunk))
        self.sent.value += len(chunk)


class _TricklingAverager(hs._StateAverager):
    """The real averager, except that it answers a download with this run's metadata and the start of a tensor, then
    one empty part every TRICKLE_S (within the per-message timeout, far under the state's bytes), for as long as it is
    read, counting the downloads it answered in `asked`."""

    asked: Any = None

    async def rpc_download_state(self, request: averaging_pb2.DownloadRequest,
                                 context: P2PContext) -> AsyncIterator[averaging_pb2.DownloadData]:
        self.asked.value += 1
        first = runtime_pb2.Tensor(buffer=bytes(4), size=[300], dtype="float32", chunks=10**6,
                                   compression=runtime_pb2.CompressionType.NONE)
        metadata = self.serializer.dumps({"run": RUN, "version": HOSTILE_VERSION})
        yield averaging_pb2.DownloadData(tensor_part=first, metadata=metadata)
        for _ in range(int(4 * LOAD_S / TRICKLE_S)):  # bounded: past the joiner's whole load
            await asyncio.sleep(TRICKLE_S)
            yield averaging_pb2.DownloadData(tensor_part=runtime_pb2.Tensor(buffer=bytes(4)))


class _BurstingAverager(hs._StateAverager):
    """`_TricklingAverager`, but with a burst of BURST_PARTS empty parts once BURST_AT_S have passed (within the state's
    bytes), then trickling again: the burst meets the end of the time a donor of this state may take, where Python
    3.11's wait_for drops a cancellation that arrives with a message, so a single cancellation was lost."""

    asked: Any = None

    async def rpc_download_state(self, request: averaging_pb2.DownloadRequest,
                                 context: P2PContext) -> AsyncIterator[averaging_pb2.DownloadData]:
        self.asked.value += 1
        started = time.monotonic()
        first = runtime_pb2.Tensor(buffer=bytes(4), size=[300], dtype="float32", chunks=10**6,
                                   compression=runtime_pb2.CompressionType.NONE)
        yield averaging_pb2.DownloadData(tensor_part=first,
                                         metadata=self.serializer.dumps({"run": RUN, "version": HOSTILE_VERSION}))
        while time.monotonic() - started < BURST_AT_S:
            await asyncio.sleep(TRICKLE_S)
            yield averaging_pb2.DownloadData(tensor_part=runtime_pb2.Tensor(buffer=bytes(4)))
        for _ in range(BURST_PARTS):
            yield averaging_pb2.DownloadData(tensor_part=runtime_pb2.Tensor(buffer=bytes(4)))
            await asyncio.sleep(0.001)
        for _ in range(int(4 * LOAD_S / TRICKLE_S)):
            await asyncio.sleep(TRICKLE_S)
            yield averaging_pb2.DownloadData(tensor_part=runtime_pb2.Tensor(buffer=bytes(4)))


# hivemind names a peer's RPCs after its averager's class: the joiner's stub calls `_StateAverager.rpc_download_state`.
_FloodingAverager.__name__ = _TricklingAverager.__name__ = _BurstingAverager.__name__ = hs._StateAverager.__name__


@contextmanager
def _peers(*donors: tuple[int, Any, type | None],
           shapes: list[tuple[int, ...]] = SHAPES) -> Iterator[tuple[Any, list[Any]]]:
    """(joiner, donors): one peer per (version, state_fn, averager class or None for the real one), each declaring
    its state at its version, and a joiner dialing the first, all of a run of `shapes`; yields once the joiner sees
    every declaration."""
    started: list[Any] = []
    try:
        for version, state_fn, averager in donors:
            options = hs.HivemindOptions.loopback(hs.visible_maddrs(started[0].dht) if started else ())
            with pytest.MonkeyPatch.context() as patch:
                if averager is not None:
                    patch.setattr(hs, "_StateAverager", averager)
                peer = hs.HivemindPeer(RUN, shapes, "fp32", 256, options, state_fn)
            started.append(peer)
            peer.set_state_version(version)
        joiner = hs.HivemindPeer(RUN, shapes, "fp32", 256, hs.HivemindOptions.loopback(hs.visible_maddrs(started[0].dht)),
                                 lambda: _state(0, shapes, 0))
        started.append(joiner)
        joiner.set_state_version(0, shareable=False)
        want = sorted(float(version) for version, _, _ in donors)
        wait_for(lambda: sorted(v for v in joiner.declared_versions() if v is not None) == want, 20.0,
                 f"the joiner to see the donors' declared versions {want}")
        yield joiner, started[:-1]
    finally:
        for peer in reversed(started):
            peer.shutdown()


def _assert_honest(loaded: Any, honest: tuple[dict[str, Any], list[torch.Tensor]]) -> None:
    assert loaded is not None, "the joiner loaded no state"
    version, tensors = loaded
    assert version == HONEST_VERSION
    assert len(tensors) == len(honest[1]) and all(torch.equal(a, b) for a, b in zip(tensors, honest[1]))


def _assert_honest_at_once(loaded: Any, seconds: float, honest: _Counted) -> None:
    """The joiner loaded the honest state, asking its donor once, within half its load's time."""
    _assert_honest(loaded, honest.state)
    assert honest.calls == 1
    assert seconds < LOAD_S / 2, f"the honest state took {seconds:.1f}s"


def _load_past(hostile: type, shapes: list[tuple[int, ...]] = SHAPES) -> tuple[Any, float, _Counted]:
    """(what the joiner loaded, its seconds, the honest donor) with an honest donor at HONEST_VERSION and one served by
    the averager class `hostile` declaring HOSTILE_VERSION (asked first), each asked by `_peers`."""
    honest = _Counted(_state(HONEST_VERSION, shapes, 1))
    with _peers((HONEST_VERSION, honest, None), (HOSTILE_VERSION, lambda: None, hostile), shapes=shapes) as (joiner, _):
        started = time.monotonic()
        loaded = joiner.load_state(NAMES[: len(shapes)], shapes, LOAD_S)
        return loaded, time.monotonic() - started, honest


@pytest.mark.slow
def test_a_refused_donor_declaring_a_higher_version_is_asked_once(no_new_p2pd: None) -> None:
    """The hostile donor declares version 9 and serves θ and momentum of the wrong shapes (the same number of
    values); the honest one declares 5. hivemind asks the highest priority every time: the joiner refused the same
    state until its timeout and loaded nothing."""
    honest = _Counted(_state(HONEST_VERSION, SHAPES, 1))
    hostile = _Counted(_state(HOSTILE_VERSION, [(200,), (30, 10)], 2))
    with _peers((HONEST_VERSION, honest, None), (HOSTILE_VERSION, hostile, None)) as (joiner, _):
        started = time.monotonic()
        loaded = joiner.load_state(NAMES, SHAPES, LOAD_S)
        seconds = time.monotonic() - started
    assert hostile.calls == 1, f"the hostile donor was asked {hostile.calls} times in {seconds:.1f}s"
    _assert_honest_at_once(loaded, seconds, honest)


@pytest.mark.slow
def test_a_donor_streaming_far_more_than_the_state_is_read_only_up_to_the_bound(no_new_p2pd: None) -> None:
    """The hostile donor declares version 9 and streams 256 MiB for a state of 4 KB: the joiner stops reading it past
    `StateLimits` (the donor had sent at most that plus what the transport holds) and loads the honest state, asking
    the hostile donor once. hivemind read all 256 MiB, every attempt, and loaded nothing."""
    _FloodingAverager.asked, _FloodingAverager.sent = mp.Value("q", 0), mp.Value("q", 0)
    loaded, seconds, honest = _load_past(_FloodingAverager)
    asked, sent = _FloodingAverager.asked.value, _FloodingAverager.sent.value
    assert sent < READ_BOUND + IN_FLIGHT_BYTES, f"the hostile donor sent {sent:,} bytes, asked {asked} times"
    assert asked == 1, f"the hostile donor was asked {asked} times in {seconds:.1f}s"
    _assert_honest_at_once(loaded, seconds, honest)


@pytest.mark.slow
def test_a_donor_trickling_its_state_is_left_for_the_next(no_new_p2pd: None) -> None:
    """The hostile donor declares version 9 and sends a part every 0.2 s, each within the per-message timeout: the
    joiner leaves it past `StateLimits.seconds` (its 70 KB at 1 MiB/s, plus one message's timeout) and loads the honest
    state, asking the hostile donor once. Before, it was read until the joiner's whole load had passed: no state."""
    _TricklingAverager.asked = mp.Value("q", 0)
    loaded, seconds, honest = _load_past(_TricklingAverager)
    asked = _TricklingAverager.asked.value
    assert asked == 1, f"the trickling donor was asked {asked} times in {seconds:.1f}s"
    _assert_honest_at_once(loaded, seconds, honest)


@pytest.mark.slow
def test_a_trickling_donor_of_a_large_state_is_left_for_the_next(no_new_p2pd: None) -> None:
    """The time a donor may take was a total, its state's bytes at 1 MiB/s: past ~20 MiB it outlasted the joiner's
    whole load, and the trickling donor kept it from the honest one again (review of the twentieth session). A donor
    must keep up the pace as it sends: this one is left after about one message's timeout."""
    _TricklingAverager.asked = mp.Value("q", 0)
    loaded, seconds, honest = _load_past(_TricklingAverager, LARGE_SHAPES)
    assert _TricklingAverager.asked.value == 1
    assert loaded is not None and loaded[0] == HONEST_VERSION, f"no honest state in {seconds:.1f}s"
    assert all(torch.equal(a, b) for a, b in zip(loaded[1], honest.state[1]))
    assert seconds < LOAD_S / 2, f"the honest state took {seconds:.1f}s"


@pytest.mark.slow
def test_a_donor_bursting_as_its_time_runs_out_is_left_for_the_next(no_new_p2pd: None) -> None:
    """A burst of parts timed for the end of a donor's time made the one cancellation that ended it get lost, and the
    donor was read until the joiner's load had passed (3 of 3 trials: no state). Its pace is now checked at every
    message and at each wait's end."""
    _BurstingAverager.asked = mp.Value("q", 0)
    loaded, seconds, honest = _load_past(_BurstingAverager)
    assert _BurstingAverager.asked.value == 1
    _assert_honest(loaded, honest.state)
    assert seconds < LOAD_S / 2, f"the honest state took {seconds:.1f}s"


@pytest.mark.slow
def test_a_donor_that_moved_on_while_another_was_read_is_judged_by_its_new_declaration(no_new_p2pd: None) -> None:
    """The honest donor finishes a round every 0.3 s and declares each new version; the joiner first reads a trickling
    donor for about a second. Judged against the declarations read before that, the honest state (three versions
    on) was refused as "above the version it declares" and its donor asked no more: no state (review of the
    twentieth session)."""
    round_s, started_at = 0.3, [time.monotonic()]

    def version() -> int:
        return HONEST_VERSION + int((time.monotonic() - started_at[0]) / round_s)

    theta = _state(0, SHAPES, 1)[1]
    _TricklingAverager.asked = mp.Value("q", 0)
    stop = threading.Event()
    with _peers((HONEST_VERSION, lambda: ({"run": RUN, "version": version()}, theta), None),
                (10**9, lambda: None, _TricklingAverager)) as (joiner, donors):
        started_at[0] = time.monotonic()

        def advance() -> None:
            while not stop.wait(round_s):
                donors[0].set_state_version(version())

        advancing = threading.Thread(target=advance, daemon=True)
        advancing.start()
        try:
            time.sleep(1.0)
            loaded = joiner.load_state(NAMES, SHAPES, LOAD_S)
        finally:
            stop.set()
            advancing.join(timeout=5.0)
    assert _TricklingAverager.asked.value == 1
    assert loaded is not None and loaded[0] > HONEST_VERSION + 3, loaded and loaded[0]
    assert all(torch.equal(a, b) for a, b in zip(loaded[1], theta))


def test_a_p2p_message_declared_over_the_bound_is_refused_before_it_is_read() -> None:
    """hivemind's P2P layer read a stream message of whatever length its sender declared, buffering it whole: a peer
    could make another hold as much as it cared to send. With the bound (installed by `start_dht`, which every peer's
    DHT, averager and mirror process is started after), a longer declaration is refused at its header."""
    hs.bound_p2p_messages()

    async def receive(declared: int, sent: bytes) -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(declared.to_bytes(hs.P2P.HEADER_LEN, hs.P2P.BYTEORDER) + sent)
        reader.feed_eof()
        return await hs.P2P.receive_raw_data(reader)

    assert asyncio.run(receive(5, b"hello")) == b"hello"
    assert asyncio.run(receive(hs.MAX_P2P_MESSAGE_BYTES, bytes(hs.MAX_P2P_MESSAGE_BYTES))) == bytes(hs.MAX_P2P_MESSAGE_BYTES)
    with pytest.raises(ValueError, match=f"a P2P stream message of {1 << 40:,} bytes declared: expected at most"):
        asyncio.run(receive(1 << 40, bytes(1 << 16)))
    with pytest.raises(ValueError, match="declared: expected at most"):
        asyncio.run(receive(hs.MAX_P2P_MESSAGE_BYTES + 1, bytes(hs.MAX_P2P_MESSAGE_BYTES + 1)))


# ---- load_state's retries, without processes ---------------------------------------------------------------------


class _Donors:
    """Stands in for the averager in `HivemindPeer.load_state`: answers each `download_state` with the next of
    `answers`, recording the peers each call excluded."""

    def __init__(self, *answers: Any) -> None:
        self.answers, self.excluded = list(answers), []

    def download_state(self, timeout_s: float, limits: Any, exclude: Any = ()) -> Any:
        self.excluded.append(set(exclude))
        return self.answers.pop(0) if self.answers else hs.Download(None, "")


def _bare_peer(averager: Any) -> Any:
    peer = object.__new__(hs.HivemindPeer)  # only what load_state reads: no DHT or averager process
    peer.run, peer.averager, peer.spec_digest = RUN, averager, ""
    return peer


def test_an_attempt_that_found_no_state_is_retried() -> None:
    good = _state(4, SHAPES, 3)
    peer = _bare_peer(_Donors(hs.Download(None, ""), hs.Download(good, "honest")))
    loaded = peer.load_state(NAMES, SHAPES, timeout_s=5.0)
    assert loaded is not None and loaded[0] == 4
    assert peer.averager.excluded == [set(), set()]


def test_refused_and_dropped_donors_are_excluded_from_later_attempts() -> None:
    wrong = _state(9, [(3,), (2,)], 3)
    good = _state(4, SHAPES, 4)
    peer = _bare_peer(_Donors(hs.Download(wrong, "hostile", ("flood",)), hs.Download(good, "honest")))
    loaded = peer.load_state(NAMES, SHAPES, timeout_s=5.0)
    assert loaded is not None and loaded[0] == 4
    assert peer.averager.excluded == [set(), {"hostile", "flood"}]


def test_the_state_limits_are_the_float32_state_plus_a_small_allowance() -> None:
    assert hs.StateLimits.of(SHAPES).bytes < READ_BOUND
    limits = hs.StateLimits.of([(1000, 1000), (10,)])
    values = 4 * 2 * (1000 * 1000 + 10)
    assert limits.tensors == 4
    assert values < limits.bytes < values * 1.01 + (1 << 17)


# ---- the group's final replica (`HivemindWorker._load_final`) ------------------------------------------------------


class _Declared:
    """Stands in for the averager: each `download_state` gets the state of the first donor of `donors` (by
    declared priority, highest first) that it does not exclude, counting the downloads each donor served."""

    def __init__(self, *donors: tuple[str, tuple[dict[str, Any], list[torch.Tensor]]]) -> None:
        self.donors, self.asked = list(donors), {donor: 0 for donor, _ in donors}

    def download_state(self, timeout_s: float, limits: Any, exclude: Any = ()) -> Any:
        for donor, state in self.donors:
            if donor not in exclude:
                self.asked[donor] += 1
                return hs.Download(state, donor)
        time.sleep(min(timeout_s, 0.2))  # nobody left to ask: the real averager finds no donor either
        return hs.Download(None, "")


class _Trainer:
    """What `_adopt` reads and writes of a `RoundTrainer`: θ by name."""

    def __init__(self, params: dict[str, torch.Tensor]) -> None:
        self.params = params

    def load(self, params: dict[str, torch.Tensor]) -> None:
        self.params = {name: t.clone() for name, t in params.items()}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return dict(self.params)


def test_the_final_replica_is_loaded_past_a_donor_serving_another_state() -> None:
    """At the last version a peer off the group's reference replica loads it (`_load_final`). A groupmate declaring a
    higher priority serves its own θ of the final version, which passes `_check_state` but is not the reference:
    it is asked once and the reference is loaded from the next donor. Before, each retry asked it again and the
    peer ended on its own θ after hivemind.settle_s."""
    final, settle_s = 7, 3.0
    own, other, reference = (_state(final, SHAPES, seed) for seed in (5, 6, 7))
    averager = _Declared(("other", other), ("reference", reference))
    peer = _bare_peer(averager)
    declared, published = [], []
    peer.set_state_version = lambda version, shareable=True: declared.append((version, shareable))
    peer.publish = lambda key, value: published.append((key, value)) or True
    worker = object.__new__(HivemindWorker)  # only what `_load_final` reads and `_adopt` writes
    worker.spec = hivemind_spec(run={"name": RUN}, hivemind={"settle_s": settle_s})
    worker.peer, worker.stop, worker.name, worker.version = peer, threading.Event(), "w", final
    worker.names, worker.shapes, worker.spec_digest = NAMES, SHAPES, ""
    worker.trainer = _Trainer(dict(zip(NAMES, own[1][:2])))
    worker.momentum = own[1][2:]

    def record(state: tuple[dict[str, Any], list[torch.Tensor]]) -> dict[str, Any]:
        return hs.digest_record(RUN, final, dict(zip(NAMES, state[1][:2])))

    started = time.monotonic()
    left = worker._load_final(record(own), record(reference))
    seconds = time.monotonic() - started
    assert averager.asked == {"other": 1, "reference": 1}, f"asked {averager.asked} in {seconds:.1f}s"
    assert left == 0.0
    assert all(torch.equal(a, b) for a, b in zip(worker.trainer.params.values(), reference[1][:2]))
    assert all(torch.equal(a, b) for a, b in zip(worker.momentum, reference[1][2:]))
    assert worker._published["sha256"] == record(reference)["sha256"]
    assert published == [(hs.DIGEST_KEY, worker._published)]
    assert declared == [(final, False), (final, True)]  # unshared while loading, shared again with the reference
    assert seconds < settle_s / 2, f"the reference took {seconds:.1f}s"
