"""Tests of the fully observable typing frames (rcswarm.data.frames) and the window interface."""

from __future__ import annotations

import pytest
import torch

from rcswarm.data.frames import (
    COMPACT_CHARSET,
    N_STYLES,
    PRINTABLE_CHARSET,
    STYLE_CURSOR,
    STYLE_EMPTY,
    STYLE_STATUS,
    STYLE_TEXT,
    FrameWindowSource,
    FrameWindowSpec,
    TypingConfig,
    TypingFrameSource,
    TypingVocab,
    check_frame_batch,
    load_typing_documents,
)
from rcswarm.models import registry
from rcswarm.models.frame import frame_cells
from tests.helpers.data import CONFIG


@pytest.fixture(scope="module")
def source() -> TypingFrameSource:
    return TypingFrameSource(CONFIG, FrameWindowSpec(batch_size=6, window=160, seed=3))


def read_back(frame: torch.Tensor, config: TypingConfig) -> str:
    """The text a frame [R, C, 2] shows: each row's TEXT cells up to the cursor's row."""
    text_area = frame[: config.text_rows]  # [R', C, 2]
    cursor = (text_area[..., 1] == STYLE_CURSOR).nonzero().tolist()
    assert len(cursor) == 1, cursor
    cursor_row, cursor_col = cursor[0]
    lines = []
    for r, row in enumerate(text_area.tolist()):
        styles = [style for _, style in row]
        n_typed = styles.count(STYLE_TEXT)
        assert styles[:n_typed] == [STYLE_TEXT] * n_typed, f"row {r}: typed cells are not a prefix"
        assert all(char == ord(" ") for char, style in row if style != STYLE_TEXT)
        if r < cursor_row:
            lines.append("".join(chr(char) for char, _ in row[:n_typed]))
        elif r == cursor_row:
            assert n_typed == cursor_col, (r, n_typed, cursor_col)
            lines.append("".join(chr(char) for char, _ in row[:n_typed]))
        else:
            assert n_typed == 0, f"row {r} below the cursor has typed cells"
    return "\n".join(lines)


def test_every_document_fits_and_every_frame_reads_back_as_the_text_typed_so_far(
    source: TypingFrameSource,
) -> None:
    assert len(source.documents) == CONFIG.n_documents
    for index, document in enumerate(source.documents):
        lines = document.text.split("\n")
        assert len(lines) <= CONFIG.text_rows
        assert max(len(line) for line in lines) <= CONFIG.cols - 1
        frames, _ = source.episode(index)  # [n + 1, R, C, 2]
        assert frames.shape[0] == len(document.text) + 1
        status = "".join(chr(c) for c in frames[0, -1, :, 0].tolist())
        assert status == document.title[: CONFIG.cols].ljust(CONFIG.cols)
        for step, frame in enumerate(frames):
            assert read_back(frame, CONFIG) == document.text[:step], (document.title, step)
            assert torch.equal(frame[-1], frames[0, -1])
            assert (frame[-1, :, 1] == STYLE_STATUS).all()


def test_consecutive_frames_differ_only_by_the_typed_character_and_the_cursor(
    source: TypingFrameSource,
) -> None:
    cols = CONFIG.cols
    newlines = 0
    for index in range(4):
        text = source.documents[index].text
        frames, _ = source.episode(index)
        flat = frames.flatten(1, 2)  # [n + 1, R*C, 2]
        for step, ch in enumerate(text):
            before_cursor = int((flat[step, :, 1] == STYLE_CURSOR).nonzero())
            after_cursor = int((flat[step + 1, :, 1] == STYLE_CURSOR).nonzero())
            changed = set((flat[step + 1] != flat[step]).any(-1).nonzero().flatten().tolist())
            assert changed == {before_cursor, after_cursor}, (index, step, repr(ch))
            if ch == "\n":
                newlines += 1
                assert flat[step + 1, before_cursor].tolist() == [ord(" "), STYLE_EMPTY]
                assert after_cursor == (before_cursor // cols + 1) * cols
            else:
                assert flat[step + 1, before_cursor].tolist() == [ord(ch), STYLE_TEXT]
                assert after_cursor == before_cursor + 1
            assert flat[step + 1, after_cursor].tolist() == [ord(" "), STYLE_CURSOR]
    assert newlines > 0


def test_actions_decode_back_to_the_document_and_end_with_end(source: TypingFrameSource) -> None:
    vocab = CONFIG.vocab
    for index, document in enumerate(source.documents):
        _, actions = source.episode(index)
        assert actions.tolist() == vocab.encode(document.text) + [vocab.end_id]
        assert vocab.decode(actions.tolist()) == document.text
        assert vocab.unk_id not in actions.tolist()
    assert vocab.decode([0, vocab.unk_id, PRINTABLE_CHARSET.index("\n"), vocab.end_id]) == " \ufffd\n"
    assert TypingVocab("ab \n").encode("a\u00e9b") == [0, 4, 1]


def test_windows_are_aligned_action_t_appears_in_frame_t_plus_one(source: TypingFrameSource) -> None:
    vocab = CONFIG.vocab
    frames, actions = source.next_batch()  # [B, L, R, C, 2], [B, L]
    flat = frames.flatten(2, 3)  # [B, L, R*C, 2]
    ends = 0
    for b in range(frames.shape[0]):
        for t in range(frames.shape[1] - 1):
            cursor = int((flat[b, t, :, 1] == STYLE_CURSOR).nonzero())
            action = int(actions[b, t])
            if action == vocab.end_id:
                ends += 1
                assert (flat[b, t + 1, :, 1] != STYLE_TEXT).all()
                assert flat[b, t + 1, 0].tolist() == [ord(" "), STYLE_CURSOR]
                continue
            ch = vocab.charset[action]
            expected = [ord(" "), STYLE_EMPTY] if ch == "\n" else [ord(ch), STYLE_TEXT]
            assert flat[b, t + 1, cursor].tolist() == expected, (b, t, repr(ch))
    assert ends > 0, "no window crossed a document boundary"


def test_a_window_starting_mid_document_matches_the_incremental_episode(
    source: TypingFrameSource,
) -> None:
    episode_frames, episode_actions = source.episode(2)
    n_steps = episode_frames.shape[0]
    start = source.document_start(2)
    frames, actions = source.window(start + 7, n_steps - 7 + 5)  # into document 3
    assert torch.equal(frames[: n_steps - 7], episode_frames[7:])
    assert torch.equal(actions[: n_steps - 7], episode_actions[7:])
    next_frames, _ = source.episode(3)
    assert torch.equal(frames[n_steps - 7 :], next_frames[:5])
    last = len(source.documents) - 1
    wrapped, _ = source.window(source.document_start(last), source.n_steps - source.document_start(last) + 3)
    assert torch.equal(wrapped[-3:], source.episode(0)[0][:3])
    with pytest.raises(ValueError, match=r"document index=16: expected an int in \[0, 16\)"):
        source.episode(16)


def test_batches_are_deterministic_by_seed_and_documents_by_document_seed() -> None:
    spec = FrameWindowSpec(batch_size=3, window=32, seed=11)
    a, b = TypingFrameSource(CONFIG, spec), TypingFrameSource(CONFIG, spec)
    for _ in range(3):
        (fa, aa), (fb, ab) = a.next_batch(), b.next_batch()
        assert torch.equal(fa, fb) and torch.equal(aa, ab)
    other = TypingFrameSource(CONFIG, FrameWindowSpec(batch_size=3, window=32, seed=12))
    assert other.documents == a.documents
    assert not torch.equal(other.next_batch()[1], TypingFrameSource(CONFIG, spec).next_batch()[1])
    reseeded = load_typing_documents(TypingConfig(rows=12, cols=40, char_vocab=256, n_documents=16, document_seed=1))
    assert reseeded != a.documents
    assert load_typing_documents(CONFIG) == a.documents


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rows": 1}, r"TypingConfig\.rows=1: expected an int >= 2"),
        ({"rows": 0, "status_line": False}, r"TypingConfig\.rows=0: expected a positive int"),
        ({"cols": 1}, r"TypingConfig\.cols=1: expected an int >= 2"),
        ({"cols": 12.0}, r"TypingConfig\.cols=12\.0"),
        ({"char_vocab": 0}, r"TypingConfig\.char_vocab=0: expected a positive int"),
        ({"n_documents": True}, r"TypingConfig\.n_documents=True"),
        ({"charset": "abc"}, r"TypingConfig\.charset='abc': expected it to contain newline and space"),
        ({"charset": "aa \n"}, r"TypingConfig\.charset=.*no repeated character"),
        ({"status_line": 1}, r"TypingConfig\.status_line=1: expected a bool"),
    ],
)
def test_config_validation_names_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TypingConfig(**fields)  # type: ignore[arg-type]


def test_window_spec_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"FrameWindowSpec\.batch_size=0: expected a positive int"):
        FrameWindowSpec(batch_size=0, window=4)
    with pytest.raises(ValueError, match=r"FrameWindowSpec\.window=-1"):
        FrameWindowSpec(batch_size=1, window=-1)
    with pytest.raises(ValueError, match=r"FrameWindowSpec\.seed=-2: expected an int >= 0"):
        FrameWindowSpec(batch_size=1, window=4, seed=-2)
    small = TypingConfig(rows=12, cols=40, char_vocab=256, n_documents=2)
    with pytest.raises(ValueError, match=r"FrameWindowSpec\.window=100000: expected at most"):
        TypingFrameSource(small, FrameWindowSpec(batch_size=1, window=100_000))


def test_a_batch_has_the_promised_shapes_dtypes_and_ranges(source: TypingFrameSource) -> None:
    assert isinstance(source, FrameWindowSource)
    assert source.geometry == (12, 40)
    assert source.action_vocab_size == len(PRINTABLE_CHARSET) + 2 == 98
    frames, actions = source.next_batch()
    assert frames.shape == (6, 160, 12, 40, 2) and frames.dtype == torch.int64
    assert actions.shape == (6, 160) and actions.dtype == torch.int64
    check_frame_batch(source, source.spec, (frames, actions))
    assert int(frames[..., 1].max()) < N_STYLES
    assert int(frames[..., 0].max()) < CONFIG.char_vocab
    with pytest.raises(ValueError, match="actions has shape"):
        check_frame_batch(source, source.spec, (frames, actions[:, 1:]))
    with pytest.raises(ValueError, match=r"expected ids in \[0, 98\)"):
        check_frame_batch(source, source.spec, (frames, actions + 98))


def test_cells_follow_the_frame_models_convention_and_feed_the_tiny_model() -> None:
    model = registry.build_model("frame", "tiny", seed=0)
    mc = model.config
    config = TypingConfig.fitting(mc.rows, mc.cols, mc.char_vocab, mc.action_vocab, n_documents=8)
    assert config.charset == COMPACT_CHARSET and config.fold_case
    assert N_STYLES <= mc.n_styles
    source = TypingFrameSource(config, FrameWindowSpec(batch_size=2, window=24, seed=0))
    assert source.action_vocab_size == mc.action_vocab == 64
    document = source.documents[0]
    assert document.text == document.text.lower()
    frames, _ = source.episode(0)
    last = frames[-1]  # [R, C, 2]
    codepoints = torch.full((mc.rows, mc.cols), ord(" "))
    styles = torch.full((mc.rows, mc.cols), STYLE_EMPTY)
    for r, line in enumerate(document.text.split("\n")):
        codepoints[r, : len(line)] = torch.tensor([ord(ch) for ch in line], dtype=torch.long)
        styles[r, : len(line)] = STYLE_TEXT
    lines = document.text.split("\n")
    styles[len(lines) - 1, len(lines[-1])] = STYLE_CURSOR
    codepoints[-1] = torch.tensor([ord(ch) for ch in document.title[: mc.cols].ljust(mc.cols)])
    styles[-1] = STYLE_STATUS
    assert torch.equal(last, frame_cells(codepoints, styles, mc.char_vocab))
    batch_frames, batch_actions = source.next_batch()
    logits = model(batch_frames)
    assert logits.shape == (2, 24, mc.action_vocab)
    loss = model.core_loss(model.encode(batch_frames), batch_actions)
    assert torch.isfinite(loss)


def test_fitting_rejects_a_too_small_action_vocabulary() -> None:
    assert TypingConfig.fitting(12, 40, 256, 512).charset == PRINTABLE_CHARSET
    with pytest.raises(ValueError, match=r"TypingConfig\.action_vocab=63: expected at least 64"):
        TypingConfig.fitting(12, 40, 256, 63)
