"""`rcswarm status` prints what peers name as text: a worker named "[/]" does not stop it with rich's MarkupError,
and a device "[link=...]...[/link]" is not turned into a terminal hyperlink."""

from __future__ import annotations

import io

from rich.console import Console

from rcswarm.cli import status as status_cli
from rcswarm.coordinator.sweep import open_group
from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.specs import tiny_spec

LINK = "[link=https://evil.example]click[/link]"


def test_peer_supplied_names_are_printed_as_text_not_markup(tmp_path):
    group = open_group(tiny_spec(), tmp_path)
    try:
        closer = group.join(pb.JoinRequest(worker_name="[/]", device="[bold]cpu"))
        linked = group.join(pb.JoinRequest(worker_name=LINK, device=LINK))
        group.leave(pb.LeaveRequest(worker_id=closer.worker_id, worker_secret=closer.worker_secret, reason="[/]"))
        status = group.status()
    finally:
        group.close()
    printed = io.StringIO()
    status_cli.report(status, Console(file=printed, width=200, force_terminal=True), totals={})
    text = printed.getvalue()
    assert "\x1b]8;" not in text, "a worker's name became a terminal hyperlink"
    plain = io.StringIO()
    status_cli.report(status, Console(file=plain, width=400), totals={})
    shown = plain.getvalue()
    # The names (a long one folds in its column), the devices and the reason a membership ended, as given.
    assert "│ [/]  " in shown and "left: [/]" in shown and "[bold]cpu" in shown, shown
    assert f"│ {LINK} │" in shown and linked.worker_id in shown, shown
