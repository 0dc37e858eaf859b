"""A restarted worker never sends an error-feedback residual twice (a review's reproduction): real workers in this
process, a real coordinator on loopback, `--state-dir` and the sparse codec.

The residual file was written only after a push was answered, and the last pusher of a round is answered only once
the round closed: a worker killed in that window (or whose save met a full disk) left the residual its landed push
had carried, and the restart sent it again. Now the file is written before the push, as the residual holds once the
push lands (`Worker._push_deltas`); a save that fails logs a WARNING, removes the file and the worker goes on."""

from __future__ import annotations

import errno
import logging
import threading

import pytest
import torch

from rcswarm.sync import feedback_state
from rcswarm.sync.feedback_state import FEEDBACK_FILE, load_feedback
from rcswarm.worker import Worker
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for
from tests.helpers.worker import _options, run_until

SPARSE = {"codec": "sparse", "sparse_chunk": 256, "density": 0.05, "value_bits": 2, "error_decay": 0.95}


class Killed(BaseException):
    """A SIGKILL, as far as the worker's loop can tell: nothing after it runs (no handler catches a BaseException)."""


class Restartable(Worker):
    """The real worker, counting the pushes that landed and keeping the residual it resumed at its join and the one
    its first push compressed with (`Encoded.saved`). With `kill_at` = k it dies (`Killed`) right after its k-th push
    landed, before anything else runs, keeping the residual after that push (`after_kill`) and the one that push
    carried (`carried`)."""

    def __init__(self, options, kill_at: int = 0) -> None:
        super().__init__(options, TOKEN)
        self.kill_at = kill_at
        self.landed = 0
        self.at_join: dict[str, torch.Tensor] | None = None
        self.first_compressed_with: dict[str, torch.Tensor] | None = None
        self.after_kill: dict[str, torch.Tensor] | None = None
        self.carried: dict[str, torch.Tensor] | None = None

    def _resume_feedback(self) -> None:
        super()._resume_feedback()
        self.at_join = self.error_feedback.snapshot()

    def _deliver(self, version, tokens, header, chunks, rejoin=True) -> bool:
        if self.first_compressed_with is None:
            self.first_compressed_with = self._encoded.saved
        delivered = super()._deliver(version, tokens, header, chunks, rejoin)
        if delivered:
            self.landed += 1
            if self.landed == self.kill_at:
                self.after_kill, self.carried = self.error_feedback.snapshot(), self._encoded.saved
                raise Killed(f"killed after the push of version {version} landed")
        return delivered


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _norm(tensors: dict[str, torch.Tensor]) -> float:
    return float(sum(torch.sum(t.double() ** 2) for t in tensors.values())) ** 0.5


def _run_until_killed(worker: Restartable, timeout: float) -> None:
    died: list[BaseException] = []

    def body() -> None:
        try:
            worker.run()
        except Killed as exc:
            died.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        wait_for(lambda: not thread.is_alive(), timeout, "the worker's kill")
    finally:
        worker.stop.set()
        thread.join(timeout=30)
    assert died, f"the worker was not killed (it landed {worker.landed} pushes)"


def test_a_worker_killed_after_its_push_landed_does_not_send_its_residual_again(start_coordinator, tmp_path,
                                                                                  caplog) -> None:
    caplog.set_level(logging.INFO, logger="rcswarm.worker")
    local = start_coordinator(tiny_spec(run={"rounds": 50}, inner={"steps": 2}, sync=SPARSE))
    state_dir = tmp_path / "worker"
    first = Restartable(_options(local.target, state_dir=state_dir), kill_at=3)
    _run_until_killed(first, 60)
    # The third push landed (it closed its round: this worker is the only one), and carried a residual.
    wait_for(lambda: local.service.version >= 3, 10, "round 3 to close")
    assert _norm(first.carried) > 0 and not _same(first.carried, first.after_kill)
    second = Restartable(_options(local.target, state_dir=state_dir))
    assert run_until(second, lambda w: w.landed >= 1, 60) == 0
    # The restart resumes the residual left once the landed push went, bit for bit, and compresses its first update
    # with it; not the one that push already carried (before the change: norm ≈ 2 rounds' updates, sent twice).
    resent = _same(second.at_join, first.carried)
    assert not resent, (f"the restart resumed the residual the landed push carried (norm {_norm(first.carried):.3g}; "
                        f"left after it: {_norm(first.after_kill):.3g})")
    assert _same(second.at_join, first.after_kill)
    assert _same(second.first_compressed_with, first.after_kill)
    assert "saved before its update from version 2 was answered" in caplog.text


@pytest.fixture
def disk(monkeypatch):
    """A disk that fills up: while `full` is set, the residual file's writes fail with ENOSPC."""
    state = {"full": False, "failed": 0}
    real = feedback_state.save_tensors

    def save_tensors(tensors, path, metadata=None):
        if state["full"]:
            state["failed"] += 1
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(tensors, path, metadata)

    monkeypatch.setattr(feedback_state, "save_tensors", save_tensors)
    return state


def test_a_full_disk_warns_removes_the_residual_file_and_the_worker_goes_on(start_coordinator, tmp_path, caplog,
                                                                              disk) -> None:
    caplog.set_level(logging.INFO, logger="rcswarm.worker")
    local = start_coordinator(tiny_spec(run={"rounds": 50}, inner={"steps": 2}, sync=SPARSE))
    state_dir = tmp_path / "worker"
    path = state_dir / FEEDBACK_FILE

    class FillsUp(Restartable):
        """The disk fills up once two pushes landed; keeps the residual the third push compressed with."""

        def _deliver(self, version, tokens, header, chunks, rejoin=True) -> bool:
            delivered = super()._deliver(version, tokens, header, chunks, rejoin)
            if delivered and self.landed == 2:
                disk["full"] = True
            return delivered

    first = FillsUp(_options(local.target, state_dir=state_dir))
    # The worker goes on past the full disk: pushes 3 and 4 land, their saves fail; a stop exits 0 (before: the
    # OSError ended `run` with a traceback and no Leave).
    assert run_until(first, lambda w: w.landed >= 4, 60) == 0
    assert disk["failed"] >= 2 and first.landed >= 4
    assert "could not be saved" in caplog.text and "No space left on device" in caplog.text
    assert "it is removed: a restart before the next save starts from zero" in caplog.text
    # No file is left that the landed pushes 3 and 4 carried: the restart starts from zero, not from push 2's residual.
    assert not path.exists()
    disk["full"] = False
    second = Restartable(_options(local.target, state_dir=state_dir))
    assert run_until(second, lambda w: w.landed >= 1, 60) == 0
    assert second.at_join == {} and second.first_compressed_with == {}
    assert f"error feedback starts from zero: no {FEEDBACK_FILE}" in caplog.text
    # With room again, the file is written again and holds the residual after its last landed push.
    saved, _ = load_feedback(state_dir, second.run_id, second.codec, 0.95, local.service.shapes)
    assert saved is not None and _same(saved, second.error_feedback.snapshot())


def test_a_refused_push_saves_the_residual_it_puts_back(start_coordinator, tmp_path) -> None:
    local = start_coordinator(tiny_spec(run={"rounds": 50}, inner={"steps": 2}, sync=SPARSE))
    state_dir = tmp_path / "worker"

    class RefusedThird(Restartable):
        """Its third update is refused as stale before it leaves (as the coordinator's FAILED_PRECONDITION is); the
        residual file is read right after."""

        refused: tuple | None = None

        def _push_deltas(self, version, deltas, tokens, send_bound, rejoin=True) -> bool:
            delivered = super()._push_deltas(version, deltas, tokens, send_bound, rejoin)
            if self.refused is None and not delivered:
                self.refused = (self.error_feedback.snapshot(), load_feedback(
                    state_dir, self.run_id, self.codec, 0.95, local.service.shapes))
            return delivered

        def _deliver(self, version, tokens, header, chunks, rejoin=True) -> bool:
            if self.landed == 2 and self.refused is None:
                return False
            return super()._deliver(version, tokens, header, chunks, rejoin)

    worker = RefusedThird(_options(local.target, state_dir=state_dir))
    assert run_until(worker, lambda w: w.refused is not None, 60) == 0
    restored, (saved, note) = worker.refused
    assert saved is not None and _same(saved, restored), "the file does not hold the residual put back"
    assert "was refused" in note
