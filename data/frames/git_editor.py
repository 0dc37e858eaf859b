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

The view scrolls to keep the cursor visible (vertically and horizontally, by
the minimum amount); characters left or right of the view are clipped (long
lines are not wrapped). A tab advances to the next multiple of `TAB_WIDTH`
(cells drawn as spaces in style CONTROL); a wide character
(`unicodedata.east_asian_width` W or F) takes two cells, the second holding
code point 0; a wide character cut by the view's edge is drawn as a CONTROL
space; other control characters are drawn as their U+2400 symbol (U+2421 for
DEL) in style CONTROL. Combining marks take one cell like any other character.
"""

from __future__ import annotations

import unicodedata
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
SPACE = 32


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


def _fast(s: str) -> bool:
    return s.isascii() and s.isprintable()


class ReplayError(RuntimeError):
    """The replayed editor state differs from git (names the commit and path)."""


class Editor:
    """The editor state machine plus its incremental rows x cols renderer."""

    def __init__(self, rows: int = 48, cols: int = 160) -> None:
        if rows < 3 or cols < 24:
            raise ValueError(f"geometry {rows}x{cols}: expected rows >= 3 and cols >= 24")
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
        self.cp = np.full((rows, cols), SPACE, np.int32)
        self.st = np.zeros((rows, cols), np.uint8)
        self._keys: list[object] = [None] * (2 * rows)
        self._tree_version = 0
        self.commits = 0
        self._tree_key: object = None

    # -- state ---------------------------------------------------------------
    def text(self) -> str:
        return "\n".join(self.lines)

    def _open(self, path: str) -> None:
        self.current = path
        self.lines = self.files[path].split("\n")
        self.r = self.c = self.top = self.left = 0
        self.sel = self.paths.index(path)
        self.mode = "EDIT"

    def _add(self, path: str, text: str) -> None:
        self.files[path] = text
        self.paths = sorted(self.files)
        self._tree_version += 1

    def apply(self, code: int) -> None:
        """Take one action."""
        if code < CONTROL_BASE:
            ch = chr(code)
            if self.mode == "PROMPT":
                self.prompt += ch
            elif self.mode == "EDIT" and self.current is not None:
                line = self.lines[self.r]
                if ch == "\n":
                    self.lines[self.r : self.r + 1] = [line[: self.c], line[self.c :]]
                    self.r, self.c = self.r + 1, 0
                else:
                    self.lines[self.r] = line[: self.c] + ch + line[self.c :]
                    self.c += 1
            return
        name = CONTROLS[code - CONTROL_BASE]
        getattr(self, "_" + self.mode.lower())(name)

    def _edit(self, name: str) -> None:
        if name == "TREE":
            self.mode = "TREE"
            return
        if name == "COMMIT":
            self.mode, self.prompt_kind, self.prompt = "PROMPT", "commit", ""
            return
        if self.current is None:
            return
        lines, r, c = self.lines, self.r, self.c
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
        elif name == "BACKSPACE":
            if c > 0:
                lines[r] = lines[r][: c - 1] + lines[r][c:]
                self.c = c - 1
            elif r > 0:
                self.c = len(lines[r - 1])
                lines[r - 1 : r + 1] = [lines[r - 1] + lines[r]]
                self.r = r - 1
        elif name == "DELETE":
            if c < len(lines[r]):
                lines[r] = lines[r][:c] + lines[r][c + 1 :]
            elif r + 1 < len(lines):
                lines[r : r + 2] = [lines[r] + lines[r + 1]]
        elif name == "KILL_LINE":
            if r + 1 < len(lines):
                lines[r : r + 2] = [lines[r][:c] + lines[r + 1]]
            else:
                lines[r] = lines[r][:c]
        elif name == "SAVE":
            self.files[self.current] = self.text()
        elif name == "GOTO":
            self.mode, self.prompt_kind, self.prompt = "PROMPT", "goto", ""
        elif name == "COMMIT":
            self.mode, self.prompt_kind, self.prompt = "PROMPT", "commit", ""

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
            self.prompt = self.prompt[:-1]
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
    def _put(self, y: int, x0: int, width: int, cells: list[tuple[int, int]], fill: int = STYLE_EMPTY) -> None:
        cells = cells[:width]
        n = len(cells)
        if n:
            arr = np.asarray(cells, np.int64)
            self.cp[y, x0 : x0 + n] = arr[:, 0]
            self.st[y, x0 : x0 + n] = arr[:, 1]
        self.cp[y, x0 + n : x0 + width] = SPACE
        self.st[y, x0 + n : x0 + width] = fill

    def render(self) -> tuple[np.ndarray, np.ndarray]:
        """The current screen: (code points int32 [rows, cols], styles uint8 [rows, cols]); views, do not modify."""
        rows, cols, tw = self.rows, self.cols, self.tw
        h = rows - 1
        # tree
        n = len(self.paths)
        cur_idx = self.paths.index(self.current) if self.current is not None else -1
        focus = self.sel if self.mode != "EDIT" or cur_idx < 0 else cur_idx
        if focus < self.tree_top:
            self.tree_top = focus
        elif focus >= self.tree_top + h:
            self.tree_top = focus - h + 1
        self.tree_top = max(0, min(self.tree_top, max(0, n - h)))
        tree_mode = self.mode == "TREE" or (self.mode == "PROMPT" and self.prompt_kind in ("new_file", "rename"))
        tree_key = (self._tree_version, self.tree_top, self.sel if tree_mode else -1, cur_idx)
        for y in range(h if tree_key != self._tree_key else 0):
            i = self.tree_top + y
            path = self.paths[i] if i < n else None
            style = STYLE_TREE
            if i == self.sel and tree_mode:
                style = STYLE_TREE_SELECTED
            elif i == cur_idx:
                style = STYLE_TREE_CURRENT
            key = ("t", path, style)
            if self._keys[rows + y] != key:
                self._keys[rows + y] = key
                cells = [(cp, style if s == STYLE_TEXT else s) for cp, s in line_cells(path)[0]] if path else []
                self._put(y, 0, tw, cells, STYLE_EMPTY if path is None else style)
                self.cp[y, tw] = 0x2502
                self.st[y, tw] = STYLE_TREE
        self._tree_key = tree_key
        # editor
        lines = self.lines
        x0 = tw + 1
        gw = max(4, len(str(len(lines)))) + 1
        w = cols - x0 - gw
        if self.r < self.top:
            self.top = self.r
        elif self.r >= self.top + h:
            self.top = self.r - h + 1
        cur_line = lines[self.r]
        dcol = self.c if _fast(cur_line) else line_cells(cur_line)[1][self.c]
        if dcol < self.left:
            self.left = dcol
        elif dcol >= self.left + w:
            self.left = dcol - w + 1
        show_cursor = self.mode == "EDIT" and self.current is not None
        left = self.left
        for y in range(h):
            i = self.top + y
            has = self.current is not None and i < len(lines)
            s = lines[i] if has else None
            cursor = dcol - left if (show_cursor and i == self.r) else -1
            key = ("e", i if has else -1, s, left, gw, w, cursor)
            if self._keys[y] == key:
                continue
            self._keys[y] = key
            if not has:
                self._put(y, x0, cols - x0, [])
                continue
            num = str(i + 1).rjust(gw - 1) + " "
            self._put(y, x0, gw, [(ord(ch), STYLE_GUTTER) for ch in num])
            if _fast(s):
                seg = s[left : left + w]
                k = len(seg)
                if k:
                    self.cp[y, x0 + gw : x0 + gw + k] = np.frombuffer(seg.encode("ascii"), np.uint8)
                    self.st[y, x0 + gw : x0 + gw + k] = STYLE_TEXT
                self.cp[y, x0 + gw + k : cols] = SPACE
                self.st[y, x0 + gw + k : cols] = STYLE_EMPTY
            else:
                cells = line_cells(s)[0][left : left + w]
                if cells and cells[0][0] == 0:
                    cells[0] = (SPACE, STYLE_CONTROL)
                if len(cells) == w and _char_cells_wide_start(cells[-1]):
                    cells[-1] = (SPACE, STYLE_CONTROL)
                self._put(y, x0 + gw, w, cells)
            if 0 <= cursor < w:
                self.st[y, x0 + gw + cursor] = STYLE_CURSOR
        # status line
        if self.mode == "PROMPT":
            label = {"goto": "line: ", "new_file": "new file: ", "rename": "rename to: ", "commit": "commit: "}[self.prompt_kind]
            text = label + self.prompt
            cells = [(cp, STYLE_STATUS if s == STYLE_TEXT else s) for cp, s in line_cells(text)[0]]
            cells = cells[-(cols - 1):] if len(cells) >= cols else cells
            cells = cells + [(SPACE, STYLE_CURSOR)]
        else:
            path = self.current or "[no file]"
            text = f" {self.mode} | {path} | Ln {self.r + 1}, Col {self.c + 1} | {len(lines)} lines "
            if _fast(text):
                key = ("s", text)
                if self._keys[rows - 1] != key:
                    self._keys[rows - 1] = key
                    seg = text[:cols]
                    self.cp[rows - 1, : len(seg)] = np.frombuffer(seg.encode("ascii"), np.uint8)
                    self.cp[rows - 1, len(seg) :] = SPACE
                    self.st[rows - 1, :] = STYLE_STATUS
                return self.cp, self.st
            cells = [(cp, STYLE_STATUS if s == STYLE_TEXT else s) for cp, s in line_cells(text)[0]]
        key = ("s", tuple(cells))
        if self._keys[rows - 1] != key:
            self._keys[rows - 1] = key
            self._put(rows - 1, 0, cols, cells, STYLE_STATUS)
        return self.cp, self.st


def _char_cells_wide_start(cell: tuple[int, int]) -> bool:
    cp, style = cell
    return style == STYLE_TEXT and cp > 0x1000 and unicodedata.east_asian_width(chr(cp)) in ("W", "F")
