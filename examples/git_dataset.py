"""Rebuild the git-frames dataset of docs/RESULTS.md (the CPU miniature, issue #32) from repository names.

    python examples/git_dataset.py --out runs/git-frames-5          # the default set, 8 x 24 frames, 300 tokens
    python examples/git_dataset.py --mirror MIRRORS_DIR --out runs/git-frames-5   # from local mirrors
    python examples/git_dataset.py psf/requests@v2.32.3 ./some/clone https://host/x.git --held-out x --out DIR

Each repository is `owner/name[@commit]` (cloned from https://github.com/owner/name, or from a local
mirror found under a `--mirror` directory as owner+name/repo, owner+name, owner/name, name.git or
name), a URL ending in the repository's name, or the path of a local clone, each optionally pinned
with `@commit`. Clones go to `--cache` (kept and reused: a pinned commit missing from a reused clone
is fetched from its source); a pinned commit is checked out detached, so the history replayed is the
first-parent line up to it. Then `rcswarm data frames` converts them all into one dataset (one
tokenizer, trained on the training histories only) with the `--held-out` histories as its held-out
split, and `sources.json` in the dataset records what was cloned from where at which commit.

Without repositories it builds the default set: five public histories of four languages and sizes
(C, Go, Python, Rust, Python), pinned to the commits docs/RESULTS.md's CPU miniature was built from, the last
held out.
Nothing fetched is committed to this repository; `--cache` and `--out` belong outside it or under a
git-ignored directory (the defaults are under runs/, which git ignores).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# (owner/name@commit, language); the held-out one last.
DEFAULT_REPOS = (
    ("antirez/kilo@323d93b29bd89a2cb446de90c4ed4fea1764176e", "C"),
    ("spf13/pflag@5fdac2d16c16d60605cb8baa887e8c5c38ef623f", "Go"),
    ("pallets/itsdangerous@672971d66a2ef9f85151e53283113f33d642dabd", "Python"),
    ("dtolnay/anyhow@1dbe1862aae650423e3361fbd20b7d17c5109cc3", "Rust"),
    ("pallets/markupsafe@1251593f6b0e3b45f2cc8aba662622bc22d6a5e2", "Python"),
)
DEFAULT_HELD_OUT = "markupsafe"


@dataclass(frozen=True)
class RepoSpec:
    """One repository to fetch: its dataset `name`, where to clone it from, the commit to pin (or "")."""

    name: str
    source: str
    commit: str = ""
    slug: str = ""  # owner/name when given that way (a mirror may hold it)


def parse_spec(text: str) -> RepoSpec:
    """`owner/name[@commit]`, a URL or a local path, each with an optional `@commit`; ValueError if malformed."""
    base, _, commit = text.rpartition("@") if "@" in text.split("/")[-1] else (text, "", "")
    if not base:
        raise ValueError(f"repository {text!r}: expected owner/name[@commit], a URL or a path")
    if commit and not all(c.isalnum() or c in "._-/" for c in commit):
        raise ValueError(f"repository {text!r}: commit {commit!r} is not a commit, tag or branch name")
    if "://" in base or base.startswith("git@"):
        name = base.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
        return RepoSpec(name, base, commit)
    path = Path(base).expanduser()
    if path.exists():
        return RepoSpec(path.resolve().name.removesuffix(".git"), str(path.resolve()), commit)
    owner, sep, name = base.partition("/")
    if not sep or not owner or not name or "/" in name:
        raise ValueError(f"repository {text!r}: no such path, and not owner/name")
    return RepoSpec(name, f"https://github.com/{owner}/{name}", commit, slug=base)


def mirror_of(spec: RepoSpec, mirrors: list[Path]) -> Path | None:
    """A local copy of an owner/name repository under one of `mirrors`, if any."""
    if not spec.slug:
        return None
    owner, name = spec.slug.split("/")
    for root in mirrors:
        for candidate in (root / f"{owner}+{name}" / "repo", root / f"{owner}+{name}", root / owner / name,
                          root / f"{name}.git", root / name):
            if (candidate / "HEAD").exists() or (candidate / ".git").exists():
                return candidate
    return None


def git(*args: str) -> str:
    proc = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def fetch(spec: RepoSpec, cache: Path, mirrors: list[Path]) -> tuple[Path, str, str]:
    """Clone (or reuse) `spec` under `cache` and check out its commit; (clone, source used, HEAD commit)."""
    source = str(mirror_of(spec, mirrors) or spec.source)
    clone = cache / spec.name
    if not (clone / ".git").exists():
        cache.mkdir(parents=True, exist_ok=True)
        git("clone", "--quiet", "--no-local", source, str(clone))
    if spec.commit:
        try:
            git("-C", str(clone), "rev-parse", "--verify", "--quiet", f"{spec.commit}^{{commit}}")
        except RuntimeError:
            git("-C", str(clone), "fetch", "--quiet", source, spec.commit)
        git("-C", str(clone), "checkout", "--quiet", "--detach", spec.commit)
    return clone, source, git("-C", str(clone), "rev-parse", "HEAD")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("repos", nargs="*", help="owner/name[@commit], URL[@commit] or PATH[@commit] (default: the set above)")
    p.add_argument("--held-out", action="append", default=None, metavar="NAME",
                   help=f"hold this history out (repeatable; default with the default set: {DEFAULT_HELD_OUT})")
    p.add_argument("--mirror", action="append", type=Path, default=[], help="directory of local mirrors (repeatable)")
    p.add_argument("--cache", type=Path, default=Path("runs/git-repos"),
                   help="where the clones go (default runs/git-repos)")
    p.add_argument("--out", type=Path, required=True, help="the dataset directory")
    p.add_argument("--rows", type=int, default=8, help="editor screen rows (default 8, the CPU sweep's)")
    p.add_argument("--cols", type=int, default=24, help="editor screen columns (default 24, the CPU sweep's)")
    p.add_argument("--vocab-size", type=int, default=300, help="action tokenizer vocabulary (default 300)")
    p.add_argument("--max-commits", type=int, default=None, help="replay at most this many commits of each history")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from rcswarm.data.frames.git_frames import RepoInput, build_git_dataset, print_summary

    try:
        specs = [parse_spec(text) for text in (args.repos or [text for text, _ in DEFAULT_REPOS])]
        held_out = args.held_out if args.held_out is not None else ([] if args.repos else [DEFAULT_HELD_OUT])
        names = [s.name for s in specs]
        if sorted(set(held_out) - set(names)):
            raise ValueError(f"--held-out {held_out}: expected names among {names}")
        fetched = [fetch(spec, args.cache, args.mirror) for spec in specs]
        inputs = [RepoInput(spec.name, clone, spec.name in held_out) for spec, (clone, _, _) in zip(specs, fetched)]
        summary = build_git_dataset(inputs, args.out, args.rows, args.cols, args.vocab_size,
                                    max_commits=args.max_commits, progress=not args.no_progress)
    except (ValueError, RuntimeError) as error:
        print(f"git_dataset: {error}", file=sys.stderr)
        return 2 if isinstance(error, ValueError) else 1
    sources = [{"name": spec.name, "requested": spec.source, "commit_requested": spec.commit, "cloned_from": source,
                "head": head, "held_out": spec.name in held_out} for spec, (_, source, head) in zip(specs, fetched)]
    (args.out / "sources.json").write_text(json.dumps(sources, indent=2))
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
