"""rcswarm.models.frame: the recurrence-complete frame-based action model, registered as "frame".

After "Recurrence-Complete Frame-based Action Models" (Section 10): a terminal
frame (rows x cols cells of character + style) is embedded by a frame head
(full self-attention with pooling, then a reduction LSTM; `frame_head.py`), and a
residual stack of LSTM + MLP layers runs over the frame embeddings and predicts
the next action token (`model.py`).

How it differs from the registry's generic contract, and how the worker feeds it:

- Inputs are frames, not token ids. A batch is the pair `(frames, actions)`:
  `frames` an integer tensor [B, L, rows, cols, 2] whose last axis is
  (char id in [0, char_vocab), style id in [0, n_styles)) (`frame_cells` buckets
  Unicode code points), and `actions` a LongTensor [B, L] in [0, action_vocab)
  where actions[:, t] is the action taken after observing frame t.
  `model(frames)` returns logits [B, L, action_vocab] and the loss is the
  cross-entropy of logits against actions (`model.core_loss`). Any integer
  dtype works for frames (int16 keeps a long window of 48 x 160 frames small).
- The previous action is not an input. The paper feeds only frame embeddings to
  the main model: a frame is "a complete representation of the input at time
  t", so the effect of the action taken after frame t - 1 is visible in frame t.
- Otherwise the contract holds: causal over frames, `config.vocab_size` is the
  action vocabulary, float32 parameters in construction order, and
  `registry.build_model("frame", preset, seed=s)` is deterministic.
- It implements the `rcswarm.models.protocols.StepModel` protocol: for long
  windows train with `rcswarm.train.bptt.streaming.streaming_backward`, which
  uses `model.encode` / `model.core_loss` and keeps at most k frame heads'
  activations alive.

What the paper fixes and what is ours: the paper gives the layout (attention +
pooling + L_t blocks + reduction LSTM; residual LSTM/MLP main stack with a
D -> 4D -> D MLP), 48 x 160 frames, D = H = 768, P = 2, L_t (n_layer) 3 / 6 / 12,
L_s (n_seq) 2 and the action tokenizer's 20000 tokens. Ours: mean pooling of
horizontally adjacent pairs, additive row/column embeddings, pre-LN blocks with
12 heads, 8192 character buckets, 256 styles, the H -> D projection, and the
initialization.

Presets (exact parameter counts): "tiny" 105,376; "small" 2,153,216;
"82m" 81,075,456; "103m" 102,339,072; "145m" 144,866,304.
"""

from rcswarm.models.frame.config import FrameModelConfig
from rcswarm.models.frame.frame_head import FrameHead, frame_cells
from rcswarm.models.frame.model import FrameActionModel, LSTMState
from rcswarm.models.frame.presets import NOMINAL_PARAMETERS, PRESETS, count_parameters
from rcswarm.models.registry import ModelEntry, register

register(
    ModelEntry(
        name="frame",
        config_cls=FrameModelConfig,
        build=FrameActionModel,
        presets=PRESETS,
        description=(
            "Frame-based action model: attention + pooling frame head with a reduction LSTM, "
            "residual LSTM + MLP stack over frames; inputs are frames [B, L, rows, cols, 2]."
        ),
    )
)

__all__ = [
    "NOMINAL_PARAMETERS",
    "PRESETS",
    "FrameActionModel",
    "FrameHead",
    "FrameModelConfig",
    "LSTMState",
    "count_parameters",
    "frame_cells",
]
