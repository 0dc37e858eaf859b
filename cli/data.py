"""`rcswarm data frames --repo PATH --out DIR [--rows 48 --cols 160 ...]`: git history -> frame dataset.

Bad arguments or values exit 2 with a message on stderr; a history that cannot be replayed exits 1.
"""

from __future__ import annotations

import argparse
import sys

from rcswarm.cli.usage import usage_error


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] != "frames":
        print("usage: rcswarm data frames --repo PATH --out DIR [--rows 48 --cols 160]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    p = argparse.ArgumentParser(prog="rcswarm data frames", description="Replay a git history as editor frames and actions.")
    p.add_argument("--repo", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rows", type=int, default=48)
    p.add_argument("--cols", type=int, default=160)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--block-frames", type=int, default=256)
    p.add_argument("--frames-per-shard", type=int, default=1 << 20)
    p.add_argument("--max-file-bytes", type=int, default=256 * 1024)
    p.add_argument("--max-commits", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--commit-messages", action="store_true", help="type each commit's subject after its edits")
    args = p.parse_args(argv[1:])
    from rcswarm.data.frames.git_editor import ReplayError
    from rcswarm.data.frames.git_frames import build_git_frames, print_summary

    try:
        summary = build_git_frames(
            args.repo, args.out, args.rows, args.cols, args.vocab_size, args.block_frames,
            args.frames_per_shard, args.max_file_bytes, args.max_commits, progress=not args.no_progress,
            commit_messages=args.commit_messages,
        )
    except ValueError as e:
        return usage_error("rcswarm data frames", str(e))
    except (ReplayError, RuntimeError) as e:
        print(f"rcswarm data frames: {e}", file=sys.stderr)
        return 1
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
