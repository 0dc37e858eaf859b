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
convention (char id = code point mod char_vocab, small style ids) by contract.
"""

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
