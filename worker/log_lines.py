"""A worker's log lines: what another machine wrote (a coordinator's status details, an assignment's reason, a run
id; a hivemind peer's name) is printed as text on one line, never as a forged line or a terminal escape sequence.

`OneLineFormatter` writes each record's message through `protos.wire.printable`; a traceback that follows keeps
its lines. `log_to_stderr` is the logging setup of every process that runs a worker (`rcswarm worker`, a Ray
worker actor) or reads peers' records (`rcswarm dht`).
"""

from __future__ import annotations

import logging

from rcswarm.protos.wire import printable


class OneLineFormatter(logging.Formatter):
    """A Formatter whose records' messages have every non-printable character escaped (`printable`)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = printable(record.message)
        return super().formatMessage(record)


def log_to_stderr(role: str) -> None:
    """INFO and above to stderr as "<time> <role> <level> <message>", one line per message (`OneLineFormatter`);
    like `logging.basicConfig`, nothing when the root logger has handlers already."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(f"%(asctime)s {role} %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
