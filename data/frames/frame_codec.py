"""The `.rcf` frame stream (version 2): row deltas, region scrolls, byte-aligned streams, zlib blocks.

See docs/FRAME_FORMAT.md. `FrameWriter(path, rows, cols)` takes (code points
[rows, cols], styles [rows, cols], action code) per step (`write`), or the
screen as per-row strings plus the rows an action damaged (`write_rows`, the
editor's fast path); `FrameReader(path)` gives `frame(i)` ([rows, cols, 2]
int64 (code point, style)), `frames(start, count)` and `actions(start, count)`
with random access: only frame i's block is read and decoded. Every structure
is checksummed (CRC-32); a truncated or corrupted file raises
`FrameFormatError`, never returns wrong frames. A block decodes into
block_frames x rows x cols x 5 bytes at most, which both ends hold to
`DECODED_BLOCK_BUDGET` (a small file cannot make the reader allocate gigabytes).
"""

from __future__ import annotations

import bisect
import itertools
import struct
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np

MAGIC = b"RCFRAMES"
VERSION = 2
BLOCK_MAGIC = b"FBLK"
END_MAGIC = b"FEND"
HEADER = struct.Struct("<8sHHHHI")  # magic, version, rows, cols, block_frames, n_styles
HEADER_SIZE = HEADER.size + 4  # + crc32
BLOCK_HEADER = struct.Struct("<4sQIIIII")  # magic, first frame, n frames, raw len, comp len, raw crc, comp crc
INDEX_ENTRY = struct.Struct("<QQI")  # offset, first frame, n frames
TRAILER = struct.Struct("<QIQI4s")  # index offset, n blocks, n frames, index crc, magic
MAX_SIDE = 0xFFFF  # rows, cols and block_frames are u16 fields of the header
# The most bytes one decoded block may take: block_frames x rows x cols cells of a uint32 code point and a
# uint8 style (`decode_block`'s arrays). The writer refuses a geometry past it and the reader refuses, at open,
# a file whose header asks for more, so a block of 65535 unchanged frames (a few hundred bytes on disk) cannot
# make the reader allocate gigabytes.
DECODED_BLOCK_BUDGET = 256 << 20


def decoded_block_bytes(block_frames: int, rows: int, cols: int) -> int:
    """The bytes a block of `block_frames` frames of rows x cols decodes into (5 a cell)."""
    return block_frames * rows * cols * 5


def geometry_problem(rows: int, cols: int, block_frames: int) -> str | None:
    """What makes a geometry unwritable or over the decode budget, naming the values; None when nothing does."""
    for name, value in (("rows", rows), ("cols", cols), ("block_frames", block_frames)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIDE:
            return f"{name}={value!r}: expected an integer in 1..{MAX_SIDE}"
    size = decoded_block_bytes(block_frames, rows, cols)
    if size > DECODED_BLOCK_BUDGET:
        return (f"block_frames x rows x cols = {block_frames} x {rows} x {cols} decodes to {size:,} bytes a block "
                f"(5 a cell): expected at most {DECODED_BLOCK_BUDGET:,} (DECODED_BLOCK_BUDGET; at most "
                f"{DECODED_BLOCK_BUDGET // (5 * rows * cols)} frames a block at {rows}x{cols})")
    return None


class FrameFormatError(ValueError):
    """The frame file is truncated, corrupted, or not a frame file."""


def max_raw_len(count: int, rows: int, cols: int) -> int:
    """The most raw bytes a block of `count` frames of rows x cols can hold: every varint at its longest
    (10 bytes), a scroll in every frame and every cell of every row changed (4 bytes of text, 1 of style)."""
    return 3 * 10 + count * (10 + 6 * 10 + rows * (6 * 10 + 5 * cols))


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


def _varints(values: list[int]) -> bytes:
    """LEB128 varints of non-negative integers (< 2**63), vectorized."""
    v = np.asarray(values, np.uint64)
    if not len(v):
        return b""
    nb = np.ones(len(v), np.int64)
    t = v >> np.uint64(7)
    while t.any():
        nb += t > 0
        t >>= np.uint64(7)
    ends = np.cumsum(nb)
    starts = ends - nb
    out = np.empty(int(ends[-1]), np.uint8)
    for k in range(int(nb.max())):
        m = nb > k
        byte = (v[m] >> np.uint64(7 * k)) & np.uint64(0x7F)
        out[starts[m] + k] = byte.astype(np.uint8) | ((nb[m] > k + 1).astype(np.uint8) << 7)
    return out.tobytes()


def _unvarints(buf: bytes) -> list[int]:
    """The inverse of `_varints`; raises FrameFormatError on a cut or overlong varint."""
    a = np.frombuffer(buf, np.uint8)
    if not len(a):
        return []
    if a[-1] & 0x80:
        raise FrameFormatError("varint runs past the end of its stream")
    ends = np.flatnonzero(a < 0x80)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    if int(lens.max()) > 9:
        raise FrameFormatError("varint longer than 9 bytes")
    vals = np.zeros(len(ends), np.uint64)
    for k in range(int(lens.max())):
        m = lens > k
        vals[m] |= (a[starts[m] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return vals.tolist()


def _scrolled(rows: list, r0: int, r1: int, c0: int, c1: int, d: int) -> list:
    """`rows` (strings or bytes) after the region scroll (r0, r1, c0, c1, d): row y shows old row y + d."""
    out = list(rows)
    for y in range(max(r0, r0 - d), min(r1, r1 - d)):
        own, src = rows[y], rows[y + d]
        out[y] = own[:c0] + src[c0:c1] + own[c1:]
    return out


def _check_scroll(rows: int, cols: int, r0: int, r1: int, c0: int, c1: int, d: int) -> bool:
    return 0 <= r0 < r1 <= rows and 0 <= c0 < c1 <= cols and 0 < abs(d) < r1 - r0


class FrameWriter:
    """Writes frames and their actions in blocks of `block_frames` frames.

    Two ways in: `write(cp, st, action)` with whole frames (numpy arrays; every
    row is compared with the previous frame), and `write_rows(row_cp, row_st,
    damage, action, scroll)` with the screen as per-row strings (one character
    per cell) and style bytes, where only the rows in `damage` (and a scrolled
    region) may differ from the previous frame, which is what the editor gives.
    """

    def __init__(self, path: str | Path, rows: int, cols: int, block_frames: int = 256, n_styles: int = 16, level: int = 6) -> None:
        problem = geometry_problem(rows, cols, block_frames)
        if problem:
            raise ValueError(problem)
        self.path = Path(path)
        self.rows, self.cols, self.block_frames, self.level = rows, cols, block_frames, level
        self.f = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        head = HEADER.pack(MAGIC, VERSION, rows, cols, block_frames, n_styles)
        self.f.write(head + struct.pack("<I", zlib.crc32(head)))
        self.index: list[tuple[int, int, int]] = []
        self.n_frames = 0
        self.raw_bytes = 0
        self._blank_cp, self._blank_st = " " * cols, bytes(cols)
        self._cp = [self._blank_cp] * rows
        self._st = [self._blank_st] * rows
        self._blank_int = int.from_bytes(self._blank_cp.encode("utf-32-le"), "little")
        self._cpi: list[int | None] = [self._blank_int] * rows  # the previous rows' code points as integers
        self._reset_block()

    def _reset_block(self) -> None:
        self.pending = 0
        self._acts: list[int] = []
        self._ops: list[int] = []
        self._text, self._styles = bytearray(), bytearray()

    def write(self, cp: np.ndarray, st: np.ndarray, action: int) -> None:
        """One frame as arrays: code points [rows, cols] (0..0x10FFFF), styles [rows, cols] (0..255)."""
        cp = np.asarray(cp)
        st = np.asarray(st)
        if cp.shape != (self.rows, self.cols) or st.shape != (self.rows, self.cols):
            raise ValueError(f"frame shapes {cp.shape}, {st.shape}: expected ({self.rows}, {self.cols})")
        if cp.size and (int(cp.min()) < 0 or int(cp.max()) > 0x10FFFF or int(st.min()) < 0 or int(st.max()) > 255):
            raise ValueError(
                f"code points in {int(cp.min())}..{int(cp.max())} and styles in {int(st.min())}..{int(st.max())}: "
                "expected code points in 0..0x10FFFF and styles in 0..255"
            )
        text = cp.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")
        sb = st.astype(np.uint8).tobytes()
        c = self.cols
        row_cp = [text[y * c : (y + 1) * c] for y in range(self.rows)]
        row_st = [sb[y * c : (y + 1) * c] for y in range(self.rows)]
        self.write_rows(row_cp, row_st, range(self.rows), action)

    def _check_frame(self, row_cp: list[str], row_st: list[bytes], damage, action: int, scroll) -> None:
        """Raise ValueError, naming the value, for a frame write_rows cannot record exactly."""
        if isinstance(action, bool) or not isinstance(action, (int, np.integer)) or not 0 <= action < 1 << 63:
            raise ValueError(f"action={action!r}: expected an int in 0..2^63-1")
        if len(row_cp) != self.rows or len(row_st) != self.rows:
            raise ValueError(f"{len(row_cp)} rows of cells and {len(row_st)} of styles: expected {self.rows}")
        if scroll is not None and (len(scroll) != 5 or not _check_scroll(self.rows, self.cols, *scroll)):
            raise ValueError(f"scroll {scroll} outside the {self.rows}x{self.cols} frame")
        if self.pending == 0:
            checked = range(self.rows)
        else:
            checked = itertools.chain(damage, range(scroll[0], scroll[1]) if scroll is not None else ())
        for y in checked:
            if not (isinstance(y, (int, np.integer)) and 0 <= y < self.rows):
                raise ValueError(f"damaged row {y!r}: expected a row in 0..{self.rows - 1}")
            if len(row_cp[y]) != self.cols or len(row_st[y]) != self.cols:
                raise ValueError(f"row {y} has {len(row_cp[y])} cells and {len(row_st[y])} styles, expected {self.cols}")

    def write_rows(self, row_cp: list[str], row_st: list[bytes], damage, action: int, scroll=None) -> None:
        """One frame as row strings; rows outside `damage` (and `scroll`'s region) equal the previous frame's.

        Everything is checked before anything is recorded: a ValueError leaves the writer as it was.
        """
        self._check_frame(row_cp, row_st, damage, action, scroll)
        self._acts.append(action)
        pcp, pst, pci = self._cp, self._st, self._cpi
        if self.pending == 0:  # a block starts from the blank frame
            pcp = self._cp = [self._blank_cp] * self.rows
            pst = self._st = [self._blank_st] * self.rows
            pci = self._cpi = [self._blank_int] * self.rows
            damage = range(self.rows)
            scroll = None
        elif scroll is not None:
            r0, r1, c0, c1, d = scroll
            pcp = self._cp = _scrolled(pcp, r0, r1, c0, c1, d)
            pst = self._st = _scrolled(pst, r0, r1, c0, c1, d)
            pci[r0:r1] = [None] * (r1 - r0)
            damage = set(damage).union(range(r0, r1))
        ops = self._ops
        at = len(ops)
        if scroll is not None:
            r0, r1, c0, c1, d = scroll
            ops += (1, r0, r1 - r0, c0, c1 - c0, (d << 1) if d >= 0 else (-d << 1) - 1)
        else:
            ops.append(0)
        n = 0
        last = -1
        text, styles = self._text, self._styles
        from_bytes = int.from_bytes
        for y in (sorted(damage) if len(damage) > 1 else damage):
            b, sb = row_cp[y], row_st[y]
            a, sa = pcp[y], pst[y]
            if a == b:
                if sa == sb:
                    continue
                n += 1
                ops.append((y - last - 1) << 2 | 1)
            else:
                n += 1
                ai = pci[y]
                if ai is None:
                    ai = from_bytes(a.encode("utf-32-le", "surrogatepass"), "little")
                bi = pci[y] = from_bytes(b.encode("utf-32-le", "surrogatepass"), "little")
                x = ai ^ bi
                lo = ((x & -x).bit_length() - 1) >> 5
                hi = ((x.bit_length() - 1) >> 5) + 1
                lit = b[lo:hi].encode("utf-8", "surrogatepass")
                text += lit
                pcp[y] = b
                if sa == sb:
                    ops += ((y - last - 1) << 2 | 2, lo, hi - lo, len(lit))
                else:
                    ops += ((y - last - 1) << 2 | 3, lo, hi - lo, len(lit))
            last = y
            if sa != sb:
                x = from_bytes(sa, "little") ^ from_bytes(sb, "little")
                lo = ((x & -x).bit_length() - 1) >> 3
                hi = ((x.bit_length() - 1) >> 3) + 1
                ops += (lo, hi - lo)
                styles += sb[lo:hi]
                pst[y] = sb
        ops[at] |= n << 1
        self.pending += 1
        if self.pending == self.block_frames:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        raw = bytearray()
        for part in (_varints(self._acts), _varints(self._ops), self._text):
            _varint(len(part), raw)
            raw += part
        raw += self._styles
        comp = zlib.compress(bytes(raw), self.level)
        first, count = self.n_frames, self.pending
        self.index.append((self.f.tell(), first, count))
        self.f.write(BLOCK_HEADER.pack(BLOCK_MAGIC, first, count, len(raw), len(comp), zlib.crc32(raw), zlib.crc32(comp)))
        self.f.write(comp)
        self.n_frames += count
        self.raw_bytes += count * self.rows * self.cols * 5
        self._reset_block()

    def close(self) -> None:
        if self.f.closed:
            return
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


def decode_block(raw: bytes, count: int, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A block's raw bytes -> (code points uint32 [count, rows, cols], styles uint8 [count, rows, cols], actions int64 [count]).

    Raises FrameFormatError on malformed input.
    """
    pos = 0
    parts = []
    for _ in range(3):
        ln, pos = _read_varint(raw, pos)
        if pos + ln > len(raw):
            raise FrameFormatError("stream length runs past the end of the block")
        parts.append(raw[pos : pos + ln])
        pos += ln
    acts_b, ops_b, text = parts
    styles = raw[pos:]
    acts = _unvarints(acts_b)
    if len(acts) != count:
        raise FrameFormatError(f"{len(acts)} actions for {count} frames")
    actions = np.array(acts, np.int64)
    ops = _unvarints(ops_b)
    n_ops = len(ops)
    cps = np.empty((count, rows, cols), np.uint32)
    sts = np.empty((count, rows, cols), np.uint8)
    cp = np.full((rows, cols), 32, np.uint32)
    st = np.zeros((rows, cols), np.uint8)
    op = tp = sp = 0

    def take(k: int) -> list[int]:
        nonlocal op
        if op + k > n_ops:
            raise FrameFormatError("operation stream ends early")
        op += k
        return ops[op - k : op]

    for k in range(count):
        (head,) = take(1)
        n = head >> 1
        if head & 1:
            r0, nr, c0, nc, zd = take(5)
            d = (zd >> 1) if not zd & 1 else -((zd + 1) >> 1)
            r1, c1 = r0 + nr, c0 + nc
            if not _check_scroll(rows, cols, r0, r1, c0, c1, d):
                raise FrameFormatError(f"frame {k}: scroll {(r0, r1, c0, c1, d)} outside the frame")
            lo, hi = max(r0, r0 - d), min(r1, r1 - d)
            cp[lo:hi, c0:c1] = cp[lo + d : hi + d, c0:c1].copy()
            st[lo:hi, c0:c1] = st[lo + d : hi + d, c0:c1].copy()
        y = -1
        for _ in range(n):
            (h,) = take(1)
            y += (h >> 2) + 1
            if y >= rows:
                raise FrameFormatError(f"frame {k}: row {y} outside the frame ({rows} rows)")
            if not h & 3:
                raise FrameFormatError(f"frame {k}: row record for row {y} changes nothing")
            if h & 2:
                lo, ln, nb = take(3)
                if ln == 0 or lo + ln > cols or tp + nb > len(text):
                    raise FrameFormatError(f"frame {k}: code point span ({lo}, {ln}) outside row {y} or the text stream")
                try:
                    seg = bytes(text[tp : tp + nb]).decode("utf-8", "surrogatepass").encode("utf-32-le", "surrogatepass")
                except UnicodeError:
                    raise FrameFormatError(f"frame {k}: row {y} text is not UTF-8") from None
                if len(seg) != 4 * ln:
                    raise FrameFormatError(f"frame {k}: row {y} text has {len(seg) // 4} cells, expected {ln}")
                cp[y, lo : lo + ln] = np.frombuffer(seg, "<u4")
                tp += nb
            if h & 1:
                lo, ln = take(2)
                if ln == 0 or lo + ln > cols or sp + ln > len(styles):
                    raise FrameFormatError(f"frame {k}: style span ({lo}, {ln}) outside row {y} or the style stream")
                st[y, lo : lo + ln] = np.frombuffer(styles, np.uint8, ln, sp)
                sp += ln
        cps[k] = cp
        sts[k] = st
    if op != n_ops or tp != len(text) or sp != len(styles):
        raise FrameFormatError("block has trailing bytes")
    return cps, sts, actions


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
            raise FrameFormatError(
                f"{self.path}: frame format version {version} is not supported (this reader reads version "
                f"{VERSION}); rebuild the dataset with `rcswarm data frames`"
            )
        if not (rows and cols and bf):
            raise FrameFormatError(f"{self.path}: geometry {rows}x{cols}, {bf} frames a block: expected each >= 1")
        if decoded_block_bytes(bf, rows, cols) > DECODED_BLOCK_BUDGET:
            raise FrameFormatError(f"{self.path}: {geometry_problem(rows, cols, bf)}")
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
        self._check_index(n_frames, offset)
        self.n_frames = n_frames
        self._data_end = offset
        self._firsts = [first for _, first, _ in self.index]
        self._cache: OrderedDict[int, tuple[tuple[np.ndarray, np.ndarray], np.ndarray]] = OrderedDict()
        self._cache_blocks = cache_blocks

    def _check_index(self, n_frames: int, data_end: int) -> None:
        """FrameFormatError unless the blocks hold frames 0 .. n_frames - 1 in order, every one but the last
        `block_frames` of them (the last 1 .. block_frames), at ascending offsets between header and index
        (the trailer's n_frames has no checksum of its own)."""
        frame, end = 0, HEADER_SIZE
        for b, (offset, first, count) in enumerate(self.index):
            last = b == len(self.index) - 1
            if first != frame or not (1 <= count <= self.block_frames) or (count != self.block_frames and not last):
                raise FrameFormatError(
                    f"{self.path}: index entry {b} holds frames {first}..{first + count - 1}: expected "
                    f"{'1 to ' if last else ''}{self.block_frames} frames from frame {frame}")
            if not end <= offset <= data_end - BLOCK_HEADER.size:
                raise FrameFormatError(f"{self.path}: index entry {b} at offset {offset}: expected {end}.."
                                       f"{data_end - BLOCK_HEADER.size} (corrupted)")
            frame, end = frame + count, offset + BLOCK_HEADER.size
        if frame != n_frames:
            raise FrameFormatError(f"{self.path}: the trailer says {n_frames} frames, the index holds {frame} (corrupted)")

    def __len__(self) -> int:
        return self.n_frames

    def close(self) -> None:
        self.f.close()

    def _block(self, b: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
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
        room = self._data_end - offset - BLOCK_HEADER.size
        if comp_len > room or raw_len > max_raw_len(count, self.rows, self.cols):
            raise FrameFormatError(
                f"{self.path}: block {b} claims {comp_len} compressed and {raw_len} raw bytes: expected at most "
                f"{room} and {max_raw_len(count, self.rows, self.cols)} (corrupted)")
        comp = self.f.read(comp_len)
        if len(comp) != comp_len or zlib.crc32(comp) != comp_crc:
            raise FrameFormatError(f"{self.path}: block {b} (frames {first}..{first + count - 1}) checksum mismatch (corrupted)")
        raw = self._inflate(b, comp, raw_len)
        if zlib.crc32(raw) != raw_crc:
            raise FrameFormatError(f"{self.path}: block {b} decompressed checksum mismatch (corrupted)")
        try:
            cps, sts, actions = decode_block(raw, count, self.rows, self.cols)
        except FrameFormatError as e:
            raise FrameFormatError(f"{self.path}: block {b}: {e}") from None
        frames = (cps, sts)
        self._cache[b] = (frames, actions)
        while len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return frames, actions

    def _inflate(self, b: int, comp: bytes, raw_len: int) -> bytes:
        """`comp` inflated, never to more than raw_len + 1 bytes: FrameFormatError unless it is one zlib
        stream of exactly raw_len bytes (a small block cannot claim a large one, a zlib bomb)."""
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(comp, raw_len + 1)
        except zlib.error as e:
            raise FrameFormatError(f"{self.path}: block {b} does not decompress: {e}") from None
        if len(raw) != raw_len or not inflater.eof or inflater.unused_data:
            more = "more than" if len(raw) > raw_len else f"{len(raw)} bytes, not"
            raise FrameFormatError(f"{self.path}: block {b} decompresses to {more} its {raw_len} raw bytes (corrupted)")
        return raw

    def _locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.n_frames:
            raise IndexError(f"frame {i} out of range [0, {self.n_frames})")
        b = i // self.block_frames
        if b >= len(self.index) or not (self.index[b][1] <= i < self.index[b][1] + self.index[b][2]):
            b = bisect.bisect_right(self._firsts, i) - 1  # the index is contiguous (_check_index)
        return b, i - self.index[b][1]

    def frame(self, i: int) -> np.ndarray:
        """Frame i as int64 [rows, cols, 2] (code point, style)."""
        b, k = self._locate(i)
        cps, sts = self._block(b)[0]
        return np.stack([cps[k].astype(np.int64), sts[k].astype(np.int64)], axis=-1)

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
