"""rcswarm.data.frames: frame-and-action training data for the frame model.

- `window`: the interface every frame data source implements
  (`FrameWindowSource`, `FrameWindowSpec`), the frame/action alignment, and
  `FrameWindow`, one batch served a chunk of steps at a time (`TensorWindow`
  for a materialized batch; `next_window()` of the typing and git sources).
- `typed_text`: the fully observable typing frames of the paper's Appendix G,
  typed from standard-library docstrings (`TypingFrameSource`).
- `git_frames` (with `git_replay`, `git_editor`, `frame_codec`,
  `action_tokenizer`, `cli`): git histories replayed as editor sessions, stored
  in the `.rcf` frame format (docs/FRAME_FORMAT.md), loaded by `GitFrameSource`.

Nothing here imports the rest of rcswarm; frames follow the frame model's cell
convention (char id = code point mod char_vocab, small style ids) by contract. Each name below loads its
module on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_HOMES = {
    "rcswarm.data.frames.action_tokenizer": ("ActionTokenizer",),
    "rcswarm.data.frames.frame_codec": ("FrameFormatError", "FrameReader", "FrameWriter"),
    "rcswarm.data.frames.git_editor": ("Editor", "ReplayError"),
    "rcswarm.data.frames.git_frames": ("GitFrameSource", "RepoInput", "build_git_dataset", "build_git_frames"),
    "rcswarm.data.frames.git_replay": ("ReplayStats", "replay"),
    "rcswarm.data.frames.typed_text": (
        "COMPACT_CHARSET", "N_STYLES", "PRINTABLE_CHARSET", "STYLE_CURSOR", "STYLE_EMPTY", "STYLE_STATUS", "STYLE_TEXT",
        "TypingConfig", "TypingDocument", "TypingFrameSource", "TypingVocab", "load_typing_documents",
    ),
    "rcswarm.data.frames.window": (
        "FrameBatch", "FrameWindow", "FrameWindowSource", "FrameWindowSpec", "TensorWindow", "check_frame_batch",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "COMPACT_CHARSET",
    "N_STYLES",
    "PRINTABLE_CHARSET",
    "STYLE_CURSOR",
    "STYLE_EMPTY",
    "STYLE_STATUS",
    "STYLE_TEXT",
    "ActionTokenizer",
    "Editor",
    "FrameBatch",
    "FrameFormatError",
    "FrameReader",
    "FrameWindow",
    "FrameWindowSource",
    "FrameWindowSpec",
    "FrameWriter",
    "GitFrameSource",
    "ReplayError",
    "ReplayStats",
    "RepoInput",
    "TensorWindow",
    "TypingConfig",
    "TypingDocument",
    "TypingFrameSource",
    "TypingVocab",
    "build_git_dataset",
    "build_git_frames",
    "check_frame_batch",
    "load_typing_documents",
    "replay",
]

if TYPE_CHECKING:
    from rcswarm.data.frames.action_tokenizer import ActionTokenizer
    from rcswarm.data.frames.frame_codec import FrameFormatError, FrameReader, FrameWriter
    from rcswarm.data.frames.git_editor import Editor, ReplayError
    from rcswarm.data.frames.git_frames import GitFrameSource, RepoInput, build_git_dataset, build_git_frames
    from rcswarm.data.frames.git_replay import ReplayStats, replay
    from rcswarm.data.frames.typed_text import (
        COMPACT_CHARSET,
        N_STYLES,
        PRINTABLE_CHARSET,
        STYLE_CURSOR,
        STYLE_EMPTY,
        STYLE_STATUS,
        STYLE_TEXT,
        TypingConfig,
        TypingDocument,
        TypingFrameSource,
        TypingVocab,
        load_typing_documents,
    )
    from rcswarm.data.frames.window import (
        FrameBatch,
        FrameWindow,
        FrameWindowSource,
        FrameWindowSpec,
        TensorWindow,
        check_frame_batch,
    )


def __getattr__(name: str) -> Any:
    """A name of `__all__`, from its module, imported on first use: a worker training on text imports
    `rcswarm.data.frames.window` (streaming BPTT's interface) without the editor, the replay or the typing
    source (0.2–0.3 s of its start-up, issue #31)."""
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_HOME_OF[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
