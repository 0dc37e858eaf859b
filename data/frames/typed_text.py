"""Fully observable typing frames (the paper's Appendix G) from standard-library docstrings.

Paragraphs of real text are typed character by character into a rows x cols
frame that never scrolls: every document fits, so the whole text typed so far
is visible in every frame and frame t + 1 is frame t plus one character. The
task is to overfit a fixed, finite set of documents.

Documents (`load_typing_documents`). The standard library's .py files (under
`sysconfig.get_paths()["stdlib"]`, skipping test suites and installed
packages), sorted by relative path and then permuted by `document_seed`, are
parsed with `ast`; their docstrings (module, then classes and functions in
source order) are split into paragraphs at blank lines. A paragraph is skipped
if it has an indented line or a `>>>` prompt (code, tables, lists), no letter,
or, after optional case folding, a character outside the charset. A kept
paragraph is reflowed (whitespace runs become one space) and wrapped at
cols - 1 characters. Paragraphs of one docstring are packed into a document,
separated by an empty line, while they fit the text rows; a paragraph taller
than the text rows is cut after the last row that fits. Documents shorter than
`min_document_chars` and repeats are dropped; loading stops at `n_documents`.
The result depends only on the config and the interpreter's installation.

Frame layout (rows x cols cells of (char id, style id), char id = code point
mod `char_vocab`, the frame model's `frame_cells` convention):

    rows 0 .. rows - 2   text area (all rows when status_line is False)
    row  rows - 1        status line: the document's title (module.qualname),
                         cut to cols, padded with spaces, style STATUS
    empty cell           (space, EMPTY)
    typed character      (char id, TEXT)        typed spaces are TEXT too
    cursor               (space, CURSOR)        the cell the next character goes to

Line i of the document is text row i, starting at column 0; a typed newline
moves the cursor to column 0 of the next row and leaves an empty cell behind.
No line is longer than cols - 1, so the cursor after a line's last character
is still inside the frame, and nothing ever wraps or scrolls. Styles: EMPTY 0,
TEXT 1, CURSOR 2, STATUS 3 (`N_STYLES` = 4, so the model needs n_styles >= 4).
Unlike the paper's Figure 26 (an editor screen with a file header, line
numbers and `~` filler rows) there is no header, gutter or filler: they would
take rows and columns from small frames, and a filler row that disappears on
a newline would make a step change more than the typed cell and the cursor.

Actions (`TypingVocab`): id i < len(charset) types charset[i]; `unk_id` =
len(charset) stands for a character outside the charset (never emitted here,
since such paragraphs are skipped); `end_id` = len(charset) + 1 ends the
document. Two charsets are provided: `PRINTABLE_CHARSET` (printable ASCII and
newline, 96 characters: 98 actions) and `COMPACT_CHARSET` (lower case, digits,
space, newline and 24 punctuation marks, 62 characters: 64 actions; use it with
`fold_case=True`).

The stream: document d of n characters is n + 1 steps. Frame s (s = 0 .. n)
shows its first s characters typed, with the cursor after them; action s is
character s for s < n and END for s = n. The documents follow each other in
order, cyclically: after document d's END comes document d + 1's empty frame.
So action t's character appears in frame t + 1, except after END, where the
next frame starts the next document (`rcswarm.data.frames.window` describes
the alignment). A window is L consecutive steps of this cyclic stream from a
uniform random offset. Frames are rendered incrementally: the first frame of a
window is drawn from its document's prefix, every later one is a copy of the
previous frame with one cell typed and the cursor moved.
"""

from __future__ import annotations

import ast
import os
import sysconfig
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rcswarm.data.frames.window import FrameBatch, FrameWindowSpec, check_chunk
from rcswarm.data.validation import check_bool, check_int

PRINTABLE_CHARSET: str = "".join(chr(c) for c in range(32, 127)) + "\n"
"""Printable ASCII (space .. tilde) and newline: 96 characters, 98 actions."""

COMPACT_CHARSET: str = "abcdefghijklmnopqrstuvwxyz0123456789 \n" + ".,;:!?'\"()[]{}<>-_=+*/%#"
"""Lower case, digits, space, newline and 24 punctuation marks: 62 characters, 64 actions."""

STYLE_EMPTY = 0
STYLE_TEXT = 1
STYLE_CURSOR = 2
STYLE_STATUS = 3
N_STYLES = 4
"""Style ids used by typing frames are in [0, N_STYLES)."""

SPACE = ord(" ")
UNK_TEXT = "\ufffd"
"""What `TypingVocab.decode` writes for the UNK action."""

EXCLUDED_DIRS: frozenset[str] = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)
"""Directory names skipped anywhere below the stdlib root."""


@dataclass(frozen=True)
class TypingVocab:
    """The action vocabulary: the charset's characters, then UNK, then END."""

    charset: str
    _ids: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_charset("TypingVocab", self.charset)
        object.__setattr__(self, "_ids", {ch: i for i, ch in enumerate(self.charset)})

    @property
    def size(self) -> int:
        """Number of actions: len(charset) + 2."""
        return len(self.charset) + 2

    @property
    def unk_id(self) -> int:
        """The action standing for a character outside the charset."""
        return len(self.charset)

    @property
    def end_id(self) -> int:
        """The action that ends a document."""
        return len(self.charset) + 1

    def encode(self, text: str) -> list[int]:
        """Action ids typing `text`, one per character (UNK outside the charset)."""
        return [self._ids.get(ch, self.unk_id) for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        """The text that actions `ids` type; UNK becomes `UNK_TEXT`, END nothing."""
        chars = [self.charset[i] if i < self.unk_id else UNK_TEXT for i in ids if i != self.end_id]
        return "".join(chars)


def _check_charset(owner: str, charset: object) -> None:
    if not isinstance(charset, str) or not charset:
        raise ValueError(f"{owner}.charset={charset!r}: expected a non-empty str")
    if len(set(charset)) != len(charset):
        raise ValueError(f"{owner}.charset={charset!r}: expected no repeated character")
    if "\n" not in charset or " " not in charset:
        raise ValueError(f"{owner}.charset={charset!r}: expected it to contain newline and space")
    if any(ch != "\n" and not ch.isprintable() for ch in charset):
        raise ValueError(
            f"{owner}.charset={charset!r}: expected printable characters and newline only"
        )


@dataclass(frozen=True)
class TypingConfig:
    """What the typing frames look like and which documents are typed; validated on construction.

    `rows`, `cols`, `char_vocab` must match the frame model's config, and the
    model's `action_vocab` must be at least `TypingVocab(charset).size`
    (`TypingConfig.fitting` picks the charset from it). `document_seed` chooses
    the documents; the windows' seed is `FrameWindowSpec.seed`, so workers of a
    swarm share the documents and draw different windows.
    """

    rows: int = 48
    cols: int = 160
    char_vocab: int = 8192
    n_documents: int = 64
    document_seed: int = 0
    charset: str = PRINTABLE_CHARSET
    fold_case: bool = False
    status_line: bool = True
    min_document_chars: int = 16

    def __post_init__(self) -> None:
        check_bool("TypingConfig", "status_line", self.status_line)
        check_bool("TypingConfig", "fold_case", self.fold_case)
        check_int("TypingConfig", "rows", self.rows, 2 if self.status_line else 1)
        check_int("TypingConfig", "cols", self.cols, 2)
        check_int("TypingConfig", "char_vocab", self.char_vocab, 1)
        check_int("TypingConfig", "n_documents", self.n_documents, 1)
        check_int("TypingConfig", "document_seed", self.document_seed, 0)
        # A document is at most text_rows lines of line_width characters and the newlines between them: a longer
        # minimum left no document, and the refusal blamed n_documents (fuzz review, 2026-11-29).
        check_int("TypingConfig", "min_document_chars", self.min_document_chars, 1)
        if self.min_document_chars > self.max_document_chars:
            raise ValueError(
                f"TypingConfig.min_document_chars={self.min_document_chars!r}: expected at most "
                f"{self.max_document_chars} (the most characters a document of {self.text_rows} text rows x "
                f"{self.line_width} columns holds)"
            )
        _check_charset("TypingConfig", self.charset)

    @classmethod
    def fitting(cls, rows: int, cols: int, char_vocab: int, action_vocab: int, **fields: object) -> TypingConfig:
        """A config for a model with this geometry and action vocabulary.

        The charset is `PRINTABLE_CHARSET` when `action_vocab` has room for it,
        otherwise `COMPACT_CHARSET` with `fold_case=True`; `fields` set the rest.
        """
        check_int("TypingConfig", "action_vocab", action_vocab, 1)
        if action_vocab >= TypingVocab(PRINTABLE_CHARSET).size:
            charset: dict[str, object] = {"charset": PRINTABLE_CHARSET}
        elif action_vocab >= TypingVocab(COMPACT_CHARSET).size:
            charset = {"charset": COMPACT_CHARSET, "fold_case": True}
        else:
            raise ValueError(
                f"TypingConfig.action_vocab={action_vocab!r}: expected at least "
                f"{TypingVocab(COMPACT_CHARSET).size} (the compact charset's actions)"
            )
        return cls(rows=rows, cols=cols, char_vocab=char_vocab, **{**charset, **fields})  # type: ignore[arg-type]

    @property
    def text_rows(self) -> int:
        """Rows available to the document (all but the status line)."""
        return self.rows - 1 if self.status_line else self.rows

    @property
    def line_width(self) -> int:
        """Longest document line: cols - 1, leaving a cell for the cursor."""
        return self.cols - 1

    @property
    def max_document_chars(self) -> int:
        """The most characters a document holds: text_rows full lines and the newlines between them."""
        return self.text_rows * self.line_width + self.text_rows - 1

    @property
    def vocab(self) -> TypingVocab:
        """The action vocabulary of `charset`."""
        return TypingVocab(self.charset)


@dataclass(frozen=True)
class TypingDocument:
    """One document: `text` (lines joined by newlines, no trailing newline) and its `title`."""

    title: str
    text: str


def _stdlib_files(seed: int) -> list[tuple[str, Path]]:
    """(module name, path) of the stdlib's .py files, sorted by path, then permuted by `seed`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for filename in sorted(filenames):
            path = Path(dirpath, filename)
            if filename.endswith(".py") and path.is_file():
                found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda item: item[0])
    order = np.random.default_rng(seed).permutation(len(found))
    return [(_module_name(found[i][0]), found[i][1]) for i in order]


def _module_name(relative: str) -> str:
    parts = relative[: -len(".py")].split("/")
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _docstrings(module: str, path: Path) -> Iterator[tuple[str, str]]:
    """(title, docstring) of the module, then its classes and functions in source order."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return
    yield from _node_docstrings(tree, module)


def _node_docstrings(node: ast.AST, title: str) -> Iterator[tuple[str, str]]:
    doc = ast.get_docstring(node, clean=True)  # type: ignore[arg-type]
    if doc:
        yield title, doc
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _node_docstrings(child, f"{title}.{child.name}")


def _paragraph_lines(paragraph: str, config: TypingConfig) -> list[str] | None:
    """The paragraph reflowed and wrapped at `config.line_width`, or None if it is skipped."""
    lines = paragraph.split("\n")
    if any(line[:1].isspace() or ">>>" in line for line in lines):
        return None
    text = " ".join(paragraph.split())
    if config.fold_case:
        text = text.lower()
    if not any(ch.isalpha() for ch in text) or not set(text) <= set(config.charset):
        return None
    return textwrap.wrap(
        text, width=config.line_width, break_long_words=True, break_on_hyphens=False
    )


def _pack(paragraphs: list[list[str]], text_rows: int) -> Iterator[list[str]]:
    """Paragraphs (lists of lines) packed into documents of at most `text_rows` lines."""
    current: list[str] = []
    for lines in paragraphs:
        separated = [""] + lines if current else lines
        if len(current) + len(separated) <= text_rows:
            current.extend(separated)
            continue
        if current:
            yield current
        current = lines[:text_rows]
    if current:
        yield current


def _docstring_documents(title: str, doc: str, config: TypingConfig) -> Iterator[TypingDocument]:
    paragraphs = [_paragraph_lines(p, config) for p in doc.split("\n\n")]
    kept = [lines for lines in paragraphs if lines]
    for lines in _pack(kept, config.text_rows):
        yield TypingDocument(title=title, text="\n".join(lines))


def load_typing_documents(config: TypingConfig) -> tuple[TypingDocument, ...]:
    """The first `config.n_documents` documents; see the module docstring.

    Raises ValueError naming `n_documents` if the standard library has fewer.
    """
    documents: list[TypingDocument] = []
    seen: set[str] = set()
    short = 0
    for module, path in _stdlib_files(config.document_seed):
        for title, doc in _docstrings(module, path):
            for document in _docstring_documents(title, doc, config):
                if len(document.text) < config.min_document_chars:
                    short += 1
                    continue
                if document.text in seen:
                    continue
                seen.add(document.text)
                documents.append(document)
                if len(documents) == config.n_documents:
                    return tuple(documents)
    raise ValueError(
        f"TypingConfig.n_documents={config.n_documents!r}: expected at most {len(documents)} "
        f"(the documents the standard library yields for this geometry and charset"
        + (f"; {short} more were shorter than TypingConfig.min_document_chars={config.min_document_chars!r}"
           if short else "") + ")"
    )


@dataclass(frozen=True)
class _Layout:
    """Where a document's characters go: flat cell indices into a rows * cols frame."""

    chars: np.ndarray  # [n] int64 char ids (code point mod char_vocab)
    cells: np.ndarray  # [n] int64 cell of character s, -1 for a newline
    cursor: np.ndarray  # [n + 1] int64 cursor cell in frame s
    base: np.ndarray  # [rows * cols, 2] int64 the empty frame with the status line


def _layout(document: TypingDocument, config: TypingConfig) -> _Layout:
    n, cols = len(document.text), config.cols
    chars = np.array([ord(ch) % config.char_vocab for ch in document.text], dtype=np.int64)
    cells = np.full(n, -1, dtype=np.int64)
    cursor = np.empty(n + 1, dtype=np.int64)
    row = col = 0
    for s, ch in enumerate(document.text):
        cursor[s] = row * cols + col
        if ch == "\n":
            row, col = row + 1, 0
        else:
            cells[s] = row * cols + col
            col += 1
        if row >= config.text_rows or col >= cols:
            raise ValueError(f"document {document.title!r} does not fit {config.text_rows} x {cols}")
    cursor[n] = row * cols + col
    return _Layout(chars=chars, cells=cells, cursor=cursor, base=_empty_frame(document.title, config))


def _empty_frame(title: str, config: TypingConfig) -> np.ndarray:
    frame = np.empty((config.rows, config.cols, 2), dtype=np.int64)  # [R, C, 2]
    frame[..., 0] = SPACE
    frame[..., 1] = STYLE_EMPTY
    if config.status_line:
        status = title[: config.cols].ljust(config.cols)
        frame[-1, :, 0] = [ord(ch) % config.char_vocab for ch in status]
        frame[-1, :, 1] = STYLE_STATUS
    return frame.reshape(config.rows * config.cols, 2)  # [R*C, 2]


@dataclass
class TypingFrameSource:
    """Seeded windows of the typing stream as (frames, actions) batches; a `FrameWindowSource`.

    `config` fixes the frames and the documents (loaded once, on construction),
    `spec` the batch size, window length L and sampling seed; L may not exceed
    the stream's length `n_steps`.
    """

    config: TypingConfig
    spec: FrameWindowSpec
    vocab: TypingVocab = field(init=False, repr=False)
    documents: tuple[TypingDocument, ...] = field(init=False, repr=False)
    _layouts: list[_Layout] = field(init=False, repr=False)
    _starts: np.ndarray = field(init=False, repr=False)
    _actions: np.ndarray = field(init=False, repr=False)
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, TypingConfig):
            raise TypeError(f"TypingFrameSource.config={self.config!r}: expected a TypingConfig")
        if not isinstance(self.spec, FrameWindowSpec):
            raise TypeError(f"TypingFrameSource.spec={self.spec!r}: expected a FrameWindowSpec")
        self.vocab = self.config.vocab
        self.documents = load_typing_documents(self.config)
        self._layouts = [_layout(doc, self.config) for doc in self.documents]
        steps = [self.vocab.encode(doc.text) + [self.vocab.end_id] for doc in self.documents]
        self._starts = np.cumsum([0] + [len(s) for s in steps])  # [N + 1]
        self._actions = np.array([a for s in steps for a in s], dtype=np.int64)  # [S]
        if self.spec.window > self.n_steps:
            raise ValueError(
                f"FrameWindowSpec.window={self.spec.window!r}: expected at most the stream's "
                f"{self.n_steps} steps ({len(self.documents)} documents); raise "
                "TypingConfig.n_documents or shorten the window"
            )
        self._rng = np.random.default_rng(self.spec.seed)

    @property
    def geometry(self) -> tuple[int, int]:
        """(rows, cols) of every frame."""
        return self.config.rows, self.config.cols

    @property
    def action_vocab_size(self) -> int:
        """Actions are ids in [0, action_vocab_size): the charset, UNK, END."""
        return self.vocab.size

    @property
    def n_steps(self) -> int:
        """Length S of the cyclic stream: sum over documents of len(text) + 1."""
        return int(self._starts[-1])

    def _check_index(self, index: int) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.documents):
            raise ValueError(f"document index={index!r}: expected an int in [0, {len(self.documents)})")

    def document_start(self, index: int) -> int:
        """Stream offset of document `index`'s first (empty) frame."""
        self._check_index(index)
        return int(self._starts[index])

    def _locate(self, offset: int) -> tuple[int, int]:
        """(document, step within it) of stream offset `offset`, taken modulo S."""
        offset %= self.n_steps
        doc = int(np.searchsorted(self._starts, offset, side="right")) - 1
        return doc, offset - int(self._starts[doc])

    def _draw(self, doc: int, step: int, out: np.ndarray) -> None:
        """Frame `step` of document `doc` into `out` [R*C, 2], from its prefix."""
        layout = self._layouts[doc]
        out[:] = layout.base
        cells = layout.cells[:step]  # [step]
        typed = cells >= 0
        out[cells[typed], 0] = layout.chars[:step][typed]
        out[cells[typed], 1] = STYLE_TEXT
        out[layout.cursor[step]] = (SPACE, STYLE_CURSOR)

    def _render_into(self, offset: int, out: np.ndarray) -> None:
        """Frames of the steps offset .. offset + L - 1 into `out` [L, R*C, 2], incrementally."""
        doc, step = self._locate(offset)
        self._draw(doc, step, out[0])
        for j in range(1, out.shape[0]):
            layout = self._layouts[doc]
            if step == len(layout.chars):
                doc, step = (doc + 1) % len(self._layouts), 0
                self._draw(doc, step, out[j])
                continue
            out[j] = out[j - 1]
            cell = layout.cells[step]
            if cell >= 0:
                out[j, cell, 0] = layout.chars[step]
                out[j, cell, 1] = STYLE_TEXT
            else:
                out[j, layout.cursor[step], 1] = STYLE_EMPTY
            step += 1
            out[j, layout.cursor[step], 1] = STYLE_CURSOR

    def _action_window(self, offsets: np.ndarray, length: int) -> np.ndarray:
        index = (offsets[:, None] + np.arange(length)[None, :]) % self.n_steps  # [B, L]
        return self._actions[index]  # [B, L]

    def window(self, offset: int, length: int) -> FrameBatch:
        """(frames [length, R, C, 2], actions [length]) of the stream from `offset` (mod S)."""
        check_int("TypingFrameSource.window", "offset", offset, 0)
        check_int("TypingFrameSource.window", "length", length, 1)
        rows, cols = self.geometry
        out = np.empty((length, rows * cols, 2), dtype=np.int64)  # [L, R*C, 2]
        self._render_into(offset, out)
        actions = self._action_window(np.array([offset]), length)[0]  # [L]
        return torch.from_numpy(out).view(length, rows, cols, 2), torch.from_numpy(actions)

    def episode(self, index: int) -> FrameBatch:
        """Document `index` typed from its empty frame to END: ([n + 1, R, C, 2], [n + 1])."""
        self._check_index(index)
        start, stop = int(self._starts[index]), int(self._starts[index + 1])
        return self.window(start, stop - start)

    def next_window(self) -> TypingWindow:
        """The next batch as a lazy `FrameWindow`: offsets drawn now, frames rendered per chunk."""
        offsets = self._rng.integers(0, self.n_steps, size=self.spec.batch_size)  # [B]
        return TypingWindow(self, offsets, self.spec.window)

    def next_batch(self) -> FrameBatch:
        """The next (frames [B, L, R, C, 2], actions [B, L]), int64, at uniform random offsets."""
        return self.next_window().chunk(0, self.spec.window)


@dataclass(frozen=True)
class TypingWindow:
    """B windows of the typing stream from `offsets` [B], `length` steps each; a `FrameWindow`.

    `chunk(start, stop)` renders steps start .. stop - 1 of every window (each from its
    document's prefix, then incrementally), so memory holds one chunk, never the window.
    """

    source: TypingFrameSource
    offsets: np.ndarray  # [B] int64 stream offsets
    length: int

    @property
    def batch_size(self) -> int:
        return len(self.offsets)

    def chunk(self, start: int, stop: int) -> FrameBatch:
        """(frames [B, stop - start, R, C, 2], actions [B, stop - start]), int64."""
        check_chunk(self, start, stop)
        count, (rows, cols) = stop - start, self.source.geometry
        out = np.empty((self.batch_size, count, rows * cols, 2), dtype=np.int64)  # [B, n, R*C, 2]
        for b, offset in enumerate(self.offsets):
            self.source._render_into(int(offset) + start, out[b])
        frames = torch.from_numpy(out).view(self.batch_size, count, rows, cols, 2)
        return frames, torch.from_numpy(self.source._action_window(self.offsets + start, count))
