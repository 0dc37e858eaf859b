"""One coordinator per state dir: the lock, its holder's pid and address, and its release."""

from __future__ import annotations

import os

import pytest

from rcswarm.state.lock import LOCK_NAME, StateDirBusy, StateDirLock


def test_a_locked_state_dir_is_refused_naming_the_holder_until_it_is_released(tmp_path):
    held = StateDirLock.acquire(tmp_path / "state")
    with pytest.raises(StateDirBusy, match=rf"pid {os.getpid()} on .*, not serving yet"):
        StateDirLock.acquire(tmp_path / "state")
    held.announce("127.0.0.1:50123")
    with pytest.raises(StateDirBusy) as busy:
        StateDirLock.acquire(tmp_path / "state")
    assert str(busy.value).startswith(f"state dir {tmp_path / 'state'} is in use by another coordinator (pid ")
    assert "serving on 127.0.0.1:50123" in str(busy.value) and "another --state-dir" in str(busy.value)
    held.release()
    held.release()
    again = StateDirLock.acquire(tmp_path / "state")
    again.release()
    assert (tmp_path / "state" / LOCK_NAME).is_file()
