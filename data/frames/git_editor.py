"""The tiny editor and its virtual terminal that git histories are replayed in.

Actions. One action is one uint32 code: a code below 0x110000 types that
character (in the editor, a prompt, ...); `CONTROL_BASE + k` is control k of
`CONTROLS` (each one xterm key sequence, listed in `CONTROL_SEQUENCES`).

Modes. EDIT (typing inserts at the cursor, "\\n" splits the line), TREE (the
file tree has focus: UP/DOWN/PGUP/PGDN move the selection, ENTER opens,
NEW_FILE / RENAME prompt for a path, DELETE_FILE removes the selected file),
PROMPT (typed characters go to the status-line prompt, ENTER confirms, ESC
cancels). GOTO (EDIT) prompts for a 1-based line number; COMMIT (EDIT or TREE)
prompts for a commit subject (optional, `replay(commit_messages=True)`).

Buffer. A file's text is `"\\n".join(lines)`; "\\r" (CRLF files) and other
control characters are ordinary characters of a line, so a file without a
trailing newline, an empty file and CRLF files are represented exactly.
KILL_LINE deletes from the cursor to the end of the line plus the newline that
follows, if any. UP/DOWN keep the column, clamped to the target line.

Screen (rows x cols cells of (code point, style)):

    cols 0 .. tw-1     file tree: one path per row, the open file TREE_CURRENT,
                       the selection (TREE mode) TREE_SELECTED; tw = max(8, cols // 5)
    col  tw            separator "│"
    cols tw+1 ..       editor: a gutter of right-aligned line numbers (GUTTER),
                       then the text
    row  rows - 1      status line: mode, path, Ln/Col, or the prompt

The view scrolls to keep the cursor visible: vertically by the minimum
amount, sideways by jumping so that the cursor lands in the middle of the text
area (vim's `sidescroll=0`); characters left or right of the view are clipped
(long lines are not wrapped). A tab advances to the next multiple of `TAB_WIDTH`
(cells drawn as spaces in style CONTROL); a wide character
(`unicodedata.east_asian_width` W or F) takes two cells, the second holding
code point 0; a wide character cut by the view's edge is drawn as a CONTROL
space; other control characters are drawn as their U+2400 symbol (U+2421 for
DEL) in style CONTROL. Combining marks take one cell like any other character.
"""

from __future__ import annotations

import unicodedata
from array import array
from bisect import bisect_right
from collections import OrderedDict
from functools import lru_cache

import numpy as np

CONTROL_BASE = 0x110000
CONTROLS = (
    "UP", "DOWN", "LEFT", "RIGHT", "HOME", "END", "BACKSPACE", "DELETE", "KILL_LINE", "SAVE",
    "TREE", "ENTER", "NEW_FILE", "RENAME", "DELETE_FILE", "GOTO", "PGUP", "PGDN", "ESC", "COMMIT",
)
CONTROL_SEQUENCES = {
    "UP": "\x1b[A", "DOWN": "\x1b[B", "RIGHT": "\x1b[C", "LEFT": "\x1b[D", "HOME": "\x1b[H",
    "END": "\x1b[F", "BACKSPACE": "\x7f", "DELETE": "\x1b[3~", "KILL_LINE": "\x0b", "SAVE": "\x13",
    "TREE": "\x14", "ENTER": "\r", "NEW_FILE": "\x0e", "RENAME": "\x1bOQ", "DELETE_FILE": "\x04",
    "GOTO": "\x07", "PGUP": "\x1b[5~", "PGDN": "\x1b[6~", "ESC": "\x1b", "COMMIT": "\x19",
}
C = {name: CONTROL_BASE + i for i, name in enumerate(CONTROLS)}

STYLE_EMPTY, STYLE_TEXT, STYLE_CURSOR, STYLE_STATUS, STYLE_TREE = 0, 1, 2, 3, 4
STYLE_TREE_CURRENT, STYLE_TREE_SELECTED, STYLE_GUTTER, STYLE_CONTROL = 5, 6, 7, 8
N_STYLES = 9
TAB_WIDTH = 4
MIN_ROWS, MIN_COLS = 3, 24  # the smallest screen the editor lays out (tree, separator, gutter, text, status line)
SPACE = 32
# Lines, paths and prompts up to this many characters are laid out whole and cached (`_cells_str`); a longer one is
# laid out a window at a time from its display columns (`_Columns`), which the editor keeps across the edits that
# leave a prefix of the line as it was, so that typing into a line of n characters costs O(1) per action, not O(n)
# (a 20,000-character line of JSON with one non-ASCII character took 65 s and 5.7 GB to replay before).
SHORT_LINE = 512
# The display columns of long lines other than the cursor's are kept for at most this many characters in all.
LONG_COLUMNS_CHARS = 1 << 22


def action_name(code: int) -> str:
    """A readable name: the character's repr or the control's name."""
    return CONTROLS[code - CONTROL_BASE] if code >= CONTROL_BASE else repr(chr(code))


@lru_cache(maxsize=65536)
def _char_cells(ch: str) -> tuple[tuple[int, int], ...]:
    o = ord(ch)
    if o < 32 or o == 127:
        return ((0x2421 if o == 127 else 0x2400 + o, STYLE_CONTROL),)
    if unicodedata.east_asian_width(ch) in ("W", "F"):
        return ((o, STYLE_TEXT), (0, STYLE_TEXT))
    return ((o, STYLE_TEXT),)


def line_cells(s: str) -> tuple[list[tuple[int, int]], list[int]]:
    """(cells of line s, display column of each char index 0..len(s))."""
    cells: list[tuple[int, int]] = []
    cols = []
    for ch in s:
        cols.append(len(cells))
        if ch == "\t":
            cells.extend([(SPACE, STYLE_CONTROL)] * (TAB_WIDTH - len(cells) % TAB_WIDTH))
        else:
            cells.extend(_char_cells(ch))
    cols.append(len(cells))
    return cells, cols


_TREE_MOVES = frozenset(("UP", "DOWN", "PGUP", "PGDN"))
_LEAVE_EDIT = frozenset(("TREE", "COMMIT", "GOTO"))
_LINE_EDITS = frozenset(("BACKSPACE", "DELETE", "KILL_LINE"))


def _fast(s: str) -> bool:
    return s.isascii() and s.isprintable()


def _advance(col: int, ch: str) -> int:
    """The display column after character `ch` drawn from column `col`."""
    return col + (TAB_WIDTH - col % TAB_WIDTH if ch == "\t" else len(_char_cells(ch)))


class _Columns:
    """The display columns of a string's characters (`line_cells`' second list, shifted by `base`: the column the
    string starts at), computed left to right on demand and kept across edits that leave a prefix of the string as
    it was (`edited`). Every character takes at least one cell, so the columns rise strictly."""

    __slots__ = ("s", "base", "cols")

    def __init__(self, s: str, base: int = 0) -> None:
        self.s, self.base, self.cols = s, base, array("q", [base])

    def at(self, i: int) -> int:
        """The display column of character i (i = len(s): the column after the last)."""
        cols = self.cols
        if i >= len(cols):
            col = cols[-1]
            for ch in self.s[len(cols) - 1 : i]:
                col = _advance(col, ch)
                cols.append(col)
        return cols[i]

    def edited(self, s: str, keep: int) -> None:
        """The string is now `s`, whose first `keep` characters are the old string's."""
        del self.cols[keep + 1 :]
        self.s = s

    def window(self, left: int, w: int) -> tuple[str, bytes]:
        """(code points, styles) of the string's cells in display columns left .. left + w - 1 (`left` >= `base`;
        fewer at the end of the string): what `_cells_str` gives, sliced, in O(w) beyond the columns kept."""
        s, cols = self.s, self.cols
        n = len(s)
        while len(cols) <= n and cols[-1] <= left:
            self.at(len(cols))
        i = bisect_right(cols, left) - 1
        if i >= n:
            return "", b""
        start, col, cps, sts = left - cols[i], cols[i], [], []
        while i < n and col < left + w:
            ch = s[i]
            if ch == "\t":
                k = TAB_WIDTH - col % TAB_WIDTH
                cps.append(" " * k)
                sts.append(bytes((STYLE_CONTROL,)) * k)
                col += k
            else:
                for cp, st in _char_cells(ch):
                    cps.append(chr(cp))
                    sts.append(bytes((st,)))
                    col += 1
            i += 1
        return "".join(cps)[start : start + w], b"".join(sts)[start : start + w]


class ReplayError(RuntimeError):
    """The replayed editor state differs from git (names the commit and path)."""


class Editor:
    """The editor state machine plus its incremental rows x cols renderer.

    `render_damage()` updates the screen (`row_cp`, `row_st`: per row, one
    character per cell and one style byte per cell) and returns the rows that may
    have changed since its last call plus a scroll hint; `render()` returns the
    screen as numpy arrays.
    """

    def __init__(self, rows: int = 48, cols: int = 160) -> None:
        if rows < MIN_ROWS or cols < MIN_COLS:
            raise ValueError(f"geometry {rows}x{cols}: expected rows >= {MIN_ROWS} and cols >= {MIN_COLS}")
        self.rows, self.cols = rows, cols
        self.tw = max(8, cols // 5)
        self.files: dict[str, str] = {}
        self.paths: list[str] = []
        self.current: str | None = None
        self.lines: list[str] = [""]
        self.r = self.c = 0
        self.mode = "EDIT"
        self.prompt_kind = ""
        self.prompt = ""
        self.sel = 0
        self.top = self.left = self.tree_top = 0
        self.commits = 0
        pw = cols - self.tw - 1
        self.row_cp: list[str] = [" " * cols] * rows  # the screen: code points, one character per cell
        self.row_st: list[bytes] = [bytes(cols)] * rows  # and styles, one byte per cell
        self._tcp, self._tst = [" " * self.tw] * rows, [bytes(self.tw)] * rows
        self._pcp, self._pst = [" " * pw] * rows, [bytes(pw)] * rows
        self._keys: list[object] = [None] * (2 * rows)
        self._tree_version = 0
        self._tree_key: tuple | None = None
        self._cur_key: object = None
        self._cur_idx = -1
        self._pane_key: tuple | None = None
        # damage since the last render: buffer lines whose text changed, the first
        # line of a shifted range (lines inserted or joined), or everything
        self._dirty_lines: set[int] = set()
        self._dirty_from: int | None = None
        self._all_dirty = True
        self._tree_dirty = True
        self._shift: tuple[int, int] | bool | None = None  # lines moved by one (a scroll hint)
        self._last_r = 0
        self._status_fast: tuple[str | None, bool] = (None, True)
        self._damage: set[int] = set()
        self._cursor_cols: _Columns | None = None  # the columns of the cursor's line while it is long
        self._prompt_cols: _Columns | None = None  # the columns of a long prompt
        self._long_cols: OrderedDict[str, _Columns] = OrderedDict()  # of other long lines, `LONG_COLUMNS_CHARS` at most
        self._long_chars = 0

    def _edited(self, old: str, new: str, keep: int) -> None:
        """A line changed from `old` to `new`, which keeps `old`'s first `keep` characters: the cursor line's
        columns follow it (any other change is noticed by identity: `_columns_of` starts over)."""
        cc = self._cursor_cols
        if cc is not None and cc.s is old:
            cc.edited(new, keep)

    def _columns_of(self, line: str, cursor: bool) -> _Columns:
        """The display columns of a long `line`: the cursor's line's kept ones, or those of the bounded cache."""
        cc = self._cursor_cols
        if cc is not None and cc.s is line:
            return cc
        cached = self._long_cols.get(line)
        if cached is None:
            cached = self._long_cols[line] = _Columns(line)
            self._long_chars += len(line)
            while self._long_chars > LONG_COLUMNS_CHARS and len(self._long_cols) > 1:
                self._long_chars -= len(self._long_cols.popitem(last=False)[0])
        else:
            self._long_cols.move_to_end(line)
        if not cursor:
            return cached
        self._cursor_cols = _Columns(line)
        self._cursor_cols.cols = array("q", cached.cols)
        return self._cursor_cols

    # -- state ---------------------------------------------------------------
    def text(self) -> str:
        return "\n".join(self.lines)

    def _open(self, path: str) -> None:
        self.current = path
        self.lines = self.files[path].split("\n")
        self.r = self.c = self.top = self.left = 0
        self.sel = self.paths.index(path)
        self.mode = "EDIT"
        self._all_dirty = self._tree_dirty = True

    def _add(self, path: str, text: str) -> None:
        self.files[path] = text
        self.paths = sorted(self.files)
        self._tree_version += 1
        self._tree_dirty = True

    def apply(self, code: int) -> None:
        """Take one action."""
        if code < CONTROL_BASE:
            ch = chr(code)
            if self.mode == "PROMPT":
                old = self.prompt
                self.prompt += ch
                if self._prompt_cols is not None and self._prompt_cols.s is old:
                    self._prompt_cols.edited(self.prompt, len(old))
            elif self.mode == "EDIT" and self.current is not None:
                r = self.r
                line = self.lines[r]
                if ch == "\n":
                    self.lines[r : r + 1] = [line[: self.c], line[self.c :]]
                    self._edited(line, self.lines[r], self.c)
                    self.r, self.c = r + 1, 0
                    if self._dirty_from is None or r < self._dirty_from:
                        self._dirty_from = r
                    # lines from r + 2 on show what lines r + 1.. showed (one event per render, else none)
                    self._shift = (r + 2, -1) if self._shift is None else False
                else:
                    self.lines[r] = line[: self.c] + ch + line[self.c :]
                    self._edited(line, self.lines[r], self.c)
                    self.c += 1
                    self._dirty_lines.add(r)
            return
        name = CONTROLS[code - CONTROL_BASE]
        if self.mode != "EDIT" or name in _LEAVE_EDIT:
            self._tree_dirty = True  # the tree shows the mode, the selection and the open file
        if self.mode == "EDIT":
            self._edit(name)
        elif self.mode == "TREE":
            if name not in _TREE_MOVES:
                self._all_dirty = True
            self._tree(name)
        else:
            if name != "BACKSPACE":
                self._all_dirty = True
            self._prompt(name)

    def _edit(self, name: str) -> None:
        if name == "TREE":
            self.mode = "TREE"
            self._all_dirty = True
            return
        if name == "COMMIT":
            self.mode, self.prompt_kind, self.prompt = "PROMPT", "commit", ""
            self._all_dirty = True
            return
        if self.current is None:
            return
        lines, r, c = self.lines, self.r, self.c
        n = len(lines)
        if name in _LINE_EDITS:
            self._edit_line(name, lines, r, c)
            if len(lines) != n:
                # lines were joined: every line from the join down moved
                top = min(r, self.r)
                if self._dirty_from is None or top < self._dirty_from:
                    self._dirty_from = top
                self._shift = (top + 1, 1) if self._shift is None else False
            else:
                self._dirty_lines.add(r)
            return
        if name in ("GOTO", "COMMIT"):
            self._all_dirty = True
        if name == "UP" and r > 0:
            self.r, self.c = r - 1, min(c, len(lines[r - 1]))
        elif name == "DOWN" and r + 1 < len(lines):
            self.r, self.c = r + 1, min(c, len(lines[r + 1]))
        elif name == "LEFT":
            if c > 0:
                self.c = c - 1
            elif r > 0:
                self.r, self.c = r - 1, len(lines[r - 1])
        elif name == "RIGHT":
            if c < len(lines[r]):
                self.c = c + 1
            elif r + 1 < len(lines):
                self.r, self.c = r + 1, 0
        elif name == "HOME":
            self.c = 0
        elif name == "END":
            self.c = len(lines[r])
        elif name == "PGUP":
            self.r = max(0, r - (self.rows - 1))
            self.c = min(c, len(lines[self.r]))
        elif name == "PGDN":
            self.r = min(len(lines) - 1, r + (self.rows - 1))
            self.c = min(c, len(lines[self.r]))
        elif name == "SAVE":
            self.files[self.current] = self.text()
        elif name == "GOTO":
            self.mode, self.prompt_kind, self.prompt = "PROMPT", "goto", ""
        elif name == "COMMIT":
            self.mode, self.prompt_kind, self.prompt = "PROMPT", "commit", ""

    def _edit_line(self, name: str, lines: list[str], r: int, c: int) -> None:
        old = lines[r]
        if name == "BACKSPACE":
            if c > 0:
                lines[r] = old[: c - 1] + old[c:]
                self._edited(old, lines[r], c - 1)
                self.c = c - 1
            elif r > 0:
                above = lines[r - 1]
                self.c = len(above)
                lines[r - 1 : r + 1] = [above + old]
                self._edited(above, lines[r - 1], len(above))
                self.r = r - 1
        elif name == "DELETE":
            if c < len(old):
                lines[r] = old[:c] + old[c + 1 :]
            elif r + 1 < len(lines):
                lines[r : r + 2] = [old + lines[r + 1]]
            self._edited(old, lines[r], c)
        elif name == "KILL_LINE":
            if r + 1 < len(lines):
                lines[r : r + 2] = [old[:c] + lines[r + 1]]
            else:
                lines[r] = old[:c]
            self._edited(old, lines[r], c)

    def _tree(self, name: str) -> None:
        n = len(self.paths)
        page = self.rows - 1
        if name == "UP":
            self.sel = max(0, self.sel - 1)
        elif name == "DOWN":
            self.sel = max(0, min(n - 1, self.sel + 1))
        elif name == "PGUP":
            self.sel = max(0, self.sel - page)
        elif name == "PGDN":
            self.sel = max(0, min(n - 1, self.sel + page))
        elif name == "ENTER" and n:
            self._open(self.paths[self.sel])
        elif name in ("NEW_FILE", "RENAME") and (name == "NEW_FILE" or n):
            self.mode, self.prompt_kind, self.prompt = "PROMPT", name.lower(), ""
        elif name == "DELETE_FILE" and n:
            path = self.paths[self.sel]
            del self.files[path]
            self.paths.remove(path)
            self._tree_version += 1
            self.sel = max(0, min(self.sel, len(self.paths) - 1))
            if path == self.current:
                self.current, self.lines, self.r, self.c = None, [""], 0, 0
        elif name == "ESC":
            self.mode = "EDIT"
        elif name == "COMMIT":
            self.mode, self.prompt_kind, self.prompt = "PROMPT", "commit", ""

    def _prompt(self, name: str) -> None:
        if name == "ESC":
            self.mode = "TREE" if self.prompt_kind in ("new_file", "rename") else "EDIT"
        elif name == "BACKSPACE":
            old = self.prompt
            self.prompt = old[:-1]
            if self._prompt_cols is not None and self._prompt_cols.s is old:
                self._prompt_cols.edited(self.prompt, len(self.prompt))
        elif name == "ENTER":
            kind, text = self.prompt_kind, self.prompt
            if kind == "commit":
                self.commits += 1
                self.mode = "EDIT"
            elif kind == "goto":
                self.mode = "EDIT"
                if text.isdigit():
                    self.r, self.c = max(0, min(len(self.lines) - 1, int(text) - 1)), 0
            elif kind == "new_file" and text and text not in self.files:
                self._add(text, "")
                self._open(text)
            elif kind == "rename" and text and text not in self.files:
                old = self.paths[self.sel]
                content = self.files.pop(old)
                self._add(text, content)
                if self.current == old:
                    self.current = text
                    self.sel = self.paths.index(text)
                    self.mode = "EDIT"
                else:
                    self._open(text)
            else:
                self.mode = "TREE"

    # -- rendering -----------------------------------------------------------
    # The screen is kept as one string of code points (`row_cp[y]`, one character
    # per cell) and one bytes object of styles (`row_st[y]`) per row, each
    # assembled from the tree part (columns 0..tw-1), the separator and the
    # editor pane. Actions record which buffer lines they touched; `render_damage`
    # re-renders only those rows (plus all rows when the view, the mode or the
    # open file changed), so typing a character costs one row and the status line.

    def _tree_row(self, y: int, path: str | None, style: int) -> None:
        tw = self.tw
        if path is None:
            cp, st = " " * tw, bytes(tw)
        else:
            cps, sts, _ = _cells(path[:tw])  # the cells of a prefix are a prefix of the cells
            cp = cps[:tw]
            st = sts[:tw].replace(b"\x01", bytes((style,)))
            n = len(cp)
            cp += " " * (tw - n)
            st += bytes((style,)) * (tw - n)
        self._tcp[y], self._tst[y] = cp, st
        self.row_cp[y] = cp + "\u2502" + self._pcp[y]
        self.row_st[y] = st + b"\x04" + self._pst[y]
        self._damage.add(y)

    def _pane_row(self, y: int, cp: str, st: bytes) -> None:
        self._pcp[y], self._pst[y] = cp, st
        self.row_cp[y] = self._tcp[y] + "\u2502" + cp
        self.row_st[y] = self._tst[y] + b"\x04" + st
        self._damage.add(y)

    def _render_tree(self, h: int) -> None:
        n = len(self.paths)
        ck = (self._tree_version, self.current)
        if ck != self._cur_key:
            self._cur_key = ck
            self._cur_idx = self.paths.index(self.current) if self.current is not None else -1
        cur_idx = self._cur_idx
        focus = self.sel if self.mode != "EDIT" or cur_idx < 0 else cur_idx
        if focus < self.tree_top:
            self.tree_top = focus
        elif focus >= self.tree_top + h:
            self.tree_top = focus - h + 1
        self.tree_top = max(0, min(self.tree_top, max(0, n - h)))
        tree_mode = self.mode == "TREE" or (self.mode == "PROMPT" and self.prompt_kind in ("new_file", "rename"))
        sel = self.sel if tree_mode else -1
        tree_key = (self._tree_version, self.tree_top, sel, cur_idx)
        old = self._tree_key
        if tree_key == old:
            return
        self._tree_key = tree_key
        top = self.tree_top
        if old is not None and old[0] == tree_key[0] and old[1] == top:
            ys = {i - top for i in (old[2], sel, old[3], cur_idx) if top <= i < top + h}
        else:
            ys = range(h)
        keys = self._keys
        for y in ys:
            i = top + y
            path = self.paths[i] if i < n else None
            style = STYLE_TREE
            if i == sel:
                style = STYLE_TREE_SELECTED
            elif i == cur_idx:
                style = STYLE_TREE_CURRENT
            key = (path, style)
            if keys[self.rows + y] != key:
                keys[self.rows + y] = key
                self._tree_row(y, path, style)

    def render_damage(self) -> tuple[set[int], tuple[int, int, int, int, int] | None]:
        """Bring the screen rows up to date; (rows that may have changed since the last call, scroll).

        `scroll` is None or (r0, r1, c0, c1, d): the region rows r0..r1-1, columns
        c0..c1-1 (the editor pane when the view scrolled; the text columns below a
        line that was inserted or joined) now shows in its row y what row y + d
        showed. It is a hint for the frame encoder; every row of the region is also
        in the damage set. The returned set is fresh on every call.
        """
        rows, cols, tw = self.rows, self.cols, self.tw
        h = rows - 1
        self._damage = damage = set()
        if self._tree_dirty:
            self._tree_dirty = False
            self._render_tree(h)
        # editor pane
        lines = self.lines
        x0 = tw + 1
        nl = len(lines)
        gw = max(4, len(str(nl))) + 1
        w = cols - x0 - gw
        r = self.r
        if r < self.top:
            self.top = r
        elif r >= self.top + h:
            self.top = r - h + 1
        cur_line = lines[r]
        if _fast(cur_line):
            dcol = self.c
        elif len(cur_line) <= SHORT_LINE:
            dcol = _cells_str(cur_line)[2][self.c]
        else:
            dcol = self._columns_of(cur_line, cursor=True).at(self.c)
        if dcol < self.left or dcol >= self.left + w:
            # off the view sideways: jump so the cursor is in the middle (vim's sidescroll=0)
            self.left = max(0, dcol - w // 2)
        show_cursor = self.mode == "EDIT" and self.current is not None
        left, top = self.left, self.top
        pane_key = (self.current, id(lines), top, left, gw, show_cursor)
        old_key = self._pane_key
        scroll = None
        if pane_key != old_key or self._all_dirty:
            ys = range(h)
            if old_key is not None and old_key[:2] == pane_key[:2] and old_key[3:] == pane_key[3:] and 0 < abs(top - old_key[2]) < h:
                scroll = (0, h, x0, cols, top - old_key[2])
        else:
            ys = {i - top for i in self._dirty_lines if top <= i < top + h}
            ys.add(self._last_r - top)
            ys.add(r - top)
            if self._dirty_from is not None:
                ys.update(range(max(0, self._dirty_from - top), h))
            if self._shift:
                # a line inserted or joined: the text below moved one row (the gutter did not)
                i0, d = self._shift
                y0 = max(0, i0 - top)
                if h - y0 >= 2:
                    scroll = (y0, h, x0 + gw, cols, d)
                    ys.update(range(y0, h))
        self._shift = None
        self._pane_key = pane_key
        self._all_dirty = False
        self._dirty_lines.clear()
        self._dirty_from = None
        self._last_r = r
        keys = self._keys
        has_file = self.current is not None
        pw = cols - x0
        for y in ys:
            if not 0 <= y < h:
                continue
            i = top + y
            has = has_file and i < nl
            s = lines[i] if has else None
            cursor = dcol - left if (show_cursor and i == r) else -1
            key = (i if has else -1, s, left, gw, cursor)
            if keys[y] == key:
                continue
            keys[y] = key
            if not has:
                self._pane_row(y, " " * pw, bytes(pw))
                continue
            num = str(i + 1).rjust(gw - 1) + " "
            if _fast(s):
                seg = s[left : left + w]
                k = len(seg)
                cp = num + seg + " " * (w - k)
                st = _GUTTER[gw] + _TEXT[k] + bytes(w - k)
            else:
                if len(s) <= SHORT_LINE:
                    cps, sts, _ = _cells_str(s)
                    seg, sst = cps[left : left + w], sts[left : left + w]
                elif left == 0:
                    cps, sts, _ = _cells(s[:w])  # the cells of a prefix are a prefix of the cells
                    seg, sst = cps[:w], sts[:w]
                else:
                    seg, sst = self._columns_of(s, cursor=i == r).window(left, w)
                if seg and seg[0] == "\0":
                    seg, sst = " " + seg[1:], b"\x08" + sst[1:]
                if len(seg) == w and sst[-1] == STYLE_TEXT and _wide(seg[-1]):
                    seg, sst = seg[:-1] + " ", sst[:-1] + b"\x08"
                k = len(seg)
                cp = num + seg + " " * (w - k)
                st = _GUTTER[gw] + sst + bytes(w - k)
            if 0 <= cursor < w:
                p = gw + cursor
                st = st[:p] + b"\x02" + st[p + 1 :]
            self._pane_row(y, cp, st)
        # status line
        if self.mode == "PROMPT":
            label = {"goto": "line: ", "new_file": "new file: ", "rename": "rename to: ", "commit": "commit: "}[self.prompt_kind]
            cps, sts = self._prompt_cells(label)
            cps, sts = cps + " ", sts + b"\x02"
        else:
            path = self.current or "[no file]"
            text = f" {self.mode} | {path} | Ln {r + 1}, Col {self.c + 1} | {nl} lines "
            if self._status_fast[0] is not path:
                self._status_fast = (path, _fast(path))
            if self._status_fast[1]:
                cps, sts = text[:cols], _STATUS[min(len(text), cols)]
            else:
                cps, sts, _ = _cells(text[:cols])  # the cells of a prefix are a prefix of the cells
                cps, sts = cps[:cols], sts[:cols].replace(b"\x01", b"\x03")
        n = len(cps)
        if n < cols:
            cps, sts = cps + " " * (cols - n), sts + b"\x03" * (cols - n)
        if cps != self.row_cp[h] or sts != self.row_st[h]:
            self.row_cp[h], self.row_st[h] = cps, sts
            damage.add(h)
        return damage, scroll

    def _prompt_cells(self, label: str) -> tuple[str, bytes]:
        """The status line's cells of `label` + the prompt, in style STATUS, before the cursor's cell: the last
        cols - 1 of them when they do not fit (a long prompt is laid out from its kept columns)."""
        cols, prompt = self.cols, self.prompt
        if len(label) + len(prompt) <= SHORT_LINE:
            cps, sts, _ = _cells_str(label + prompt)
            sts = sts.replace(b"\x01", b"\x03")
            if len(cps) >= cols:
                cps, sts = cps[-(cols - 1) :], sts[-(cols - 1) :]
            return cps, sts
        pc = self._prompt_cols
        if pc is None or pc.s is not prompt or pc.base != len(label):  # labels are ASCII: one cell a character
            pc = self._prompt_cols = _Columns(prompt, len(label))
        total = pc.at(len(prompt))
        if total < cols:
            cps, sts = pc.window(len(label), total)
            return label + cps, (b"\x03" * len(label)) + sts.replace(b"\x01", b"\x03")
        start = total - (cols - 1)
        head = label[start:] if start < len(label) else ""
        cps, sts = pc.window(max(start, len(label)), total - max(start, len(label)))
        return head + cps, (b"\x03" * len(head)) + sts.replace(b"\x01", b"\x03")

    def render(self) -> tuple[np.ndarray, np.ndarray]:
        """The current screen: (code points int32 [rows, cols], styles uint8 [rows, cols]), fresh arrays."""
        self.render_damage()
        return self.screen()

    def screen(self) -> tuple[np.ndarray, np.ndarray]:
        """The screen as last rendered, as (code points int32, styles uint8) arrays."""
        cp = np.frombuffer("".join(self.row_cp).encode("utf-32-le", "surrogatepass"), "<u4")
        st = np.frombuffer(b"".join(self.row_st), np.uint8)
        return cp.astype(np.int32).reshape(self.rows, self.cols), st.reshape(self.rows, self.cols).copy()


class _Runs(dict):
    """k -> k bytes of one style, cached."""

    def __init__(self, style: int) -> None:
        super().__init__()
        self.style = bytes((style,))

    def __missing__(self, k: int) -> bytes:
        v = self[k] = self.style * k
        return v


_GUTTER, _TEXT, _STATUS = _Runs(STYLE_GUTTER), _Runs(STYLE_TEXT), _Runs(STYLE_STATUS)


def _cells(s: str) -> tuple[str, bytes, list[int]]:
    """`_cells_str(s)`, from its cache for a string of at most `SHORT_LINE` characters (a longer one is laid out
    without being kept: the cache holds 8,192 strings, so its size must not grow with theirs)."""
    if len(s) <= SHORT_LINE:
        return _cells_str(s)
    cells, cols = line_cells(s)
    return "".join(map(chr, (c for c, _ in cells))), bytes(st for _, st in cells), cols


@lru_cache(maxsize=8192)
def _cells_str(s: str) -> tuple[str, bytes, list[int]]:
    """Line s as (code points, one char per cell; styles; display column of each char index); only strings of at
    most `SHORT_LINE` characters come here (`_cells`)."""
    cells, cols = line_cells(s)
    return "".join(map(chr, (c for c, _ in cells))), bytes(st for _, st in cells), cols


def _wide(ch: str) -> bool:
    return ord(ch) > 0x1000 and unicodedata.east_asian_width(ch) in ("W", "F")
