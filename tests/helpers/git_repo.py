"""A small git repository with every kind of change the frame replay handles, made with the `git` command.

It starts `git` processes: the tests that use it live under tests/swarm/.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _commit(repo: Path, msg: str) -> None:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", msg)


def _init(repo: Path) -> Path:
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    _git(repo, "config", "core.autocrlf", "false")
    return repo


def make_second_repo(root: Path) -> Path:
    """Another, different history (a multi-repository dataset's second one): four commits of a growing Go file."""
    repo = _init(root / "other")
    for i in range(4):
        (repo / "main.go").write_text("package main\n\n" + "".join(f"func f{j}() int {{ return {j} }}\n"
                                                                    for j in range(i * 8)))
        _commit(repo, f"step {i}")
    return repo


def make_repo(root: Path) -> Path:
    repo = _init(root / "repo")
    w = lambda p, data: (repo / p).parent.mkdir(parents=True, exist_ok=True) or (repo / p).write_bytes(
        data if isinstance(data, bytes) else data.encode("utf-8")
    )
    w("README.md", "# demo\n\nHello world\n")
    w("src/main.py", "def main():\n    print('hi')\n")
    _commit(repo, "new files")
    w("src/main.py", "def main():\n    print('hello there')\n    return 0\n\nmain()\n")
    w("empty.txt", "")
    _commit(repo, "edit + empty file")
    _git(repo, "mv", "src/main.py", "src/app.py")
    w("src/app.py", "def main():\n    print('hello there!')\n    return 0\n\nmain()\n")
    _commit(repo, "rename with edit")
    w("crlf.txt", "line one\r\nline two\r\n")
    w("notrail.txt", "no trailing newline")
    w("long.txt", "".join(f"line {i}\n" for i in range(200)))
    w("wide.txt", "x" * 300 + "\n" + "\tindented\ttab\n" + "unicode: é ü 中文字 😀 done\n")
    w("bin.dat", bytes(range(256)) * 4)
    _commit(repo, "crlf, no trailing newline, long file, long line, tabs, unicode, binary")
    w("crlf.txt", "line one\r\nline 2 changed\r\nline three\r\n")
    w("notrail.txt", "no trailing newline\nnow two lines")
    lines = [f"line {i}\n" for i in range(200)]
    lines[150] = "changed far below\n"
    del lines[20:25]
    lines.insert(5, "inserted near the top\n")
    w("long.txt", "".join(lines))
    w("wide.txt", "x" * 150 + "Y" * 10 + "x" * 140 + "\n" + "\tindented\ttab changed\n" + "unicode: é ü 中文字字 😀 done")
    w("empty.txt", "now has text")
    _git(repo, "rm", "-q", "README.md")
    _commit(repo, "edits everywhere, delete")
    w("notrail.txt", "")
    w("long.txt", "short now\n")
    w("camelCase.py", "class HTTPServer:\n    def handleRequest_now(self, requestId):\n        return requestId\n")
    _commit(repo, "shrink")
    w("bin.dat", "binary became text\n")
    w("notrail.txt", b"text became \x00 binary")
    w("ünï/中文.txt", "unicode path\n")
    (repo / "link").symlink_to("camelCase.py")
    w("src/app.py", "def main():\n    return 1\n")
    _commit(repo, "type changes, unicode path, symlink")
    return repo
