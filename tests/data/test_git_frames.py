"""Git histories replayed as editor frames: replay invariant, frame format, tokenizer, loader, CLI.

A few tests make repositories with `git` (the replay's own `Git`, which the rest of tests/swarm/test_git_frames.py
exercises): a repository's configuration that changes what `git log` prints, a training history that merged the
held-out one (or the reverse), a history without a text file.
"""

from __future__ import annotations

import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from rcswarm.data.frames.action_tokenizer import (
    ActionTokenizer,
    actions_to_text,
    encode_stream,
    text_to_actions,
)
from rcswarm.data.frames.frame_codec import FrameFormatError, FrameReader, FrameWriter
from rcswarm.data.frames.git_editor import CONTROL_BASE, C, Editor
from rcswarm.data.frames.git_replay import Git, Planner, replay
from tests.helpers.data import COLS, ROWS

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")

def test_editor_wide_chars_tabs_and_scrolling():
    ed = Editor(ROWS, COLS)
    p = Planner(ed, lambda *a: None)
    p.new_file("a.txt")
    p.type("\t中x\n" + "\n".join(str(i) for i in range(40)) + "\n" + "y" * 200)
    cp, st = ed.render()
    assert ed.top > 0 and ed.left > 0  # scrolled down and right to keep the cursor visible
    assert (st == 2).sum() == 1  # exactly one cursor cell
    p.goto(0, 2)
    cp, st = ed.render()
    row = cp[0].tolist()
    i = row.index(ord("中"))
    assert row[i + 1] == 0 and row[i + 2] == ord("x")  # wide char takes two cells
    assert st[0, i + 2] == 2  # cursor after the wide character
    assert ed.text().startswith("\t中x\n0\n1\n")


def _random_frames(n, rows=6, cols=20, seed=0):
    rng = np.random.default_rng(seed)
    cp = np.full((rows, cols), 32, np.int32)
    st = np.zeros((rows, cols), np.uint8)
    out = []
    for _ in range(n):
        k = rng.integers(0, 6)
        for _ in range(k):
            y, x = rng.integers(0, rows), rng.integers(0, cols)
            w = int(rng.integers(1, cols - x + 1))
            cp[y, x : x + w] = rng.choice([32, 97, 0x4E2D, 0x1F600, 0x10FFFF, 0])
            st[y, x : x + w] = rng.integers(0, 9)
        out.append((cp.copy(), st.copy(), int(rng.integers(0, CONTROL_BASE + 19))))
    return out


def test_codec_bit_exact_and_random_access(tmp_path):
    frames = _random_frames(300)
    path = tmp_path / "x.rcf"
    with FrameWriter(path, 6, 20, block_frames=16) as w:
        for cp, st, a in frames:
            w.write(cp, st, a)
    with FrameReader(path) as r:
        assert len(r) == 300
        seq = [r.frame(i) for i in range(300)]
        for i, (cp, st, a) in enumerate(frames):
            assert np.array_equal(seq[i][..., 0], cp) and np.array_equal(seq[i][..., 1], st)
            assert r.action(i) == a
    rng = np.random.default_rng(1)
    with FrameReader(path, cache_blocks=1) as r:
        for i in rng.permutation(300)[:60].tolist():
            assert np.array_equal(r.frame(i), seq[i])
    with FrameReader(path, cache_blocks=0) as r:
        for i in rng.permutation(300)[:20].tolist():
            assert np.array_equal(r.frame(i), seq[i])


def test_codec_corruption_and_truncation(tmp_path):
    path = tmp_path / "x.rcf"
    with FrameWriter(path, 6, 20, block_frames=16) as w:
        for cp, st, a in _random_frames(100):
            w.write(cp, st, a)
    data = path.read_bytes()
    (tmp_path / "t.rcf").write_bytes(data[: len(data) - 7])
    with pytest.raises(FrameFormatError, match="truncated"):
        FrameReader(tmp_path / "t.rcf")
    (tmp_path / "t0.rcf").write_bytes(data[:10])
    with pytest.raises(FrameFormatError):
        FrameReader(tmp_path / "t0.rcf")
    bad = bytearray(data)
    bad[200] ^= 0x10  # inside block 0's compressed data
    (tmp_path / "c.rcf").write_bytes(bytes(bad))
    r = FrameReader(tmp_path / "c.rcf")
    with pytest.raises(FrameFormatError, match="corrupted"):
        r.frame(3)
    assert r.frame(50) is not None  # other blocks still decode
    bad = bytearray(data)
    bad[-30] ^= 0x01  # index
    (tmp_path / "i.rcf").write_bytes(bytes(bad))
    with pytest.raises(FrameFormatError, match="corrupted"):
        FrameReader(tmp_path / "i.rcf")


def test_tokenizer_round_trip_and_case_split():
    text = "class HTTPServer:\n    def handleRequest_now(self, requestId): 中文 😀\r\n"
    actions = [ord(c) for c in text] + [C["SAVE"], C["UP"]] + [ord(c) for c in text]
    tok = ActionTokenizer.train([actions_to_text(actions)] * 20, vocab_size=300)
    ids, starts = tok.encode(actions)
    assert tok.decode(ids) == actions
    assert text_to_actions(actions_to_text(actions)) == actions
    pieces = [p for p, _ in tok.tk.pre_tokenizer.pre_tokenize_str("parseHTTPResponse_codeValue")]
    assert pieces == ["parse", "HTTP", "Response", "_", "code", "Value"]
    unseen = [ord(c) for c in "ünseen ЖЖ text 🎉"] + [C["GOTO"]]
    assert tok.decode(tok.encode(unseen)[0]) == unseen
    assert starts[0] == 0 and starts == sorted(starts)


def test_chunked_stream_encoding_round_trips():
    text = ("fooBar_baz\n" * 3000) + "end"
    actions = np.array([ord(c) for c in text] + [C["SAVE"]], np.int64)
    tok = ActionTokenizer.train([actions_to_text(actions.tolist())], vocab_size=280)
    ids, starts = encode_stream(tok, actions)
    assert tok.decode(ids.tolist()) == actions.tolist()
    assert starts[0] == 0 and np.all(np.diff(starts) >= 0) and starts[-1] < len(actions)


def test_tree_navigation_with_more_files_than_rows():
    ed = Editor(ROWS, COLS)
    seen: list[int] = []
    p = Planner(ed, lambda cp, st, a: seen.append(a))
    names = [f"dir{i % 3}/file{i:02d}.txt" for i in range(40)]
    for name in names:
        p.new_file(name)
        p.type(f"{name}\r\n")
        p.do(C["SAVE"])
    order = sorted(names)
    for name in (order[0], order[39], order[7], order[25]):
        p.open(name)
        assert ed.current == name and ed.mode == "EDIT"
        cp, st = ed.render()
        row = int(np.flatnonzero((st[:, : ed.tw] == 5).any(axis=1))[0])  # the open file is highlighted
        text = "".join(chr(c) for c in cp[row, : ed.tw]).rstrip()
        assert text == name[: ed.tw]
        assert "".join(chr(c) for c in cp[0, ed.tw + 1 :]).rstrip().endswith("txt\u240d")  # CR shown as a symbol
    assert C["PGDN"] in seen and C["PGUP"] in seen
    assert ed.files[names[3]] == names[3] + "\r\n"


# -- incremental rendering, the row-delta fast path, format version 2 ------------------------

def _reference_screen(ed: Editor) -> np.ndarray:
    """A from-scratch render of the editor's state (the documented layout), cell by cell.

    Uses the view offsets (top, left, tree_top) the editor's last render chose.
    """
    from rcswarm.data.frames.git_editor import line_cells

    rows, cols, tw = ed.rows, ed.cols, ed.tw
    h = rows - 1
    cp = np.full((rows, cols), 32, np.int64)
    st = np.zeros((rows, cols), np.int64)

    def put(y, x0, width, cells, fill=0):
        cells = cells[:width]
        for k, (c, s) in enumerate(cells):
            cp[y, x0 + k], st[y, x0 + k] = c, s
        cp[y, x0 + len(cells) : x0 + width] = 32
        st[y, x0 + len(cells) : x0 + width] = fill

    n = len(ed.paths)
    cur_idx = ed.paths.index(ed.current) if ed.current is not None else -1
    tree_mode = ed.mode == "TREE" or (ed.mode == "PROMPT" and ed.prompt_kind in ("new_file", "rename"))
    for y in range(h):
        i = ed.tree_top + y
        path = ed.paths[i] if i < n else None
        style = 6 if (i == ed.sel and tree_mode) else 5 if i == cur_idx else 4
        cells = [(c, style if s == 1 else s) for c, s in line_cells(path)[0]] if path else []
        put(y, 0, tw, cells, 0 if path is None else style)
        cp[y, tw], st[y, tw] = 0x2502, 4
    x0 = tw + 1
    gw = max(4, len(str(len(ed.lines)))) + 1
    w = cols - x0 - gw
    dcol = line_cells(ed.lines[ed.r])[1][ed.c]
    for y in range(h):
        i = ed.top + y
        if ed.current is None or i >= len(ed.lines):
            put(y, x0, cols - x0, [])
            continue
        put(y, x0, gw, [(ord(ch), 7) for ch in str(i + 1).rjust(gw - 1) + " "])
        cells = line_cells(ed.lines[i])[0][ed.left : ed.left + w]
        if cells and cells[0][0] == 0:
            cells[0] = (32, 8)
        if len(cells) == w and cells[-1][1] == 1 and cells[-1][0] > 0x1000 and unicodedata.east_asian_width(chr(cells[-1][0])) in "WF":
            cells[-1] = (32, 8)
        put(y, x0 + gw, w, cells)
        if ed.mode == "EDIT" and i == ed.r and 0 <= dcol - ed.left < w:
            st[y, x0 + gw + dcol - ed.left] = 2
    if ed.mode == "PROMPT":
        label = {"goto": "line: ", "new_file": "new file: ", "rename": "rename to: ", "commit": "commit: "}[ed.prompt_kind]
        cells = [(c, 3 if s == 1 else s) for c, s in line_cells(label + ed.prompt)[0]]
        cells = (cells[-(cols - 1) :] if len(cells) >= cols else cells) + [(32, 2)]
    else:
        text = f" {ed.mode} | {ed.current or '[no file]'} | Ln {ed.r + 1}, Col {ed.c + 1} | {len(ed.lines)} lines "
        cells = [(c, 3 if s == 1 else s) for c, s in line_cells(text)[0]]
    put(rows - 1, 0, cols, cells, 3)
    return np.stack([cp, st], -1)


_TYPED = list("abcxyz  ()_.:=\t\n\n\r中é😀") + ["\x07"]


def _random_session(seed: int, n: int, rows: int = 9, cols: int = 40):
    """An editor driven by n random actions (typing, every control, several files)."""
    rng = np.random.default_rng(seed)
    ed = Editor(rows, cols)
    for k in range(12):
        ed._add(f"d{k % 3}/f{k}.txt", "\n".join("x" * int(rng.integers(0, 70)) + "中\t" * (j % 3) for j in range(int(rng.integers(0, 30)))))
    ed._open(ed.paths[0])
    actions = []
    for _ in range(n):
        u = rng.random()
        if u < 0.55:
            a = ord(_TYPED[int(rng.integers(0, len(_TYPED)))])
        else:
            name = ("UP", "DOWN", "LEFT", "RIGHT", "HOME", "END", "BACKSPACE", "DELETE", "KILL_LINE", "SAVE", "TREE",
                    "ENTER", "NEW_FILE", "RENAME", "DELETE_FILE", "GOTO", "PGUP", "PGDN", "ESC", "COMMIT")[int(rng.integers(0, 20))]
            if name in ("DELETE_FILE", "RENAME", "NEW_FILE") and rng.random() < 0.8:
                name = "ESC"  # keep files around
            a = C[name]
        actions.append(a)
    return ed, actions


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_render_equals_full_render(seed):
    """After every action the incrementally maintained screen equals a from-scratch render,
    and rows outside the reported damage are unchanged (what the frame encoder relies on)."""
    ed, actions = _random_session(seed, 2500)
    prev = None
    scrolls = line_moves = 0
    for a in actions:
        damage, scroll = ed.render_damage()
        cp, st = ed.screen()
        cur = np.stack([cp.astype(np.int64), st.astype(np.int64)], -1)
        assert np.array_equal(cur, _reference_screen(ed)), (seed, a)
        if prev is not None:
            changed = set(np.flatnonzero((cur != prev).any(axis=(1, 2))).tolist())
            assert changed <= damage, (changed - damage, a)
        scrolls += scroll is not None
        line_moves += scroll is not None and scroll[2] > ed.tw + 1  # text columns only: a line inserted or joined
        prev = cur
        ed.apply(a)
    assert scrolls > 10 and line_moves > 5


def test_write_rows_with_random_scrolls(tmp_path):
    """write_rows with arbitrary damage and region scrolls (both directions) round-trips."""
    rows, cols = 7, 12
    rng = np.random.default_rng(3)
    alphabet = [" ", "a", "b", "中", "\0", "😀", "\U0010ffff"]
    cur_cp = [" " * cols] * rows
    cur_st = [bytes(cols)] * rows
    expect = []
    path = tmp_path / "s.rcf"
    with FrameWriter(path, rows, cols, block_frames=9) as w:
        for k in range(200):
            scroll = None
            damage = set()
            if rng.random() < 0.3:
                r0 = int(rng.integers(0, rows - 1))
                r1 = int(rng.integers(r0 + 2, rows + 1))
                c0 = int(rng.integers(0, cols - 1))
                c1 = int(rng.integers(c0 + 1, cols + 1))
                d = int(rng.integers(1, r1 - r0)) * (1 if rng.random() < 0.5 else -1)
                lo, hi = max(r0, r0 - d), min(r1, r1 - d)
                new_cp, new_st = list(cur_cp), list(cur_st)
                for y in range(lo, hi):
                    new_cp[y] = cur_cp[y][:c0] + cur_cp[y + d][c0:c1] + cur_cp[y][c1:]
                    new_st[y] = cur_st[y][:c0] + cur_st[y + d][c0:c1] + cur_st[y][c1:]
                cur_cp, cur_st = new_cp, new_st
                scroll = (r0, r1, c0, c1, d)
            for _ in range(int(rng.integers(0, 3))):
                y, x = int(rng.integers(0, rows)), int(rng.integers(0, cols))
                n = int(rng.integers(1, cols - x + 1))
                ch = alphabet[int(rng.integers(0, len(alphabet)))]
                cur_cp[y] = cur_cp[y][:x] + ch * n + cur_cp[y][x + n :]
                cur_st[y] = cur_st[y][:x] + bytes([int(rng.integers(0, 256))]) * n + cur_st[y][x + n :]
                damage.add(y)
            a = int(rng.integers(0, CONTROL_BASE + 19))
            w.write_rows(list(cur_cp), list(cur_st), damage, a, scroll)
            cp = np.frombuffer("".join(cur_cp).encode("utf-32-le"), "<u4").astype(np.int64).reshape(rows, cols)
            st = np.frombuffer(b"".join(cur_st), np.uint8).astype(np.int64).reshape(rows, cols)
            expect.append((np.stack([cp, st], -1), a))
    with FrameReader(path) as r:
        for i, (f, a) in enumerate(expect):
            assert np.array_equal(r.frame(i), f), i
            assert r.action(i) == a


def test_a_refused_write_leaves_the_writer_unchanged(tmp_path):
    """Every bad write_rows call raises before recording anything; the file stays readable and exact."""
    rows, cols = 4, 6
    blank_cp, blank_st = [" " * cols] * rows, [bytes(cols)] * rows
    typed_cp = ["ab    ", *blank_cp[1:]]
    path = tmp_path / "r.rcf"
    bad_calls = [
        ((typed_cp, blank_st, {0}, 1, (0, 9, 0, cols, 1)), "scroll"),
        ((typed_cp, blank_st, {0}, -1, None), "action=-1"),
        ((typed_cp, blank_st, {7}, 1, None), "damaged row 7"),
        ((["abc", *blank_cp[1:]], blank_st, {0}, 1, None), "row 0 has 3 cells"),
        ((typed_cp[:2], blank_st, {0}, 1, None), "2 rows of cells"),
    ]
    with FrameWriter(path, rows, cols, block_frames=8) as w:
        w.write_rows(list(blank_cp), list(blank_st), range(rows), 5)
        for args, message in bad_calls:
            with pytest.raises(ValueError, match=message):
                w.write_rows(*args)
        w.write_rows(list(typed_cp), list(blank_st), {0}, 6)
    with FrameReader(path) as r:
        assert len(r) == 2 and [r.action(0), r.action(1)] == [5, 6]
        assert "".join(chr(c) for c in r.frame(1)[0, :, 0]) == "ab    "


def test_old_format_version_is_rejected_clearly(tmp_path):
    import struct
    import zlib

    from rcswarm.data.frames import frame_codec

    path = tmp_path / "x.rcf"
    with FrameWriter(path, 6, 20, block_frames=4) as w:
        for cp, st, a in _random_frames(5):
            w.write(cp, st, a)
    data = bytearray(path.read_bytes())
    head = frame_codec.HEADER.pack(frame_codec.MAGIC, 1, 6, 20, 4, 16)
    data[: frame_codec.HEADER_SIZE] = head + struct.pack("<I", zlib.crc32(head))
    (tmp_path / "v1.rcf").write_bytes(bytes(data))
    with pytest.raises(FrameFormatError, match=r"version 1 is not supported.*rebuild the dataset"):
        FrameReader(tmp_path / "v1.rcf")
    with pytest.raises(ValueError, match="code points"):
        FrameWriter(tmp_path / "bad.rcf", 2, 3).write(np.full((2, 3), 0x110000), np.zeros((2, 3)), 0)


def test_decoder_rejects_malformed_blocks():
    """Blocks whose checksums pass but whose content is malformed raise FrameFormatError."""
    from rcswarm.data.frames.frame_codec import _varints, decode_block

    def block(acts, ops, text=b"", styles=b""):
        raw = bytearray()
        for part in (_varints(acts), _varints(ops), text):
            raw += _varints([len(part)]) + part
        return bytes(raw + styles)

    rows, cols = 3, 8
    good = block([97], [1 << 1, 1 << 2 | 3, 2, 2, 2, 2, 2], b"ab", b"\x01\x02")  # row 1: "ab" at 2, styles
    cps, sts, acts = decode_block(good, 1, rows, cols)
    assert "".join(map(chr, cps[0, 1])) == "  ab    " and sts[0, 1].tolist() == [0, 0, 1, 2, 0, 0, 0, 0] and acts.tolist() == [97]
    bad = {
        "operation stream ends early": block([97], [1 << 1, 1 << 2 | 3, 2, 2]),
        "outside the frame": block([97], [1 << 1, 5 << 2 | 2, 0, 1, 1], b"a"),
        "expected 2": block([97], [1 << 1, 2, 0, 2, 1], b"a"),
        "outside row": block([97], [1 << 1, 1, 7, 2], b"", b"\x01\x01"),
        "trailing": block([97], [0], b"x"),
        "actions for 1 frames": block([97, 98], [0]),
        "changes nothing": block([97], [1 << 1, 0]),
        "scroll": block([97], [1, 0, 3, 0, 8, 6]),
        "past the end": good[:-3] + b"\xff",
    }
    for why, raw in bad.items():
        with pytest.raises(FrameFormatError) as err:
            decode_block(raw, 1, rows, cols)
        assert why == "past the end" or why in str(err.value), (why, str(err.value))


def test_splits_of_a_manifest_and_repository_names(tmp_path):
    from pathlib import Path

    from rcswarm.data.frames.git_frames import RepoInput, dataset_shards, held_out_repos, repo_name

    shards = [{"name": "shard-00000", "repo": "a", "split": "train"}, {"name": "shard-00001", "repo": "b", "split": "val"}]
    both = {"repos": [{"name": "a", "split": "train"}, {"name": "b", "split": "val"}], "shards": shards}
    assert held_out_repos(both) == ["b"]
    assert [s["name"] for s in dataset_shards(both, "train")] == ["shard-00000"]
    assert [s["name"] for s in dataset_shards(both, "val")] == ["shard-00001"]
    assert dataset_shards(both, None) == shards
    # A dataset of one history (or one made before histories were named): "val" reads every shard.
    old = {"shards": [{"name": "shard-00000", "frames": 5}]}
    assert held_out_repos(old) == [] and dataset_shards(old, "val") == dataset_shards(old, "train") == old["shards"]
    with pytest.raises(ValueError, match="split='dev'"):
        dataset_shards(both, "dev")
    assert repo_name(tmp_path / "proj.git") == "proj" and repo_name(tmp_path / "proj" / ".git") == "proj"
    assert RepoInput("x", Path("."), held_out=True).split == "val"
    with pytest.raises(ValueError, match="repository name 'a b'"):
        RepoInput("a b", Path("."))


def test_a_signed_commit_with_log_show_signature_set_replays(tmp_path, monkeypatch):
    """`git config log.showSignature true` makes `git log` run gpg on a signed commit and print its output among
    the records; before the fix `first_parent_commits` (unlike `history`) did not turn it off and read
    "gpg: ..." lines as commits."""
    monkeypatch.setenv("GNUPGHOME", str(tmp_path / "gnupg"))  # gpg reads (and would create) nothing under ~
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = tmp_path / "signed"
    repo.mkdir()
    git = Git(str(repo))
    git.run("init", "-q")
    (repo / "a.txt").write_text("one\n")
    git.run("add", "a.txt")
    git.run("-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
            "commit", "-q", "-m", "one")
    parent = git.run("rev-parse", "HEAD").decode().strip()
    (repo / "b.txt").write_text("two\n")
    git.run("add", "b.txt")
    tree = git.run("write-tree").decode().strip()
    signature = "".join(f" {line}\n" for line in ("-----BEGIN PGP SIGNATURE-----", "", "iQEzBAABCAAdFiEE", "=abcd",
                                                   "-----END PGP SIGNATURE-----"))
    body = (f"tree {tree}\nparent {parent}\nauthor t <t@example.com> 1700000000 +0000\n"
            f"committer t <t@example.com> 1700000000 +0000\ngpgsig{signature}\nsigned\n")
    (tmp_path / "commit").write_text(body)
    signed = git.run("hash-object", "-t", "commit", "-w", str(tmp_path / "commit")).decode().strip()
    git.run("update-ref", "HEAD", signed)
    git.run("config", "log.showSignature", "true")
    assert list(Git(str(repo)).first_parent_commits(subjects=True)) == [(parent, None, "one"), (signed, parent, "signed")]
    stats = replay(str(repo), lambda *a: None, ROWS, COLS)
    assert stats.commits == 2 and stats.files == 2 and stats.last_commit == signed


def _hermetic_git(monkeypatch, tmp_path) -> None:
    """The git commands of a test read no configuration of the user's or the system's."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def _commit(git: Git, files: dict[str, bytes], message: str) -> None:
    """Write `files` into the work tree of `git`'s repository and commit everything there."""
    for name, data in files.items():
        (Path(git.repo) / name).write_bytes(data)
    git.run("add", "-A")
    git.run("-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
            "commit", "-q", "-m", message)


def _new_repo(path: Path, *commits: dict[str, bytes]) -> Git:
    """A repository at `path` (branch main) with one commit per dict of files."""
    path.mkdir()
    git = Git(str(path))
    git.run("init", "-q", "-b", "main")
    for k, files in enumerate(commits):
        _commit(git, files, f"commit {k}")
    return git


def _merging_repo(path: Path, merged: Path) -> Git:
    """A copy of the repository `merged` whose HEAD is a branch of its own (one commit of app.py) that merged
    `merged`'s main with `--allow-unrelated-histories` (a vendored library): its first-parent line is its own."""
    shutil.copytree(merged, path)
    git = Git(str(path))
    git.run("checkout", "-q", "--orphan", "app")
    git.run("rm", "-q", "-r", "-f", ".")
    _commit(git, {"app.py": b"print(1)\n"}, "app")
    git.run("-c", "user.name=t", "-c", "user.email=t@example.com", "merge", "-q", "--allow-unrelated-histories",
            "-m", "merge lib", "main")
    return git


@pytest.mark.parametrize("held_out", ["lib", "app"])
def test_a_history_that_merged_the_held_out_one_or_the_reverse_is_refused(monkeypatch, tmp_path, capsys, held_out):
    """The review's repro: a training history `app` that merged the held-out `lib` (unrelated histories) typed every
    file of lib into training frames, since a merge is replayed as its diff against its first parent; the check
    compared the first-parent lines only. The reverse (a held-out history that merged a training one) passed too."""
    from rcswarm.cli.main import main
    from rcswarm.data.frames.git_frames import RepoInput, build_git_dataset

    _hermetic_git(monkeypatch, tmp_path)
    lib = _new_repo(tmp_path / "lib", {"lib.py": b"def secret():\n    return 42\n"},
                    {"lib.py": b"def secret():\n    return 43\n"})
    lib_root = lib.run("rev-list", "--max-parents=0", "HEAD").decode().strip()
    _merging_repo(tmp_path / "app", tmp_path / "lib")
    trained = "app" if held_out == "lib" else "lib"
    repos = [RepoInput(trained, tmp_path / trained), RepoInput(held_out, tmp_path / held_out, held_out=True)]
    out = tmp_path / "ds"
    with pytest.raises(ValueError, match=rf"held-out repository {held_out} .* shares commit {lib_root} with training "
                                         rf"repository {trained} .*merged it.* drop {held_out} or {trained}"):
        build_git_dataset(repos, out, ROWS, COLS, vocab_size=300, progress=False)
    assert not out.exists()
    flags = ["--held-out", held_out, "--out", str(out), "--no-progress", "--vocab-size", "300", "--rows", str(ROWS),
             "--cols", str(COLS)]
    assert main(["data", "frames", "--repo", str(tmp_path / "app"), "--repo", str(tmp_path / "lib"), *flags]) == 2
    assert f"shares commit {lib_root}" in capsys.readouterr().err and not out.exists()
    if held_out == "lib":  # the merge past --max-commits is not replayed: app's first commit alone shares nothing
        summary = build_git_dataset(repos, out, ROWS, COLS, vocab_size=300, max_commits=1, progress=False)
        assert [r["commits"] for r in summary["repos"]] == [1, 1]


def test_a_history_without_a_text_file_is_refused_and_the_old_dataset_kept(monkeypatch, tmp_path):
    """The review's repro: a history of binary files only was built (exit 0) into a dataset of zero frames, which
    replaced a good one, and failed only when opened ("window longer than the data"). Now the build is refused,
    naming the history and what was skipped, before anything is published; a held-out history without frames too."""
    from rcswarm.data.frames.git_frames import RepoInput, build_git_dataset

    _hermetic_git(monkeypatch, tmp_path)
    _new_repo(tmp_path / "text", {"a.py": b"x = 1\n"}, {"a.py": b"x = 2\n"})
    _new_repo(tmp_path / "bin", {"bin.dat": bytes(range(256)) * 4, "nul.txt": b"\x00abc"})
    options = {"rows": ROWS, "cols": COLS, "vocab_size": 300, "progress": False}
    empty = r"repository bin \(.*\): its 1 commits replayed gave 0 frames \(files typed: 0; skipped: 2 binary, "
    with pytest.raises(ValueError, match=empty + r".*expected a history with at least one text file"):
        build_git_dataset([RepoInput("bin", tmp_path / "bin")], tmp_path / "new", **options)
    assert not (tmp_path / "new").exists()
    out = tmp_path / "ds"
    build_git_dataset([RepoInput("text", tmp_path / "text")], out, **options)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for repos in ([RepoInput("bin", tmp_path / "bin")],
                  [RepoInput("text", tmp_path / "text"), RepoInput("bin", tmp_path / "bin", held_out=True)]):
        with pytest.raises(ValueError, match=empty):
            build_git_dataset(repos, out, **options)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
