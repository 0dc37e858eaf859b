"""rcswarm.data.frames: frame-and-action training data for the frame model.

- `window`: the interface every frame data source implements
  (`FrameWindowSource`, `FrameWindowSpec`) and the frame/action alignment.
- `typed_text`: the fully observable typing frames of the paper's Appendix G,
  typed from standard-library docstrings (`TypingFrameSource`).

Nothing here imports the rest of rcswarm; frames follow the frame model's cell
convention (char id = code point mod char_vocab, small style ids) by contract.
"""

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
from rcswarm.data.frames.window import FrameBatch, FrameWindowSource, FrameWindowSpec, check_frame_batch

__all__ = [
    "COMPACT_CHARSET",
    "N_STYLES",
    "PRINTABLE_CHARSET",
    "STYLE_CURSOR",
    "STYLE_EMPTY",
    "STYLE_STATUS",
    "STYLE_TEXT",
    "FrameBatch",
    "FrameWindowSource",
    "FrameWindowSpec",
    "TypingConfig",
    "TypingDocument",
    "TypingFrameSource",
    "TypingVocab",
    "check_frame_batch",
    "load_typing_documents",
]
