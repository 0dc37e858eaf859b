"""`rcswarm data frames --repo [NAME=]PATH ... --out DIR [--held-out NAME] [--rows 48 --cols 160 ...]`.

Git histories -> one frame dataset. `--repo` may be given several times (the name defaults to the
directory's); `--held-out NAME` puts that history into the held-out split. Bad arguments or values
(a count flag outside its bounds: `FLAG_BOUNDS`) exit 2 with a message on stderr naming the flag and
the value; a history that cannot be replayed exits 1. An `--out` that already holds a dataset (a `manifest.json`) is
replaced only with `--overwrite` (exit 2 naming the directory otherwise; the replacement is published whole, the old
dataset readable until then). SIGTERM during the build exits 143 (SystemExit), so the
build still removes its staging folder and releases its lock.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rcswarm.cli.usage import empty_path_problem, new_parser, output_dir_problem, parse_or_status, usage_error


def parser() -> argparse.ArgumentParser:
    p = new_parser("rcswarm data frames", "Replay a git history as editor frames and actions.")
    p.add_argument("--repo", required=True, action="append",
                   help="[NAME=]PATH of a git repository (a clone, or a bare git directory); repeat for several "
                        "histories in one dataset (NAME defaults to the directory's name)")
    p.add_argument("--held-out", action="append", default=[], metavar="NAME",
                   help="hold this history out (split 'val': not trained on, not seen by the tokenizer); repeatable")
    p.add_argument("--out", required=True, help="directory to write the frame dataset into")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the dataset --out already holds (without it such a directory is refused)")
    p.add_argument("--rows", type=int, default=48, help="editor screen height in text rows")
    p.add_argument("--cols", type=int, default=160, help="editor screen width in characters")
    p.add_argument("--vocab-size", type=int, default=4096, help="size of the frame tokenizer's vocabulary")
    p.add_argument("--block-frames", type=int, default=256, help="frames per stored block (the unit a reader seeks to)")
    p.add_argument("--frames-per-shard", type=int, default=1 << 20, help="frames per shard file")
    p.add_argument("--max-file-bytes", type=int, default=256 * 1024, help="skip files larger than this many bytes")
    p.add_argument("--max-commits", type=int, default=None, help="replay at most this many commits (default: all)")
    p.add_argument("--no-progress", action="store_true",
                   help="do not show the progress bars (replay, tokenizer training, shard encoding)")
    p.add_argument("--commit-messages", action="store_true", help="type each commit's subject after its edits")
    return p


# The least and the most value of each count flag (`--max-commits` may also be left out: every commit): rows, cols
# and block frames are u16 fields of the frame header (the least rows and cols: git_editor's MIN_ROWS, MIN_COLS, the
# smallest screen the editor lays out), token ids uint32, the rest int64 counts.
INT64_MAX = (1 << 63) - 1
FLAG_BOUNDS = {"--rows": (3, 0xFFFF), "--cols": (24, 0xFFFF), "--vocab-size": (256, 1 << 32),
               "--block-frames": (1, 0xFFFF), "--frames-per-shard": (1, INT64_MAX), "--max-file-bytes": (0, INT64_MAX),
               "--max-commits": (1, INT64_MAX)}
FLAG_MINIMUMS = {flag: least for flag, (least, _) in FLAG_BOUNDS.items()}


def flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with a count flag's value, naming the flag and the value; None when nothing is."""
    for flag, (least, most) in FLAG_BOUNDS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and flag in ("--rows", "--cols") and not least <= value <= most:
            return f"{flag} {value}: expected an integer in {least}..{most}"
        if value is not None and value < least:
            return f"{flag} {value}: expected an integer >= {least}"
        if value is not None and value > most:
            return f"{flag} {value}: expected an integer <= {most}"
    for text in args.repo:
        problem = empty_path_problem("--repo", text.partition("=")[2] if "=" in text else text)
        if problem is not None:
            return problem
    return output_dir_problem("--out", args.out) or existing_dataset_problem(Path(args.out), args.overwrite)


def existing_dataset_problem(out: Path, overwrite: bool) -> str | None:
    """Why `out` may not be written: it holds a dataset (a `manifest.json`) and `--overwrite` was not given."""
    if overwrite or not (out / "manifest.json").exists():
        return None
    return (f"--out {str(out)!r} already holds a dataset ({out / 'manifest.json'}): expected a new or empty "
            "directory; pass --overwrite to replace it")


def repo_inputs(repos: list[str], held_out: list[str]) -> list:
    """`RepoInput`s of `--repo [NAME=]PATH` values and `--held-out NAME`s; ValueError naming what does not fit."""
    from rcswarm.data.frames.git_frames import RepoInput, repo_name

    inputs = []
    for text in repos:
        name, sep, path = text.partition("=")
        if not sep:
            name, path = repo_name(text), text
        if not Path(path).is_dir():
            raise ValueError(f"--repo {text!r}: {path!r} is not a directory; expected a git repository")
        inputs.append(RepoInput(name, Path(path), held_out=name in held_out))
    unknown = sorted(set(held_out) - {r.name for r in inputs})
    if unknown:
        raise ValueError(f"--held-out {unknown}: expected names of --repo histories {[r.name for r in inputs]}")
    return inputs


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """Meanwhile SIGTERM raises SystemExit(143) (128 + 15) in the main thread instead of ending the process on the
    spot, so that `finally` blocks run (the build's staging folder is removed); the previous handler after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] != "frames":
        help_ = bool(argv) and argv[0] in ("-h", "--help")
        print("usage: rcswarm data frames --repo PATH --out DIR [--rows 48 --cols 160]  (rcswarm data frames --help)",
              file=sys.stdout if help_ else sys.stderr)
        return 0 if help_ else 2
    args = parse_or_status(parser(), argv[1:])
    if isinstance(args, int):
        return args
    problem = flag_problem(args)
    if problem:
        return usage_error("rcswarm data frames", problem)
    from rcswarm.data.frames.git_editor import ReplayError
    from rcswarm.data.frames.git_frames import build_git_dataset, print_summary

    try:
        with sigterm_exits():
            summary = build_git_dataset(
                repo_inputs(args.repo, args.held_out), args.out, args.rows, args.cols, args.vocab_size,
                args.block_frames, args.frames_per_shard, args.max_file_bytes, args.max_commits,
                progress=not args.no_progress, commit_messages=args.commit_messages,
            )
    except ValueError as e:
        return usage_error("rcswarm data frames", str(e))
    except (ReplayError, RuntimeError) as e:
        print(f"rcswarm data frames: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the dataset cannot be written (a full disk, /proc): one line, no traceback
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(args.out) else ""
        print(f"rcswarm data frames: cannot write the dataset to {str(args.out)!r}: {e.strerror or e}{where}",
              file=sys.stderr)
        return 1
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
