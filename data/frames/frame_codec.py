"""The `.rcf` frame stream: delta, run-length, palette, bit-packed, zlib blocks; see docs/FRAME_FORMAT.md.

`FrameWriter(path, rows, cols)` takes (code points [rows, cols], styles [rows,
cols], action code) per step; `FrameReader(path)` gives `frame(i)` ([rows,
cols, 2] int64 (code point, style)), `frames(start, count)` and
`actions(start, count)` with random access: only frame i's block is read and
decoded. Every structure is checksummed (CRC-32); a truncated or corrupted
file raises `FrameFormatError`, never returns wrong frames.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np

MAGIC = b"RCFRAMES"
VERSION = 1
BLOCK_MAGIC = b"FBLK"
END_MAGIC = b"FEND"
HEADER = struct.Struct("<8sHHHHI")  # magic, version, rows, cols, block_frames, n_styles
HEADER_SIZE = HEADER.size + 4  # + crc32
BLOCK_HEADER = struct.Struct("<4sQIIIII")  # magic, first frame, n frames, raw len, comp len, raw crc, comp crc
INDEX_ENTRY = struct.Struct("<QQI")  # offset, first frame, n frames
TRAILER = struct.Struct("<QIQI4s")  # index offset, n blocks, n frames, index crc, magic
BLANK = (32 << 8) | 0  # (space, style 0): what a block's first frame is a delta against


class FrameFormatError(ValueError):
    """The frame file is truncated, corrupted, or not a frame file."""


def _varint(n: int, out: bytearray) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(buf):
            raise FrameFormatError("varint runs past the end of a block")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


def _breaks(cur: np.ndarray, changed: np.ndarray) -> np.ndarray:
    """Run starts along the last axis: where `changed` flips or a changed cell's value changes."""
    brk = np.empty(cur.shape, bool)
    brk[..., 0] = True
    brk[..., 1:] = (changed[..., 1:] != changed[..., :-1]) | (changed[..., 1:] & (cur[..., 1:] != cur[..., :-1]))
    return brk


def encode_frame(
    cur: np.ndarray, prev: np.ndarray, palette: dict[int, int], bits: int,
    changed: np.ndarray | None = None, brk: np.ndarray | None = None,
) -> bytes:
    """Bit-pack flat int64 cell keys `cur` as a delta against `prev` (see FRAME_FORMAT.md).

    `changed` (cur != prev) and `brk` (`_breaks`) may be passed precomputed.
    """
    n = cur.shape[0]
    if changed is None:
        changed = cur != prev
    if brk is None:
        brk = _breaks(cur, changed)
    sa = np.flatnonzero(brk)
    chg = changed[sa].tolist()
    vals = cur[sa].tolist()
    before = cur[np.maximum(sa - 1, 0)].tolist()
    starts = sa.tolist()
    starts.append(n)
    acc = 0
    nbits = 0

    def special(kind: int, length: int) -> None:
        nonlocal acc, nbits
        while length > 0:
            k = min(length, 0xFFFF)
            if k < 256:
                acc = (acc << 11) | (0b100 | (kind << 1)) << 8 | k
                nbits += 11
            else:
                acc = (acc << 19) | (0b101 | (kind << 1)) << 16 | k
                nbits += 19
            length -= k

    for j, (s, e) in enumerate(itertools.pairwise(starts)):
        if not chg[j]:
            special(0, e - s)
            continue
        v = vals[j]
        if s > 0 and before[j] == v:
            special(1, e - s)
        else:
            acc = (acc << (1 + bits)) | palette[v]
            nbits += 1 + bits
            if e - s > 1:
                special(1, e - s - 1)
    pad = -nbits % 8
    return (acc << pad).to_bytes((nbits + pad) // 8, "big")


def decode_frame(payload: bytes, prev: np.ndarray, palette: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of `encode_frame`; raises FrameFormatError on malformed input."""
    n = prev.shape[0]
    out = prev.copy()
    total = len(payload) * 8
    s = bin(int.from_bytes(payload, "big"))[2:].zfill(total) if payload else ""
    pos = i = 0
    while i < n:
        if pos >= total:
            raise FrameFormatError("frame payload ends before the frame is complete")
        if s[pos] == "0":
            idx = int(s[pos + 1 : pos + 1 + bits], 2) if pos + 1 + bits <= total else -1
            if idx < 0 or idx >= len(palette):
                raise FrameFormatError(f"palette index {idx} out of range ({len(palette)} entries)")
            out[i] = palette[idx]
            pos += 1 + bits
            i += 1
            continue
        kind = s[pos + 1 : pos + 2]
        wide = s[pos + 2 : pos + 3] == "1"
        width = 16 if wide else 8
        if pos + 3 + width > total:
            raise FrameFormatError("run header runs past the frame payload")
        length = int(s[pos + 3 : pos + 3 + width], 2)
        pos += 3 + width
        if length == 0 or i + length > n:
            raise FrameFormatError(f"run of {length} cells at cell {i} of {n}")
        if kind == "1":
            if i == 0:
                raise FrameFormatError("repeat run at the first cell")
            out[i : i + length] = out[i - 1]
        i += length
    if total - pos >= 8:
        raise FrameFormatError("trailing data after a frame")
    return out


def keys_of(cp: np.ndarray, st: np.ndarray) -> np.ndarray:
    return (cp.astype(np.int64).ravel() << 8) | st.astype(np.int64).ravel()


class FrameWriter:
    """Writes frames and their actions in blocks of `block_frames` frames."""

    def __init__(self, path: str | Path, rows: int, cols: int, block_frames: int = 256, n_styles: int = 16, level: int = 6) -> None:
        self.path = Path(path)
        self.rows, self.cols, self.block_frames, self.level = rows, cols, block_frames, level
        self.f = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        head = HEADER.pack(MAGIC, VERSION, rows, cols, block_frames, n_styles)
        self.f.write(head + struct.pack("<I", zlib.crc32(head)))
        self.index: list[tuple[int, int, int]] = []
        self.pending: list[np.ndarray] = []
        self.actions: list[int] = []
        self.n_frames = 0
        self.raw_bytes = 0

    def write(self, cp: np.ndarray, st: np.ndarray, action: int) -> None:
        self.pending.append(keys_of(cp, st))
        self.actions.append(int(action))
        if len(self.pending) == self.block_frames:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        frames = self.pending
        prev = np.full(self.rows * self.cols, BLANK, np.int64)
        cur = np.stack(frames)
        before = np.concatenate([prev[None], cur[:-1]])
        changed = cur != before
        brk = _breaks(cur, changed)
        pal = np.unique(cur[changed])
        if len(pal) == 0:
            pal = np.array([BLANK], np.int64)
        bits = max(1, int(len(pal) - 1).bit_length())
        palette = {int(v): i for i, v in enumerate(pal.tolist())}
        raw = bytearray()
        _varint(len(pal), raw)
        for v in pal.tolist():
            _varint(v, raw)
        for a in self.actions:
            _varint(a, raw)
        for k in range(len(frames)):
            payload = encode_frame(cur[k], before[k], palette, bits, changed[k], brk[k])
            _varint(len(payload), raw)
            raw += payload
        comp = zlib.compress(bytes(raw), self.level)
        first = self.n_frames
        self.index.append((self.f.tell(), first, len(frames)))
        self.f.write(BLOCK_HEADER.pack(BLOCK_MAGIC, first, len(frames), len(raw), len(comp), zlib.crc32(raw), zlib.crc32(comp)))
        self.f.write(comp)
        self.n_frames += len(frames)
        self.raw_bytes += len(frames) * self.rows * self.cols * 5
        self.pending, self.actions = [], []

    def close(self) -> None:
        self._flush()
        index = b"".join(INDEX_ENTRY.pack(*e) for e in self.index)
        offset = self.f.tell()
        self.f.write(index)
        self.f.write(TRAILER.pack(offset, len(self.index), self.n_frames, zlib.crc32(index), END_MAGIC))
        self.f.close()

    def __enter__(self) -> FrameWriter:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FrameReader:
    """Random access to a frame file; keeps the last `cache_blocks` decoded blocks."""

    def __init__(self, path: str | Path, cache_blocks: int = 2) -> None:
        self.path = Path(path)
        self.f = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        data = self.f.read(HEADER_SIZE)
        if len(data) < HEADER_SIZE or data[:8] != MAGIC:
            raise FrameFormatError(f"{self.path}: not a frame file (bad magic or too short)")
        _, version, rows, cols, bf, n_styles = HEADER.unpack(data[: HEADER.size])
        if struct.unpack("<I", data[HEADER.size :])[0] != zlib.crc32(data[: HEADER.size]):
            raise FrameFormatError(f"{self.path}: header checksum mismatch (corrupted)")
        if version != VERSION:
            raise FrameFormatError(f"{self.path}: format version {version}, expected {VERSION}")
        self.rows, self.cols, self.block_frames, self.n_styles = rows, cols, bf, n_styles
        size = self.f.seek(0, 2)
        if size < HEADER_SIZE + TRAILER.size:
            raise FrameFormatError(f"{self.path}: truncated (no trailer)")
        self.f.seek(size - TRAILER.size)
        offset, n_blocks, n_frames, crc, end = TRAILER.unpack(self.f.read(TRAILER.size))
        if end != END_MAGIC:
            raise FrameFormatError(f"{self.path}: truncated or corrupted (trailer magic missing)")
        if offset + n_blocks * INDEX_ENTRY.size != size - TRAILER.size:
            raise FrameFormatError(f"{self.path}: truncated or corrupted (index does not fit the file)")
        self.f.seek(offset)
        index = self.f.read(n_blocks * INDEX_ENTRY.size)
        if zlib.crc32(index) != crc:
            raise FrameFormatError(f"{self.path}: index checksum mismatch (corrupted)")
        self.index = [INDEX_ENTRY.unpack_from(index, k * INDEX_ENTRY.size) for k in range(n_blocks)]
        self.n_frames = n_frames
        self._cache: OrderedDict[int, tuple[list[np.ndarray], np.ndarray]] = OrderedDict()
        self._cache_blocks = cache_blocks

    def __len__(self) -> int:
        return self.n_frames

    def close(self) -> None:
        self.f.close()

    def _block(self, b: int) -> tuple[list[np.ndarray], np.ndarray]:
        if b in self._cache:
            self._cache.move_to_end(b)
            return self._cache[b]
        offset, first, count = self.index[b]
        self.f.seek(offset)
        head = self.f.read(BLOCK_HEADER.size)
        if len(head) < BLOCK_HEADER.size:
            raise FrameFormatError(f"{self.path}: block {b} truncated")
        magic, first2, count2, raw_len, comp_len, raw_crc, comp_crc = BLOCK_HEADER.unpack(head)
        if magic != BLOCK_MAGIC or first2 != first or count2 != count:
            raise FrameFormatError(f"{self.path}: block {b} header corrupted")
        comp = self.f.read(comp_len)
        if len(comp) != comp_len or zlib.crc32(comp) != comp_crc:
            raise FrameFormatError(f"{self.path}: block {b} (frames {first}..{first + count - 1}) checksum mismatch (corrupted)")
        try:
            raw = zlib.decompress(comp)
        except zlib.error as e:
            raise FrameFormatError(f"{self.path}: block {b} does not decompress: {e}") from None
        if len(raw) != raw_len or zlib.crc32(raw) != raw_crc:
            raise FrameFormatError(f"{self.path}: block {b} decompressed checksum mismatch (corrupted)")
        n_pal, pos = _read_varint(raw, 0)
        pal = np.empty(n_pal, np.int64)
        for k in range(n_pal):
            v, pos = _read_varint(raw, pos)
            pal[k] = v
        bits = max(1, int(n_pal - 1).bit_length())
        actions = np.empty(count, np.int64)
        for k in range(count):
            actions[k], pos = _read_varint(raw, pos)
        frames: list[np.ndarray] = []
        prev = np.full(self.rows * self.cols, BLANK, np.int64)
        for _ in range(count):
            ln, pos = _read_varint(raw, pos)
            if pos + ln > len(raw):
                raise FrameFormatError(f"{self.path}: block {b} frame payload past the block's end")
            prev = decode_frame(raw[pos : pos + ln], prev, pal, bits)
            frames.append(prev)
            pos += ln
        if pos != len(raw):
            raise FrameFormatError(f"{self.path}: block {b} has trailing bytes")
        self._cache[b] = (frames, actions)
        while len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return frames, actions

    def _locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.n_frames:
            raise IndexError(f"frame {i} out of range [0, {self.n_frames})")
        b = i // self.block_frames
        if b >= len(self.index) or not (self.index[b][1] <= i < self.index[b][1] + self.index[b][2]):
            b = next(k for k, (_, first, cnt) in enumerate(self.index) if first <= i < first + cnt)
        return b, i - self.index[b][1]

    def frame(self, i: int) -> np.ndarray:
        """Frame i as int64 [rows, cols, 2] (code point, style)."""
        b, k = self._locate(i)
        keys = self._block(b)[0][k].reshape(self.rows, self.cols)
        return np.stack([keys >> 8, keys & 0xFF], axis=-1)

    def frames(self, start: int, count: int) -> np.ndarray:
        return np.stack([self.frame(i) for i in range(start, start + count)]) if count else np.zeros((0, self.rows, self.cols, 2), np.int64)

    def action(self, i: int) -> int:
        b, k = self._locate(i)
        return int(self._block(b)[1][k])

    def actions(self, start: int = 0, count: int | None = None) -> np.ndarray:
        count = self.n_frames - start if count is None else count
        return np.array([self.action(i) for i in range(start, start + count)], np.int64)

    def __enter__(self) -> FrameReader:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
