"""A synthetic git history of many small commits, as a `git fast-import` stream on stdout.

Each commit changes `counter.txt` (its line is the commit's number); every tenth also rewrites one of 50 notes
(`notes/note-K.txt`, a few lines naming the commit). Made in seconds for 100,000 commits, it is the history of
docs/PERFORMANCE.md, "Memory against the length of the history":

    git init -q h100000
    python benchmarks/make_history.py 100000 | git -C h100000 fast-import --done --quiet
    git -C h100000 reset -q --hard main

Commit dates advance one second per commit from a fixed start, so the same N always gives the same commits.
"""

from __future__ import annotations

import argparse
import sys
from typing import BinaryIO

START_EPOCH_S = 1_700_000_000
NOTES = 50


def _data(out: BinaryIO, text: str) -> None:
    payload = text.encode()
    out.write(b"data %d\n%s\n" % (len(payload), payload))


def write_history(out: BinaryIO, commits: int, branch: str = "main") -> None:
    """`commits` commits on `branch`, each a child of the one before, then `done`."""
    for index in range(commits):
        out.write(b"commit refs/heads/%s\n" % branch.encode())
        out.write(b"committer Bench <bench@example.com> %d +0000\n" % (START_EPOCH_S + index))
        _data(out, f"commit {index}")
        _files(out, index)
        out.write(b"\n")
    out.write(b"done\n")


def _files(out: BinaryIO, index: int) -> None:
    out.write(b"M 100644 inline counter.txt\n")
    _data(out, f"{index}\n")
    if index % 10 == 0:
        note = (index // 10) % NOTES
        out.write(b"M 100644 inline notes/note-%d.txt\n" % note)
        _data(out, "".join(f"note {note}, commit {index}, line {line}\n" for line in range(3)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commits", type=int, help="how many commits (>= 1)")
    parser.add_argument("--branch", default="main")
    args = parser.parse_args(argv)
    if args.commits < 1:
        parser.error(f"commits {args.commits}: expected >= 1")
    write_history(sys.stdout.buffer, args.commits, args.branch)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
