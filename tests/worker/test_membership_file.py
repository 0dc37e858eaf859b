"""The membership file (`--membership-file`, worker/membership.py): written private, read back, refused when
malformed, and the Leave of what it records against a real coordinator on loopback."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker.membership import Membership, end_membership, end_previous, read_membership, write_membership
from tests.helpers.specs import tiny_spec


def test_a_membership_file_is_private_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "membership.json"
    member = Membership("127.0.0.1:1", "run", "w1-abc", b"\x01" * 32, tiny_spec().to_json())
    write_membership(path, member)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_membership(path) == member
    assert "01" * 32 not in repr(member)
    assert [p.name for p in tmp_path.iterdir()] == ["membership.json"]  # no partial file left
    assert read_membership(tmp_path / "absent.json") is None


def test_a_malformed_membership_file_is_ignored_with_one_line(tmp_path: Path, caplog) -> None:
    path = tmp_path / "membership.json"
    for text in ("not json", '{"coordinator": "x"}', '{"coordinator": "x", "run_id": "r", "worker_id": "w", '
                 '"worker_secret": "zz", "run_spec_json": "{}"}'):
        path.write_text(text)
        with caplog.at_level(logging.WARNING, logger="rcswarm.worker"):
            assert read_membership(path) is None
    assert len(caplog.records) == 3 and all("ignored" in r.getMessage() for r in caplog.records)


def test_the_previous_membership_is_ended_at_its_coordinator_only(start_coordinator, tmp_path: Path) -> None:
    local = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"lease_s": 60.0}))
    client = local.client()
    joined = client.join("killed", "cpu", 1)
    member = Membership(local.target, joined.run_id, joined.worker_id, joined.worker_secret, joined.run_spec_json)
    assert "not ended" in end_membership(member, "127.0.0.1:1", None, 2.0)
    path = tmp_path / "membership.json"
    write_membership(path, member)
    assert end_previous(path, local.target, None, 5.0) == member
    assert not path.exists()
    states = {w.worker_id: w.state for w in client.status().workers}
    assert states[joined.worker_id] != pb.WORKER_STATE_ACTIVE
    # A second try (the membership already ended) is refused by the coordinator and said so, not raised.
    assert "was not ended: NOT_FOUND" in end_membership(member, local.target, None, 5.0)
    client.close()


def test_a_file_that_is_not_a_membership_is_never_written_over(tmp_path: Path) -> None:
    """`--membership-file` pointing at someone's file (a config, by mistake) once had it written over with the
    worker's secret and removed when the worker left; a directory failed at the leave with a traceback. Both are
    refused at the start, naming the path; a missing file or one a worker wrote is taken."""
    import pytest

    from rcswarm.worker import WorkerOptions

    config = tmp_path / "run.toml"
    config.write_text('[run]\nname = "mine"\n')
    for path, words in ((config, "exists and is not a membership file"), (tmp_path, "is a directory")):
        with pytest.raises(ValueError, match=words):
            WorkerOptions("127.0.0.1:50051", membership_file=path)
    assert config.read_text() == '[run]\nname = "mine"\n'
    WorkerOptions("127.0.0.1:50051", membership_file=tmp_path / "new.json")
    written = tmp_path / "w.json"
    write_membership(written, Membership("127.0.0.1:50051", "run", "w1", b"s" * 32, "{}"))
    WorkerOptions("127.0.0.1:50051", membership_file=written)
    with pytest.raises(ValueError, match="--state-dir .*: is a file; expected a directory"):
        WorkerOptions("127.0.0.1:50051", state_dir=config)


def test_a_membership_file_that_cannot_be_written_on_a_rejoin_is_a_warning(start_coordinator, tmp_path: Path,
                                                                            caplog) -> None:
    """The worker's own test (a subclass of the real worker against a real coordinator on loopback): the file's
    directory goes away (a full disk or a removed volume does the same) and the worker is evicted, so its re-join writes
    the file again. That ended the worker with an uncaught FileNotFoundError (review of the worker client,
    2026-11-28); now one WARNING and it trains on to the end."""
    import shutil

    from rcswarm.worker import Worker, WorkerOptions
    from tests.helpers.specs import TOKEN

    class EvictedOnce(Worker):
        evicted = False

        def _push_deltas(self, *args, **kwargs):
            if not self.evicted:
                self.evicted = True
                shutil.rmtree(self.options.membership_file.parent)
                self.client.leave(self.identity, "evicted by the test")  # the push meets NOT_FOUND: join again
            return super()._push_deltas(*args, **kwargs)

    local = start_coordinator(tiny_spec(run={"rounds": 3, "workers": 1}, inner={"steps": 2}))
    (tmp_path / "m").mkdir()
    worker = EvictedOnce(WorkerOptions(coordinator=local.target, device="cpu", name="solo",
                                       membership_file=tmp_path / "m" / "membership.json"), TOKEN)
    with caplog.at_level(logging.WARNING, logger="rcswarm"):
        assert worker.run() == 0
    assert local.service.version == 3
    assert any("could not be written" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
