"""`SharedLock`, which wraps the locks hivemind's processes share, records its holder (pid and start time) in shared
memory, and a waiter that finds the lock held past ORPHANED_LOCK_S gives up (OrphanedLock) only when that holder has
exited: a slow live holder is waited for, whatever other hivemind process exited (one process running several peers),
and a holder that died is found whoever started it and whether or not it was forgotten (`forget_started`). Where no
holder is recorded (one killed between taking the lock and writing itself) the guess from before holders were
recorded stands: a hivemind process this process started has exited. Real processes, forked as hivemind forks its
own."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from rcswarm.worker import hivemind_sync as hs
from tests.helpers.hivemind import P2PD_TAG_ENV, p2pd_pids
from tests.helpers.waiting import in_thread, wait_for

pytest.importorskip("hivemind")

from hivemind.utils import MPFuture, get_dht_time  # noqa: E402

FORK = multiprocessing.get_context("fork")
SLOW_S = 2.5 * hs.ORPHANED_LOCK_S  # a slow holder: past the first look at it
BOUND_S = 15.0  # a wait that ran this long hangs (the test fails, it does not hang)


@pytest.fixture(autouse=True)
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str, Any]]:
    """This test's own list of started hivemind processes (none of the suite's earlier peers)."""
    noted: list[tuple[int, str, Any]] = []
    monkeypatch.setattr(hs, "_STARTED", noted)
    return noted


def hold(lock: hs.SharedLock, taken: Any, seconds: float) -> None:
    """In a child: hold `lock` for `seconds`, as a slow holder."""
    with lock:
        taken.set()
        time.sleep(seconds)


def die_holding(lock: hs.SharedLock, taken: Any) -> None:
    """In a child: take `lock`, then die of SIGKILL holding it."""
    with lock:
        taken.set()
        os.kill(os.getpid(), signal.SIGKILL)


def hold_unrecorded(lock: hs.SharedLock, taken: Any, seconds: float | None) -> None:
    """In a child: take the lock under `lock` without recording itself (as one stopped between the two), hold it
    `seconds`, release it; None: die of SIGKILL holding it."""
    lock.lock.acquire()
    taken.set()
    if seconds is None:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(seconds)
    lock.lock.release()


def child(target: Callable[..., None], lock: Any, *rest: Any) -> Any:
    """A forked child running `target(lock, taken, *rest)`, once it has set `taken` (it holds the lock)."""
    taken = FORK.Event()
    process = FORK.Process(target=target, args=(lock, taken, *rest), daemon=True)
    process.start()
    assert taken.wait(30), "the child did not take the lock"
    return process


def an_exited_hivemind_process() -> Any:
    """A process noted as a hivemind process this one started, which has exited (another peer's dead DHT)."""
    process = FORK.Process(target=int)
    process.start()
    process.join()
    hs.note_started("DHT", process)
    return process


def wait_for_lock(lock: Any, bound_s: float = BOUND_S) -> tuple[float, BaseException | None]:
    """(seconds, error) of `with lock` on another thread, which must end within `bound_s`."""
    outcome: dict[str, Any] = {}

    def take() -> None:
        started = time.monotonic()
        try:
            with lock:
                pass
        except BaseException as exc:  # noqa: BLE001 - the outcome the test checks
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    thread = in_thread(take)
    thread.join(bound_s)
    assert not thread.is_alive(), f"the wait for the lock still ran after {bound_s:g} s"
    return outcome["seconds"], outcome.get("error")


def zombie(pid: int) -> bool:
    """Whether process `pid` has exited and is not yet reaped (its state in /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_slow_live_holder_is_waited_for_though_another_hivemind_process_exited() -> None:
    """Before: any exited hivemind process of this one's made a lock held past ORPHANED_LOCK_S orphaned, a live
    holder's too (OrphanedLock after 1 s)."""
    an_exited_hivemind_process()
    lock = hs.SharedLock(FORK.Lock())
    holder = child(hold, lock, SLOW_S)
    seconds, error = wait_for_lock(lock)
    assert error is None, f"gave up on a live holder after {seconds:.2f} s: {error!r}"
    assert seconds >= SLOW_S - 0.5
    holder.join(10)
    assert lock.holder.value == 0


@pytest.mark.parametrize("how", ["forgotten", "zombie", "not-started-here"])
def test_a_lock_whose_holder_died_holding_it_is_given_up_on(how: str) -> None:
    """`forgotten`: a hivemind process shut down the hard way (forgotten as it was shut down: it waited for ever,
    before); `zombie`: dead, not yet reaped (kill(pid, 0) still finds it); `not-started-here`: started by another
    process (the DHT's process waiting on a lock the averager died holding knew no started process)."""
    lock = hs.SharedLock(FORK.Lock())
    holder = child(die_holding, lock)
    if how == "forgotten":
        hs.note_started("DHT", holder)
        holder.join(10)
        hs.forget_started(holder)
    elif how == "zombie":
        wait_for(lambda: zombie(holder.pid), 10, "the holder dead, not reaped")
    else:
        holder.join(10)
    seconds, error = wait_for_lock(lock)
    assert isinstance(error, hs.OrphanedLock), f"{error!r} after {seconds:.2f} s"
    assert f"process {holder.pid} exited" in str(error)
    assert seconds < hs.ORPHANED_LOCK_S + 1.0
    again, error = wait_for_lock(lock)
    assert isinstance(error, hs.OrphanedLock) and again < 0.5, "a lock found orphaned is given up on at once after"


def test_a_holder_whose_pid_another_process_now_has_has_exited() -> None:
    """A holder is its pid and its start time: a process given a dead holder's pid since is not it."""
    me = hs.holder_identity()
    assert me & hs._PID_MASK == os.getpid()
    assert hs.holder_exited(me) == ""
    other_start = ((me >> hs.PID_BITS) + 1) << hs.PID_BITS | os.getpid()
    assert "its pid is another process's now" in hs.holder_exited(other_start)


@pytest.mark.parametrize("holder_exits", [True, False], ids=["holder-died", "holder-slow"])
def test_a_lock_held_with_no_holder_recorded_falls_back_on_exited_hivemind_processes(holder_exits: bool) -> None:
    """A holder killed between taking the lock and recording itself leaves no holder: the lock is given up on when a
    hivemind process this process started has exited (here the holder, noted as one), and waited for while none has."""
    lock = hs.SharedLock(FORK.Lock())
    holder = child(hold_unrecorded, lock, None if holder_exits else SLOW_S)
    if holder_exits:
        hs.note_started("averager", holder)
        wait_for(lambda: not holder.is_alive(), 10, "the holder's death")
    seconds, error = wait_for_lock(lock)
    if holder_exits:
        assert isinstance(error, hs.OrphanedLock), f"{error!r} after {seconds:.2f} s"
        assert "its hivemind averager process" in str(error) and seconds < hs.ORPHANED_LOCK_S + 1.0
    else:
        assert error is None and seconds >= SLOW_S - 0.5, f"{error!r} after {seconds:.2f} s"
    holder.join(10)


def test_every_way_of_taking_the_lock_records_its_holder_in_shared_memory() -> None:
    lock = hs.SharedLock(FORK.Lock())
    me = hs.holder_identity()
    for take in (lambda: lock.acquire(), lambda: lock.acquire(False), lambda: lock.acquire(True, 0.5),
                 lambda: lock.acquire(timeout=0.5)):
        assert take() is True
        assert lock.holder.value == me
        lock.release()
        assert lock.holder.value == 0
    with lock:
        assert lock.holder.value == me
    assert lock.holder.value == 0
    holder = child(hold, lock, SLOW_S)  # a forked child: its own identity, seen here through shared memory
    assert lock.holder.value & hs._PID_MASK == holder.pid and lock.holder.value != me
    assert lock.acquire(False) is False and lock.acquire(True, 0.1) is False
    assert lock.holder.value & hs._PID_MASK == holder.pid, "a failed acquire leaves the holder as it was"
    holder.join(10)
    assert lock.holder.value == 0


@pytest.mark.parametrize("take", ["with", "acquire", "acquire(False)", "acquire(timeout)"])
def test_a_holder_whose_identity_cannot_be_read_leaves_the_lock_free(monkeypatch: pytest.MonkeyPatch,
                                                                    take: str) -> None:
    """A process reads its identity (/proc/self/stat) at its first lock, which may fail (EMFILE in a process out of
    file descriptors): the error reaches the caller with the lock not taken. Before, the lock was taken first, and
    the error left it held for good, with no holder recorded (every waiter waited while that process lived)."""
    lock = hs.SharedLock(FORK.Lock())
    monkeypatch.setattr(hs, "_IDENTITY", 0)

    def unreadable() -> int:
        raise OSError(24, "Too many open files", "/proc/self/stat")

    monkeypatch.setattr(hs, "holder_identity", unreadable)
    calls = {"with": lambda: lock.__enter__(), "acquire": lambda: lock.acquire(),
             "acquire(False)": lambda: lock.acquire(False), "acquire(timeout)": lambda: lock.acquire(True, 0.5)}
    with pytest.raises(OSError, match="Too many open files"):
        calls[take]()
    assert lock.lock.acquire(False), "the failed take left the lock held"
    lock.lock.release()


def test_a_live_peer_is_waited_for_when_another_peer_of_the_process_died(no_new_p2pd: None) -> None:
    """One process running two peers' DHTs (as tests do): one DHT dies (SIGKILL; its p2pd is ended) while a live process
    holds hivemind's MPFuture update lock a moment. The other peer's calls wait for the lock and go on; before, the
    dead DHT made this process give up on the lock (OrphanedLock) after 1 s."""
    tag = os.environ[P2PD_TAG_ENV]
    dead = hs.start_dht(hs.HivemindOptions.loopback())
    dead_p2pd = p2pd_pids(tag)
    live = hs.start_dht(hs.HivemindOptions.loopback())
    holder = None
    try:
        os.kill(dead.pid, signal.SIGKILL)
        for pid in dead_p2pd:  # its p2pd as its SIGTERM handler would have (p2pd removes its socket file)
            os.kill(pid, signal.SIGTERM)
        dead.join(10)
        assert hs.exited_process(), "the dead DHT is one this process started"
        holder = child(hold, MPFuture._update_lock, SLOW_S)
        stored = live.store("probe", b"v", get_dht_time() + 60, return_future=True)
        seconds, error = wait_for_lock(MPFuture._update_lock)
        assert error is None, f"gave up on a live holder after {seconds:.2f} s: {error!r}"
        assert stored.result(timeout=30) is True
    finally:
        if holder is not None:
            holder.join(10)
        live.shutdown()
