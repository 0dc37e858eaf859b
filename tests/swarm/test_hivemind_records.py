"""What a hivemind peer reads from others is checked before it is used: DHT records (finite numbers, bounded versions),
a groupmate's gathered version, the state priorities other averagers declare, and a DHT process that stopped
answering. Most tests here are in-process (the functions, with stand-ins for the DHT); the client-mode one and the
killed DHT start real peers on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import signal
import threading
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rcswarm.worker import hivemind_sync as hs

pytest.importorskip("hivemind")

from hivemind.dht.protocol import DHTProtocol  # noqa: E402
from hivemind.dht.routing import DHTID  # noqa: E402
from hivemind.dht.validation import DHTRecord  # noqa: E402
from hivemind.proto import crypto_pb2  # noqa: E402
from hivemind.utils import MPFuture, get_dht_time  # noqa: E402
from hivemind.utils.crypto import RSAPrivateKey  # noqa: E402
from hivemind.utils.timed_storage import ValueWithExpiration  # noqa: E402

from tests.helpers.hivemind import ResyncDonors  # noqa: E402
from tests.helpers.specs import hivemind_spec  # noqa: E402

ROW = [0.0, 1.0, 2.5, 128.0, 1.7e9, 0.1, 0.0, 32.0, 4.0]


def _valid(key: str, value: Any) -> bool:
    """Whether rcswarm's DHT validator accepts `value` under `key`, subkey "peer"."""
    dumps = DHTProtocol.serializer.dumps
    record = DHTRecord(key=DHTID.generate(source=key).to_bytes(), subkey=dumps("peer"), value=dumps(value),
                       expiration_time=0.0)
    return hs.record_validator().validate(record)


def _row(index: int, value: float) -> list[float]:
    """ROW with `value` at `index`."""
    row = list(ROW)
    row[index] = value
    return row


class _FakeDHT:
    """A DHT stand-in for one key: `get` and `store` answer `future`; `alive` is what `is_alive` says."""

    def __init__(self, value: Any = None, future: concurrent.futures.Future | None = None, alive: bool = True) -> None:
        self.future = future or concurrent.futures.Future()
        if future is None:
            self.future.set_result(value)
        self.alive, self.pid, self.exitcode = alive, 4242, None if alive else -9

    def is_alive(self) -> bool:
        return self.alive

    def get(self, key: str, latest: bool = False, return_future: bool = False) -> Any:
        assert return_future, "a call into the DHT's process must not wait without a bound"
        return self.future

    def store(self, *args: Any, return_future: bool = False, **kwargs: Any) -> Any:
        assert return_future, "a call into the DHT's process must not wait without a bound"
        return self.future


def _found(values: dict[Any, Any]) -> ValueWithExpiration:
    """A dictionary value as `dht.get(latest=True)` returns it."""
    expiration = get_dht_time() + 30
    return ValueWithExpiration({k: ValueWithExpiration(v, expiration) for k, v in values.items()}, expiration)


def test_records_refuse_non_finite_numbers_and_versions_beyond_int64() -> None:
    good = hs.digest_record("hm", 3, {"w": torch.ones(40)})
    assert _valid(hs.DIGEST_KEY, good)
    assert _valid(hs.DIGEST_KEY, {**good, "version": hs.MAX_VERSION - 1})
    for bad in ({**good, "version": hs.MAX_VERSION}, {**good, "version": 2**64 - 1},
                {**good, "sums": [math.nan] * hs.SKETCH_PARTS}, {**good, "sums": [math.inf] * hs.SKETCH_PARTS},
                {**good, "norms": [math.inf] * hs.SKETCH_PARTS}, {**good, "steps": [math.inf] * hs.SKETCH_PARTS}):
        assert not _valid(hs.DIGEST_KEY, bad), bad
        assert hs.record_problem(hs.DIGEST_KEY, bad)
    assert _valid(hs.METRICS_KEY, {"run": "hm", "name": "a", "rows": [ROW]})
    assert _valid(hs.METRICS_KEY, {"run": "hm", "name": "a", "rows": [_row(hs.ROW_LOSS, math.nan)]})  # diverged
    for index, value in ((1, math.nan), (1, math.inf), (1, 1e300), (4, math.inf), (hs.ROW_LOSS, math.inf),
                         (3, -1e300)):
        metrics = {"run": "hm", "name": "a", "rows": [ROW, _row(index, value)]}
        assert not _valid(hs.METRICS_KEY, metrics), (index, value)
        assert f"position {index}" in hs.record_problem(hs.METRICS_KEY, metrics)


def _owner() -> tuple[str, str]:
    """(peer id, subkey) of a new RSA identity, as a peer files its records (`owner_subkey`)."""
    public = RSAPrivateKey().get_public_key().to_bytes().decode()
    peer_id = hs.peer_id_of(public)
    return peer_id, hs.owner_subkey(peer_id, public)


def test_records_a_node_with_an_older_validator_serves_are_checked_again() -> None:
    good = {"run": "hm", "name": "a", "rows": [ROW]}
    bad = {"run": "hm", "name": "evil", "rows": [_row(1, math.inf)]}
    (good_id, good_subkey), (_, evil_subkey), (_, other_subkey) = _owner(), _owner(), _owner()
    dht = _FakeDHT(_found({good_subkey: good, evil_subkey: bad, other_subkey: {**good, "run": "x"}}))
    assert hs.read_records(dht, hs.METRICS_KEY, "hm") == {good_id: good}


def test_records_count_only_under_the_peer_id_of_the_key_that_signed_them(no_new_p2pd: None) -> None:
    """Real DHT nodes with rcswarm's validators (review of the eighteenth session: the subkey was the storer's word, so
    any node could file digests under another peer's id, or hide that peer's own with a later expiration). A record
    goes under `<peer id>[owner:<RSA key>]` signed by that key: another node's copy under a peer's subkey is refused
    by the DHT, and one under the peer's id but its own key, or under a bare peer id, is left out by readers."""
    digest = hs.digest_record("hm", 1, {"w": torch.ones(4)})
    victim = hs.start_dht(hs.HivemindOptions.loopback())
    cheat = None
    try:
        cheat = hs.start_dht(hs.HivemindOptions.loopback(hs.visible_maddrs(victim)))
        victim_id, cheat_key = str(victim.peer_id), cheat.record_subkey.partition("[owner:")[2][:-1]
        assert hs.subkey_owner(victim.record_subkey) == (victim_id, "")
        assert hs.subkey_owner(cheat.record_subkey) == (str(cheat.peer_id), "")
        assert hs.store_record(victim, victim.record_subkey, hs.DIGEST_KEY, digest, 30.0)
        forged = {**digest, "version": 7}
        assert not hs.store_record(cheat, victim.record_subkey, hs.DIGEST_KEY, forged, 3600.0)  # not its signature
        assert hs.store_record(cheat, victim_id, hs.DIGEST_KEY, forged, 3600.0)  # unsigned: stored, never read
        assert hs.store_record(cheat, hs.owner_subkey(victim_id, cheat_key), hs.DIGEST_KEY, forged, 3600.0)
        for reader in (victim, cheat):
            assert hs.read_records(reader, hs.DIGEST_KEY, "hm") == {victim_id: digest}
    finally:
        if cheat is not None:
            cheat.shutdown()
        victim.shutdown()


def test_a_digest_record_without_a_spec_digest_is_left_out_with_a_warning_naming_its_peer(
        no_new_p2pd: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rolling upgrade: a peer of an rcswarm before digest records carried the run spec digest publishes records
    without `spec`. A peer with a digest refused them by schema (on store and on read: "spec: field required") and
    so counted them silently nowhere, perhaps starting from θ_0 beside a swarm it never heard of. Now the DHT
    keeps them, the peer still counts them nowhere (not its spec), and it says so once per peer, naming it."""
    monkeypatch.setattr(hs, "_SPECLESS", set(), raising=False)  # each peer warned of once in this test
    ours = "a" * 64
    older = {k: v for k, v in hs.digest_record("hm", 5, {"w": torch.ones(4)}).items() if k != "spec"}
    assert hs.record_problem(hs.DIGEST_KEY, older) == ""
    reader = hs.start_dht(hs.HivemindOptions.loopback())
    old = None
    try:
        old = hs.start_dht(hs.HivemindOptions.loopback(hs.visible_maddrs(reader)))
        old_id, reader_id = str(old.peer_id), str(reader.peer_id)
        assert hs.store_record(old, old.record_subkey, hs.DIGEST_KEY, older, 30.0)
        mine = hs.digest_record("hm", 2, {"w": torch.ones(4)}, spec=ours)
        assert hs.store_record(reader, reader.record_subkey, hs.DIGEST_KEY, mine, 30.0)
        peer = types.SimpleNamespace(dht=reader, spec_digest=ours)  # what `HivemindPeer.records` reads
        with caplog.at_level("WARNING", logger="rcswarm.hivemind"):
            assert hs.HivemindPeer.records(peer, hs.DIGEST_KEY, "hm") == {reader_id: mine}
            assert hs.HivemindPeer.records(peer, hs.DIGEST_KEY, "hm", other_specs=True) == {old_id: older}
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings  # once per peer, however often its records are read
        assert f"peer {old_id} publishes no run spec digest" in warnings[0]
        assert "probably an older rcswarm" in warnings[0] and "not counted" in warnings[0]
        assert "no state is loaded from it" in warnings[0]
    finally:
        if old is not None:
            old.shutdown()
        reader.shutdown()


def test_an_identity_file_that_holds_no_rsa_key_is_refused_by_name(tmp_path) -> None:
    path = tmp_path / "ed25519.key"
    path.write_bytes(crypto_pb2.PrivateKey(key_type=crypto_pb2.Ed25519, data=b"\0" * 64).SerializeToString())
    with pytest.raises(ValueError, match=f"--identity-path {path}: expected a libp2p RSA private key.*Ed25519"):
        hs.HivemindOptions(identity_path=path)  # what `rcswarm dht` and `rcswarm worker` build: a usage error
    made = hs.PeerIdentity.of(tmp_path / "new.key")  # a missing file is created, as hivemind does
    assert made.made_dir is None and hs.PeerIdentity.of(made.path).peer_id == made.peer_id


def test_a_non_finite_sketch_is_far_from_every_replica_and_never_the_reference() -> None:
    torch.manual_seed(0)
    step = {"w": torch.randn(4096) * 1e-2}
    theta = {"w": torch.randn(4096)}
    a = hs.digest_record("hm", 9, theta, step)
    b = hs.digest_record("hm", 9, {"w": theta["w"] + 1e-4 * torch.randn(4096)}, step)
    cheat = hs.digest_record("hm", 9, {"w": theta["w"] + 5.0}, step)
    for field in ("steps", "norms", "sums"):
        for value in (math.inf, math.nan):
            forged = {**cheat, field: [value] * hs.SKETCH_PARTS}
            assert hs.drift(a, forged) == math.inf and hs.drift(forged, b) == math.inf, (field, value)
            # "1" sorts before both honest ids: counted as agreeing with everyone, it was named the reference.
            assert hs.final_reference("12D3KooWA", a, {"12D3KooWB": b, "1": forged}) == "12D3KooWA"
            assert hs.final_reference("12D3KooWB", b, {"12D3KooWA": a, "1": forged}) == "12D3KooWA"
    assert hs.drift(a, b) < 1.0


def test_a_groupmates_gathered_version_counts_only_as_a_plain_int() -> None:
    honest = {"version": 3, "tokens": 640, "norm": 0.5}
    for sent in (None, "three", [3], math.inf, math.nan, 3.0, True, -1, hs.MAX_VERSION, 2**64):
        assert hs.Averaged([], [honest, {"version": sent}], 0.0).group_version == 3, sent
    assert hs.Averaged([], [honest, {"version": 7}], 0.0).group_version == 7
    assert hs.Averaged([], [{"tokens": 1}], 0.0).group_version == -1


def test_declared_state_priorities_count_only_as_finite_versions() -> None:
    declared = {b"mine": 9.0, b"honest": 3.0, b"inf": math.inf, b"nan": math.nan, b"huge": 1e300, b"neg": -5.0,
                b"text": "x", b"loading": None}
    peer = types.SimpleNamespace(dht=_FakeDHT(_found(declared)), run="hm", prefix=hs.averager_prefix("hm"),
                                 averager=types.SimpleNamespace(peer_id=types.SimpleNamespace(to_bytes=lambda: b"mine")))
    peer.declared_versions = lambda: hs.HivemindPeer.declared_versions(peer)
    assert sorted(peer.declared_versions(), key=str) == [3.0] + [None] * 6
    assert hs.HivemindPeer.newest_declared_version(peer) == 3


def _raised_within(seconds: float, call: Callable[[], Any]) -> BaseException | None:
    """What `call()` raised on a daemon thread, asserting it ended within `seconds` (a hang fails, not blocks)."""
    raised: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            raised.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert raised, f"still waiting after {seconds} s"
    return raised[0]


def test_a_dht_call_ends_with_peer_died_when_the_process_is_gone_or_silent() -> None:
    never = concurrent.futures.Future()
    error = _raised_within(5.0, lambda: hs.read_records(_FakeDHT(future=never, alive=False), hs.DIGEST_KEY, "hm"))
    assert isinstance(error, hs.PeerDied) and "DHT process (pid 4242) exited with code -9 during a get" in str(error)
    error = _raised_within(5.0, lambda: hs.store_record(_FakeDHT(future=never, alive=False), "p", hs.DIGEST_KEY, {}, 5))
    assert isinstance(error, hs.PeerDied) and "exited with code -9 during a store" in str(error)
    with pytest.raises(hs.PeerDied, match="did not answer a get within 0.3 s"):
        hs.dht_result(_FakeDHT(future=never), "get", never, timeout_s=0.3)
    failed = concurrent.futures.Future()
    failed.set_exception(TimeoutError("the DHT's own timeout"))
    with pytest.raises(TimeoutError, match="the DHT's own timeout"):
        hs.dht_result(_FakeDHT(future=failed), "get", failed)


def test_a_killed_dht_process_ends_a_read_with_peer_died(no_new_p2pd: None) -> None:
    dht = hs.start_dht(hs.HivemindOptions.loopback())
    try:
        os.kill(dht.pid, signal.SIGKILL)
        dht.join(timeout=10)
        error = _raised_within(10.0, lambda: hs.read_records(dht, hs.DIGEST_KEY, "hm"))
        assert isinstance(error, hs.PeerDied) and "exited with code -9" in str(error)
    finally:
        dht.shutdown()


def test_a_dht_that_never_says_it_is_ready_is_given_up(no_new_p2pd: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # The lock a SIGKILLed hivemind process can leave held: the new DHT process cannot send its "ready" (CI waited
    # for it until its 90 minutes ran out).
    monkeypatch.setattr(hs, "DHT_START_S", 3.0)
    held = MPFuture._update_lock
    held.acquire()
    try:
        error = _raised_within(60.0, lambda: hs.start_dht(hs.HivemindOptions.loopback()))
    finally:
        held.release()
    assert isinstance(error, hs.PeerDied) and "was not ready within 3 s" in str(error), error


def test_a_blocking_call_into_a_stopped_dht_process_ends(no_new_p2pd: None, monkeypatch: pytest.MonkeyPatch) -> None:
    dht = hs.start_dht(hs.HivemindOptions.loopback())
    monkeypatch.setattr(hs, "DHT_ANSWER_S", 2.0)
    try:
        os.kill(dht.pid, signal.SIGSTOP)
        error = _raised_within(30.0, lambda: hs.visible_maddrs(dht))
        assert isinstance(error, hs.PeerDied), error
        assert "did not answer a get visible maddrs within 2 s" in str(error)
    finally:
        os.kill(dht.pid, signal.SIGCONT)
        dht.shutdown()


def test_a_client_mode_peer_goes_on_past_its_first_version(no_new_p2pd: None) -> None:
    boot = hs.start_dht(hs.HivemindOptions.loopback())
    peer = None
    try:
        options = hs.HivemindOptions.loopback(hs.visible_maddrs(boot), client_mode=True)
        peer = hs.HivemindPeer("hm", [(8,)], "fp32", 256, options, lambda: ({"run": "hm", "version": 0}, []))
        for version, shareable in ((0, True), (1, True), (2, False), (2.5, True)):
            peer.set_state_version(version, shareable)
        assert not peer.averager.allow_state_sharing and peer.averager.state_sharing_priority == 0.0
    finally:
        if peer is not None:
            peer.shutdown()
        boot.shutdown()


def test_a_downloaded_state_needs_a_version_in_range() -> None:
    """A donor's state metadata is msgpack from the wire: its version was taken as any int (2**63 made a newcomer
    finish the run at once with exit 0; -3 ended it with a traceback; True passed as 1) (review of the hivemind worker
    loop, 2026-11-28). Now only a version in [0, MAX_VERSION) is taken; the loader asks the next donor."""
    tensors = [torch.zeros(2), torch.zeros(2)]
    for version in (2**63, hs.MAX_VERSION, -3, True, 1.0):
        problem, state = hs._check_state(({"run": "hm", "version": version}, tensors), "hm", ["w"], [(2,)])
        assert state is None and "expected run 'hm' and a version" in problem, version
    assert hs._check_state(({"run": "hm", "version": 4}, tensors), "hm", ["w"], [(2,)])[1][0] == 4


def test_a_resync_never_moves_a_peer_back_to_an_older_version() -> None:
    """At version 3 a peer re-syncing ("behind: version 3 < 4", the peer at 4 since gone, its record outliving it)
    whose only donor served version 1 loaded it and trained old rounds again (review of the hivemind worker loop,
    2026-11-28); now a state behind this peer's version is refused and it trains on; one at its version or later is
    taken."""
    from rcswarm.worker.hivemind_worker import HivemindWorker

    adopted: list[int] = []
    for donors, expected in (((1,), 3), ((1, 3), 3), ((2, 5), 5)):
        worker = object.__new__(HivemindWorker)  # only what `_resync` reads and writes
        worker.name, worker.names, worker.shapes, worker.version = "w", ["w"], [(2,)], 3
        worker.spec = hivemind_spec(run={"rounds": 6})
        worker.options, worker.stop = hs.HivemindOptions.loopback(), threading.Event()
        worker.peer = ResyncDonors(*donors)
        worker._adopt = lambda tensors: adopted.append(int(tensors[0][0]))
        worker._resync("behind: version 3 < 4")
        assert worker.version == expected and worker.peer.declared[-1] == (expected, True), donors
    assert adopted == [3, 5]
