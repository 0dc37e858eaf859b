"""The hivemind sync backend's peer: pseudo-gradients averaged peer to peer over libp2p.

`HivemindPeer` wraps one hivemind `DHT` and one `DecentralizedAverager` (each a process, plus the DHT's p2pd; each
process ends once the process that started it is gone, `end_when_orphaned`). A round: the worker writes its Δ into
the averager's buffers and calls `average`, a butterfly all-reduce weighted by tokens that also gathers every
groupmate's (version, tokens, norm); what comes back is Δ̄ = Σ n_i Δ_i / Σ n_i of the group, checked by
`trust_problem` before the shared outer step (sync/outer.py).

* **Codecs**: `sync.codec` means the same as with the coordinator. rcswarm's bf16, int8 and
  lowbit blockwise codecs (sync/codec.py) are hivemind compression classes, registered in
  hivemind's deserializer table under the ids FLOAT16, BLOCKWISE_8BIT and UNIFORM_8BIT (every
  rcswarm peer does the same when it imports this module); fp32 is hivemind's NONE. Each message
  carries its block size (lowbit: and its value bits). The sparse codec is refused at config time
  (`BACKEND_CODECS`): the all-reduce's reducers average dense parts and would cut the sum again
  without error feedback, so the most this backend carries is lowbit: 2 or 4 bits a value, the
  worker's error feedback on its Δ, both directions of the all-reduce compressed.
* **State for late joiners**: the averager serves (version, θ, outer momentum) as its state,
  declared every `hivemind.state_declare_s` with its version as priority; `load_state` retries
  its own download (`_StateAverager.download_state`, by descending priority) within a timeout, refuses a state of
  other names or shapes, of another run spec (its digest, `HivemindWorker.spec_digest`, which the averagers' prefix
  also carries: peers of another config never group with this one), of a version above what its donor declares, or
  one its caller's check refuses (the group's final replica, a re-sync's floor), and asks a refused donor no more; a
  donor is read only up to the bytes and tensors this run's state takes (`StateLimits`).
* **Records**: every peer stores its digest per version (`DigestRecord`: SHA-256 and a
  numeric sketch of θ, and its run spec's digest: `HivemindPeer.records` counts only its own spec's, and warns once
  of a peer whose records carry none, an rcswarm from before they did: `SpeclessDigestRecord`) and its round's
  metrics (`MetricsRecord`) in the DHT under `rcswarm_digest` / `rcswarm_metrics`, subkey = peer id. Values are
  msgpack (hivemind's DHT serializer), never pickle, and every DHT node checks them with `record_validator()`
  (finite numbers, versions below MAX_VERSION); `read_records` checks each again (a node with an older validator
  may serve one). Records are
  signed: every peer has an RSA identity (`PeerIdentity`: its `--identity-path`, or a key made for the process), its
  libp2p peer id is derived from that key, and it files its records under the subkey `<peer id>[owner:<public key>]`
  (`owner_subkey`). hivemind's `RSASignatureValidator` on every DHT node refuses a record under such a subkey unless
  that key signed it, and `read_records` keeps only records whose subkey's peer id is the key's (`subkey_owner`): no
  node can store or overwrite a record under another peer's id (docs/SECURITY.md). Every call into the DHT's process
  is bounded (`dht_result`).
* **Drift**: `drift(a, b)` compares two sketches (per part of θ, the difference of sums in units of the smaller of
  the two records' step norms, the larger where one is 0, a skipped round: the norms are each publisher's word);
  `resync_reason` says whether this peer must load the state of the highest-version majority.
* **Timeouts**: `RoundTimer` derives the all-reduce timeout of the next round from the measured
  all-reduce times (from the group's forming to the result; `hivemind.timeout_factor` × the slowest of
  the last `hivemind.timer_window`, at least `hivemind.min_allreduce_s`) and hands it, with hivemind's sender and
  reducer timeouts (a quarter and a half of it, so a peer that dies mid-all-reduce is dropped and
  the others finish), to the averager process before each step. How long a peer waits for its
  group is derived from its own round: `hivemind.timeout_factor` × the seconds it trained (a groupmate
  slower than that is left to the next round); the worker may widen a step's matchmaking window
  (`average(window_s=…)`: a fresh swarm's first round, from the peer's measured start-up), and a peer
  with nobody to average with ends its step soon after its window (`average(alone=…)`).
  The derived values are logged. Matchmaking's request timeout (`hivemind.request_timeout_s`, 5 s) is
  longer than hivemind advises (below the window): a follower that gives up on a starved leader may be
  counted in that leader's group all the same, a ghost (`request_timeout`).
* **Rules**: the run spec's [hivemind] table (`HivemindSection`, config/runspec.py) holds the
  operator's choices above (trust factor, drift tolerance, timeout factor and window, all-reduce
  floor and initial timeout, matchmaking request timeout, state declare period, record TTL);
  `HivemindPeer`, `RoundTimer`, `trust_problem` and `resync_reason` take them as arguments.

hivemind is imported only here; worker/hivemind_worker.py and `rcswarm dht` import this module,
and the rest of rcswarm imports those only when `sync.backend = "hivemind"` is chosen.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import functools
import hashlib
import logging
import math
import multiprocessing
import os
import random
import re
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, AsyncIterator, Self

import hivemind
import hivemind.averaging.averager as hm_averager_module
import hivemind.dht.dht as hm_dht_module
import multihash
import pydantic.v1 as pydantic
import torch
from cryptography.hazmat.primitives import serialization
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import StepControl
from hivemind.compression import CompressionBase, CompressionInfo, NoCompression, deserialize_torch_tensor
from hivemind.compression import serialization as hm_serialization
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import SchemaValidator
from hivemind.p2p import P2P, P2PContext, P2PDaemonError, PeerID
from hivemind.proto import averaging_pb2, crypto_pb2, runtime_pb2
from hivemind.utils import MPFuture, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.mpfuture import SharedBytes
from hivemind.utils.streaming import STREAMING_CHUNK_SIZE_BYTES, combine_from_streaming
from hivemind.utils.timed_storage import MAX_DHT_TIME_DISCREPANCY_SECONDS

from rcswarm.config.runspec import HivemindSection
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec as codecs
from rcswarm.sync import tensor_stream

log = logging.getLogger("rcswarm.hivemind")

RECORD_PREFIX = "rcswarm"
DIGEST_KEY = f"{RECORD_PREFIX}_digest"
METRICS_KEY = f"{RECORD_PREFIX}_metrics"
# The operator's rules (trust factor, drift tolerance, timeouts, declare period, record TTL) are the
# run spec's [hivemind] table, `HivemindSection`. What stays here is fixed by the implementation:
# the record schema, which every peer's validator must agree on (SKETCH_PARTS, MAX_METRIC_ROWS), and
# the sender and reducer timeouts as a quarter and a half of the all-reduce timeout (hivemind needs
# the reducer's longer than the sender's).
# Parts of θ in a digest's sketch.
SKETCH_PARTS = 64
# A metrics record holds a peer's newest rows, several rounds' worth, so a mirror polling slower than
# the rounds misses none (it keeps the rows past the newest step it wrote).
MAX_METRIC_ROWS = 256
# A version in a record or a groupmate's gather is a plain int below this: SQLite's and protobuf's int64 hold it,
# and a float (a state's declared priority) orders it.
MAX_VERSION = 2**62
# The numbers of a metric row are finite and at most this in magnitude (integers up to it are exact as floats and
# fit the mirror's int64 columns); only the loss may be NaN (a diverged step, which the mirror shows as no loss).
MAX_ROW_VALUE = 2.0**53
ROW_LOSS = 2
# How long a call into the DHT's process may take before this peer counts that process as gone (`dht_result`).
DHT_ANSWER_S = 60.0
# How long a new DHT process (and its p2pd) may take to say it is ready (`start_dht`); the averager's process likewise.
DHT_START_S = 60.0
AVERAGER_START_S = 60.0
# How long a failure in a peer's start or run waits for the worker's stop, which the signal to its whole process group
# that caused the failure (its processes, p2pd, torch_shm_manager ended) sends too, a moment later (`raise_if_stopped`).
STOP_GRACE_S = 1.0
# How often a wait for a hivemind process's answer looks at the worker's stop (`process_result`'s `stop`): the DHT's
# start, the pings of the initial peers, the averager's start.
STOP_POLL_S = 0.05
# How long a DHT's shutdown may take to remove its handlers from its p2pd before it shuts p2pd down regardless: within
# hivemind's grace period (3 s) for the whole shutdown (`_DHT._shutdown`).
DHT_HANDLERS_S = 1.0
# How often a hivemind child process (the DHT's, the averager's) looks whether the process that started it still runs,
# and how long after it ended itself as SIGTERM does it waits before it ends its children and itself with SIGKILL
# (`end_when_orphaned`).
ORPHAN_POLL_S = 1.0
ORPHAN_GRACE_S = 5.0
# How long a hivemind process found exited is still listened to for the answer it sent before (`process_result`): a
# DHT whose start failed writes its error, then exits; the error, not "exited", is what to report.
LAST_WORD_S = 0.5
# A state download (`StateLimits`) counts each message it reads as its protobuf bytes plus MESSAGE_COST (what holding
# one costs, so a stream of empty messages is not free), and allows a state beyond its float32 values STATE_SLACK_BYTES
# (the metadata: a few dozen bytes of msgpack from an honest donor) and PART_SLACK_BYTES a message (its framing, ~30
# bytes, and its cost), at hivemind's chunk size: an honest donor of the same model stays well below the bound.
MESSAGE_COST = 128
PART_SLACK_BYTES = 256
STATE_SLACK_BYTES = 1 << 16
# The slowest a donor may serve its state, bytes per second (8 Mbit/s): a donor is read at most
# `StateLimits.seconds` (its state's bytes at this rate, plus one message's timeout), then left for the next donor,
# so one that trickles its state within the per-message timeout cannot spend a joiner's whole load on itself.
MIN_STATE_BYTES_PER_S = 1 << 20
# The longest message a hivemind P2P stream may carry into an rcswarm process (`bound_p2p_messages`): hivemind
# streams tensors in parts of STREAMING_CHUNK_SIZE_BYTES (64 KiB) and keeps unary messages under its
# DEFAULT_MAX_MSG_SIZE (4 MiB); 16 MiB leaves room for either.
MAX_P2P_MESSAGE_BYTES = 16 << 20
# How long past a download's own timeout this process waits for the averager's answer (a stuck averager: no state).
DOWNLOAD_GRACE_S = 5.0
# How many versions a donor's state may be above the priority it declared, as the downloader read it: an honest donor
# that finished a round between that read and its download serves one version more (it takes a new snapshot before
# it declares the new version, and the declaration takes a DHT store to arrive).
DECLARE_LAG_VERSIONS = 1
# How many hex digits of the run spec's digest an averager's prefix carries (`averager_prefix`).
PREFIX_DIGEST_CHARS = 16


class RcswarmCompression(CompressionBase):
    """One of rcswarm's lossy codecs as a hivemind compression: a 4-byte block size (lowbit: and one byte of value
    bits), then the codec's bytes."""

    def __init__(self, codec: int, block_size: int, compression_type: int, value_bits: int = 0) -> None:
        self.codec, self.block_size, self.compression_type = codec, block_size, compression_type
        self.format = codecs.WireFormat(codec, block_size, 0, value_bits)

    def compress(self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False) -> runtime_pb2.Tensor:
        flat = tensor.detach().to("cpu", torch.float32)  # [*shape]
        prefix = struct.pack("<I", self.block_size)
        if self.codec == pb.CODEC_LOWBIT_BLOCK:
            prefix += struct.pack("<B", self.format.value_bits)
        payload = prefix + codecs.encode(flat, self.format)
        return runtime_pb2.Tensor(
            compression=self.compression_type, buffer=payload, size=tensor.shape, dtype="float32",
            requires_grad=tensor.requires_grad,
        )

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        buffer = serialized_tensor.buffer
        if len(buffer) < 4:
            label = codecs.codec_label(self.codec)
            raise ValueError(f"a {label} tensor of {len(buffer)} bytes: expected a 4-byte block size first")
        (block_size,) = struct.unpack_from("<I", buffer)
        if not 1 <= block_size <= 1 << 16:
            raise ValueError(f"block size {block_size}: expected 1..65536")
        shape, start, value_bits = tuple(serialized_tensor.size), 4, 0
        if self.codec == pb.CODEC_LOWBIT_BLOCK:
            if len(buffer) < 5:
                raise ValueError(f"a lowbit tensor of {len(buffer)} bytes: expected its value bits after the block size")
            (value_bits,), start = struct.unpack_from("<B", buffer, 4), 5
        fmt = codecs.WireFormat(self.codec, block_size, 0, value_bits)  # ValueError for bits it does not take
        return codecs.decode(memoryview(buffer)[start:], fmt, shape)

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        numel = max(info.descriptor.numel(), 1)
        return codecs.encoded_size(numel, self.format) / (4.0 * numel)


_SLOTS = {"bf16": "FLOAT16", "int8": "BLOCKWISE_8BIT", "lowbit": "UNIFORM_8BIT"}


def register_codecs(block_size: int = codecs.DEFAULT_BLOCK_SIZE) -> None:
    """Make hivemind's deserializer decode rcswarm's bf16, int8 and lowbit messages (process-wide, idempotent)."""
    for name, slot in _SLOTS.items():
        kind = runtime_pb2.CompressionType.Value(slot)
        codec = codecs.codec_from_name(name)
        bits = codecs.LOWBIT_VALUE_BITS[0] if codec == pb.CODEC_LOWBIT_BLOCK else 0
        hm_serialization._BASE_COMPRESSION_TYPES[slot] = RcswarmCompression(codec, block_size, kind, bits)


def use_in_replies(compression: CompressionBase) -> None:
    """Encode this process's all-reduce replies with `compression` too: a reducer compresses the averaged part it
    sends back with the instance hivemind's table holds for the part's compression type (not the averager's), so
    the table must hold the run's block size and bits (`register_codecs` put defaults there)."""
    if isinstance(compression, RcswarmCompression):
        slot = runtime_pb2.CompressionType.Name(compression.compression_type)
        hm_serialization._BASE_COMPRESSION_TYPES[slot] = compression


async def _bounded_receive_raw_data(reader: asyncio.StreamReader) -> bytes:
    """hivemind's `P2P.receive_raw_data` (one length-prefixed message of a stream), refusing a declared length over
    MAX_P2P_MESSAGE_BYTES before reading it: hivemind's own reads whatever length the sender declares (8 bytes of
    header), buffering it whole, so one peer could make another hold as much as it cared to send."""
    header = await reader.readexactly(P2P.HEADER_LEN)
    length = int.from_bytes(header, P2P.BYTEORDER)
    if length > MAX_P2P_MESSAGE_BYTES:
        raise ValueError(f"a P2P stream message of {length:,} bytes declared: expected at most "
                         f"{MAX_P2P_MESSAGE_BYTES:,} (hivemind sends its tensors in parts of {STREAMING_CHUNK_SIZE_BYTES:,})")
    return await reader.readexactly(length)


def bound_p2p_messages() -> None:
    """Make this process's hivemind P2P streams refuse messages over MAX_P2P_MESSAGE_BYTES (process-wide, idempotent;
    done when this module is imported, so every process that imports it, however it was started, has it, and again
    by `start_dht`)."""
    P2P.receive_raw_data = staticmethod(_bounded_receive_raw_data)


bound_p2p_messages()


def compression_for(codec: str, block_size: int, value_bits: int = 0) -> CompressionBase:
    """The hivemind compression of `sync.codec` (lowbit: at `value_bits`)."""
    if codec == "fp32":
        return NoCompression()
    if codec not in _SLOTS:
        raise ValueError(f"sync.codec = {codec!r}: expected one of ('fp32', {', '.join(map(repr, _SLOTS))})")
    kind = runtime_pb2.CompressionType.Value(_SLOTS[codec])
    wire = codecs.codec_from_name(codec)
    return RcswarmCompression(wire, block_size, kind, value_bits if wire == pb.CODEC_LOWBIT_BLOCK else 0)


register_codecs()


# Finite floats only: hivemind's validator compares a parsed value with the received one, and a NaN passes that
# comparison (the same float object), so NaN and inf are refused here, by the type.
_FiniteFloat = pydantic.confloat(strict=True, allow_inf_nan=False)
_FiniteNonNegative = pydantic.confloat(strict=True, ge=0.0, allow_inf_nan=False)


def is_version(value: Any) -> bool:
    """Whether `value` (msgpack from the wire) is a version: a plain int (not a bool) in [0, MAX_VERSION)."""
    return type(value) is int and 0 <= value < MAX_VERSION


def served_version_problem(version: int, declared: float | None) -> str:
    """Why a donor's state at `version` is refused for its declared priority `declared` (None: not known), "" when it
    is not: a donor serving a version above what it declares (more than DECLARE_LAG_VERSIONS) is lying about one of
    them, and a state it claims to be far ahead would end the loader's run at once."""
    if declared is None or version <= math.floor(declared) + DECLARE_LAG_VERSIONS:
        return ""
    return (f"it served version {version}, above the version it declares ({declared:g}; at most "
            f"{math.floor(declared) + DECLARE_LAG_VERSIONS} is taken)")


def averager_prefix(run: str, spec_digest: str = "") -> str:
    """The DHT prefix of the averagers of `run` whose run spec has the digest `spec_digest` (its first
    PREFIX_DIGEST_CHARS hex digits; none given: the run's name alone): peers of another spec never see this one's
    groups or state declarations, so they never average together."""
    prefix = f"{RECORD_PREFIX}_{run}"
    return f"{prefix}_{spec_digest[:PREFIX_DIGEST_CHARS]}" if spec_digest else prefix


def metric_row_problem(row: Sequence[float]) -> str:
    """Why a metric row [version, step, loss, tokens, wall, compute, sync, seq_len, batch] is refused ("" when it is
    not): each value finite and at most MAX_ROW_VALUE in magnitude, the loss also NaN."""
    for index, value in enumerate(row):
        if index == ROW_LOSS and math.isnan(value):
            continue
        if not (math.isfinite(value) and abs(value) <= MAX_ROW_VALUE):
            return f"metric row value {value!r} at position {index}: expected a finite number of magnitude <= 2**53"
    return ""


# A digest record's `spec`: the SHA-256 (hex) of its peer's run spec (`HivemindWorker.spec_digest`), or "" (not given).
SPEC_DIGEST_PATTERN = r"^([0-9a-f]{64})?$"


class SpeclessDigestRecord(pydantic.BaseModel):
    """A digest record of an rcswarm from before records carried `spec` (a peer not yet upgraded): kept by the DHT and
    read, so that a peer can name it (`warn_specless`), and read as one of no spec, never counted by a peer with one."""

    run: pydantic.constr(strict=True, max_length=200)
    version: pydantic.conint(strict=True, ge=0, lt=MAX_VERSION)
    sha256: pydantic.constr(strict=True, regex=r"^[0-9a-f]{64}$")
    sums: pydantic.conlist(_FiniteFloat, min_items=SKETCH_PARTS, max_items=SKETCH_PARTS)
    norms: pydantic.conlist(_FiniteNonNegative, min_items=SKETCH_PARTS, max_items=SKETCH_PARTS)
    steps: pydantic.conlist(_FiniteNonNegative, min_items=SKETCH_PARTS, max_items=SKETCH_PARTS)

    class Config:
        extra = pydantic.Extra.forbid


class DigestRecord(SpeclessDigestRecord):
    """One peer's parameters at one version: SHA-256 and the sketch `sketch()` computes (sums, θ norms, step norms)."""

    spec: pydantic.constr(strict=True, regex=SPEC_DIGEST_PATTERN)  # its peer's run spec digest ("": none)


class MetricsRecord(pydantic.BaseModel):
    """One peer's newest metric rows (at most MAX_METRIC_ROWS), each
    [version, step, loss, tokens, wall, compute, sync, seq_len, batch]."""

    run: pydantic.constr(strict=True, max_length=200)
    name: pydantic.constr(strict=True, max_length=200)
    rows: pydantic.conlist(
        pydantic.conlist(pydantic.StrictFloat, min_items=9, max_items=9), max_items=MAX_METRIC_ROWS
    )

    class Config:
        extra = pydantic.Extra.forbid

    @pydantic.validator("rows")
    def _rows_in_range(cls, rows: list[list[float]]) -> list[list[float]]:
        """Every row's numbers within `metric_row_problem`'s bounds (the rows returned as they came)."""
        for row in rows:
            problem = metric_row_problem(row)
            if problem:
                raise ValueError(problem)
        return rows


# A record's subkey: its storer's peer id and the RSA public key (OpenSSH form) the peer id is derived from, in
# hivemind's owner marker, which makes RSASignatureValidator require that key's signature (`owner_subkey`).
MAX_SUBKEY_CHARS = 1024
_OWNER_SUBKEY = re.compile(r"([1-9A-HJ-NP-Za-km-z]{1,128})\[owner:(ssh-rsa [A-Za-z0-9+/]+={0,2})\]")


class _Records(pydantic.BaseModel):
    digest: dict[pydantic.constr(strict=True, max_length=MAX_SUBKEY_CHARS), DigestRecord | SpeclessDigestRecord]
    metrics: dict[pydantic.constr(strict=True, max_length=MAX_SUBKEY_CHARS), MetricsRecord]


# The schemas of each key's records, the first the current one (a record is valid under any).
_RECORD_SCHEMAS: dict[str, tuple[type[pydantic.BaseModel], ...]] = {
    DIGEST_KEY: (DigestRecord, SpeclessDigestRecord), METRICS_KEY: (MetricsRecord,)}


def record_problem(key: str, value: Any) -> str:
    """Why `value` is not a valid record under `key` (DIGEST_KEY, METRICS_KEY) by the schema ("" when it is): what
    the current schema refuses, unless an older one of the key takes it."""
    problems = []
    for schema in _RECORD_SCHEMAS[key]:
        try:
            schema.parse_obj(value)
        except pydantic.ValidationError as error:
            problems.append("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:3]))
        else:
            return ""
    return problems[0]


def record_validator() -> SchemaValidator:
    """The DHT validator of rcswarm's records (other keys, hivemind's own, pass)."""
    return SchemaValidator(_Records, allow_extra_keys=True, prefix=RECORD_PREFIX)


def sketch(params: Mapping[str, torch.Tensor], step: Mapping[str, torch.Tensor] | None = None) -> dict[str, list[float]]:
    """θ cut into `SKETCH_PARTS` contiguous parts: per part the sum of θ, the L2 norm of θ and of the last step (float64)."""
    def parts(tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in tensors.values()])  # [P]
        return torch.tensor_split(flat, SKETCH_PARTS)  # SKETCH_PARTS × [≈P/SKETCH_PARTS]

    theta = parts(params)
    steps = parts(step) if step is not None else [torch.zeros(1, dtype=torch.float64)] * SKETCH_PARTS
    return {"sums": [float(p.sum()) for p in theta], "norms": [float(p.norm()) for p in theta],
            "steps": [float(p.norm()) for p in steps]}


def digest_record(run: str, version: int, params: Mapping[str, torch.Tensor],
                  step: Mapping[str, torch.Tensor] | None = None, spec: str = "") -> dict[str, Any]:
    """The DHT digest of θ at `version`; `step` = θ_version − θ_(version−1) as this peer applied it; `spec` the
    digest of its peer's run spec ("": none), which tells the records of peers of another config apart."""
    sha = tensor_stream.params_sha256({k: v.detach().cpu() for k, v in params.items()}).hex()
    return {"run": run, "version": version, "sha256": sha, **sketch(params, step), "spec": spec}


def drift(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """How far two replicas are apart, in units of one round's step: max over parts of |sum_a − sum_b| / ‖step‖.

    A sum over a part is a projection of θ, so |sum_a − sum_b| estimates ‖θ_a − θ_b‖ on the part
    (up to the part's √size, as ‖step‖ does); dividing by the part's step norm (or 1e-7 × its θ norm
    when the step was 0, a skipped round) makes a missed round ≈ 1 whatever the scale of θ, and
    codec noise a small fraction. A sketch with a non-finite number is infinitely far from every other (and itself):
    it must not count as agreeing with anything.

    The step and θ norms are each publisher's word (the schema checks only that they are finite and >= 0), so the
    unit is the smaller of the two records' claims (`step_unit`): a record claiming huge norms is measured in the
    other's steps, never its own. With the larger one (as before), a record of steps 1e30 was within the tolerance of
    every replica, had the most neighbours and was named every honest peer's final reference (`final_reference`).
    Honest replicas of one version claim nearly the same norms, and the measure stays symmetric, so every peer that
    sees the same digests still measures the same drifts.
    """
    numbers = (*a["sums"], *b["sums"], *a["norms"], *b["norms"], *a["steps"], *b["steps"])
    if not all(math.isfinite(x) for x in numbers):
        return math.inf
    worst = 0.0
    for sa, sb, na, nb, ta, tb in zip(a["sums"], b["sums"], a["norms"], b["norms"], a["steps"], b["steps"]):
        scale = max(step_unit(ta, tb), 1e-7 * min(na, nb), 1e-30)
        worst = max(worst, abs(sa - sb) / scale)
    return worst


def step_unit(ta: float, tb: float) -> float:
    """The step norm `drift` measures one part in, of two records' claims `ta` and `tb`: the smaller where both
    are > 0 (a claim never widens the unit beyond the other record's own step), else the larger: a record of a
    skipped round (step 0) is measured in the other's step, so a missed round reads ≈ 1."""
    return min(ta, tb) if min(ta, tb) > 0 else max(ta, tb)


def resync_reason(mine_id: str, mine: Mapping[str, Any], records: Mapping[str, Mapping[str, Any]],
                  tolerance: float = HivemindSection.drift_tolerance) -> str:
    """Why this peer must load the majority's state ("" when it need not).

    `records` are the other peers' digests by peer id. The reference is the highest version any
    peer published; a peer behind it re-syncs. At that version, peers within `tolerance` of one
    another form a cluster; this peer re-syncs when a cluster it is not in is larger than its own,
    or as large and holding the smallest peer id (so two peers that drifted apart settle on one).
    """
    if not records:
        return ""
    top = max(r["version"] for r in records.values())
    if mine["version"] < top:
        return f"behind: version {mine['version']} < {top}"
    if mine["version"] > top:
        return ""
    peers = {pid: r for pid, r in records.items() if r["version"] == top}
    own = sorted([mine_id] + [pid for pid, r in peers.items() if drift(mine, r) <= tolerance])
    others = {pid: r for pid, r in peers.items() if pid not in own}
    clusters = [sorted(q for q, r in others.items() if drift(record, r) <= tolerance) for record in others.values()]
    if not clusters:
        return ""
    best = min(clusters, key=lambda cluster: (-len(cluster), cluster[0]))
    if len(best) > len(own) or (len(best) == len(own) and best[0] < own[0]):
        worst = max(drift(mine, r) for r in others.values())
        return f"drift {worst:.3g} > {tolerance:g} from {len(best)} of {len(peers) + 1} peers at version {top}"
    return ""


def final_reference(mine_id: str, mine: Mapping[str, Any], records: Mapping[str, Mapping[str, Any]],
                    tolerance: float = HivemindSection.drift_tolerance) -> str:
    """The peer whose replica a group ends on at the last version: the one with the most peers within `tolerance`
    of it (itself included), the smallest id among equals. `records` are the other peers' digests at `mine`'s
    version; every peer that sees the same digests names the same peer."""
    digests = {mine_id: mine, **records}
    neighbours = {pid: sum(drift(r, other) <= tolerance for other in digests.values()) for pid, r in digests.items()}
    return min(digests, key=lambda pid: (-neighbours[pid], pid))


def same_replica(record: Mapping[str, Any], reference: Mapping[str, Any]) -> bool:
    """Whether `record` (the digest of a loaded state) is the replica `reference` published: its sha256, and the
    sketch that was judged against the group's (so a peer cannot publish one θ's sketch and serve another θ)."""
    close = all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for key in ("sums", "norms")
                for a, b in zip(record[key], reference[key]))
    return record["sha256"] == reference["sha256"] and close


def global_norm(tensors: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]) -> float:
    values = tensors.values() if isinstance(tensors, Mapping) else tensors
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in values))


def cosine(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """cos(a, b) of two lists of tensors as one vector each (float64; 0 when either is zero)."""
    dot = sum(float((x.detach().double() * y.detach().double()).sum()) for x, y in zip(a, b))
    norms = global_norm(a) * global_norm(b)
    return dot / norms if norms > 0 else 0.0


def trust_problem(average: Sequence[torch.Tensor], local: Sequence[torch.Tensor],
                  factor: float = HivemindSection.trust_factor, min_cosine: float = HivemindSection.min_cosine) -> str:
    """Why the averaged Δ̄ must not be applied ("" when it may): non-finite, norm above factor × ‖Δ_local‖, or
    pointing away from this peer's own Δ (cosine below min_cosine: an honest group's token-weighted mean holds this
    peer's Δ among its terms, so it points the same way unless a groupmate pulls the other way)."""
    for index, tensor in enumerate(average):
        if not codecs.all_finite(tensor):
            return f"the averaged update has non-finite values (tensor {index})"
    norm, bound = global_norm(average), factor * global_norm(local)
    if norm > bound:
        return f"the averaged update's norm {norm:.4g} exceeds {factor:g} × the local update's ({bound:.4g})"
    agreement = cosine(average, local)
    if min_cosine > -1.0 and agreement < min_cosine:
        return (f"the averaged update points away from the local one (cosine {agreement:.3f} < hivemind.min_cosine "
                f"{min_cosine:g})")
    return ""


class RoundTimer:
    """Timeouts derived from measured all-reduce and training times, not guessed (one thread)."""

    def __init__(self, matchmaking_s: float, rules: HivemindSection = HivemindSection()) -> None:
        self.matchmaking_s, self.rules = matchmaking_s, rules
        self.allreduce_s: deque[float] = deque(maxlen=rules.timer_window)
        self.train_s = 0.0  # this peer's training time in the current round

    def record(self, seconds: float) -> None:
        self.allreduce_s.append(seconds)

    def allreduce_timeout(self) -> float:
        if not self.allreduce_s:
            return self.rules.initial_allreduce_s
        return max(self.rules.min_allreduce_s, self.rules.timeout_factor * max(self.allreduce_s))

    def sender_timeout(self) -> float:
        """hivemind's sender timeout: a groupmate silent this long between chunks is dropped from the all-reduce."""
        return self.allreduce_timeout() / 4.0

    def reducer_timeout(self) -> float:
        """hivemind's reducer timeout (twice the sender's, as hivemind requires it longer)."""
        return self.allreduce_timeout() / 2.0

    def group_wait(self) -> float:
        """How long to look for a group: twice the matchmaking window plus timeout_factor × this round's training
        time (groupmates train the same steps; one slower than that waits for the next round)."""
        return 2.0 * self.matchmaking_s + self.rules.timeout_factor * self.train_s

    def step_timeout(self) -> float:
        """Looking for a group plus the all-reduce timeout: the longest one averaging step may take."""
        return self.group_wait() + self.allreduce_timeout()

    def describe(self) -> str:
        times = self.allreduce_s
        measured = (f"median {statistics.median(times):.2f}s, max {max(times):.2f}s of {len(times)}"
                    if times else "none measured yet")
        return (f"all-reduce timeout {self.allreduce_timeout():.1f}s (sender {self.sender_timeout():.1f}s, reducer "
                f"{self.reducer_timeout():.1f}s), step timeout {self.step_timeout():.1f}s (group wait "
                f"{self.group_wait():.1f}s; all-reduce times: {measured})")


@dataclass(frozen=True)
class HivemindOptions:
    """Where a peer listens and whom it dials (every address a libp2p multiaddr)."""

    initial_peers: tuple[str, ...] = ()
    host_maddrs: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    announce_maddrs: tuple[str, ...] = ()
    client_mode: bool = False
    identity_path: Path | None = None
    matchmaking_s: float = 2.0
    join_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        for flag, values in (("--initial-peers", self.initial_peers), ("--host-maddrs", self.host_maddrs),
                             ("--announce-maddrs", self.announce_maddrs)):
            for value in values:
                if not value.startswith("/"):
                    raise ValueError(f"{flag} {value!r}: expected a multiaddr such as /ip4/127.0.0.1/tcp/31337/p2p/Qm...")
        if self.client_mode and not self.initial_peers:
            raise ValueError("--client-mode needs --initial-peers (a client peer cannot be dialed)")
        if self.identity_path is not None and self.identity_path.exists():
            read_identity(self.identity_path)  # ValueError naming the file now, not from the DHT's start
        for name in ("matchmaking_s", "join_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} = {getattr(self, name)!r}: expected seconds > 0")

    @classmethod
    def loopback(cls, initial_peers: Sequence[str] = (), **kwargs: Any) -> HivemindOptions:
        """Listening and announcing on 127.0.0.1 only (tests, benchmarks, `rcswarm run`)."""
        return cls(initial_peers=tuple(initial_peers), host_maddrs=("/ip4/127.0.0.1/tcp/0",),
                   announce_maddrs=(), **kwargs)


class PeerDied(RuntimeError):
    """This peer's DHT or averager process has exited (`HivemindPeer.failure`): its worker must exit, for its
    supervisor to start it again, rather than train on alone."""


class PeerStopped(PeerDied):
    """The worker was asked to stop while its peer started (`HivemindPeer`'s `stop`): the start ends within a poll
    (STOP_POLL_S) in each of its phases (the DHT's start, the check of the initial peers, the averager's start), its
    processes shut down."""


class OrphanedLock(PeerDied, OSError):
    """A lock hivemind's processes share was held by one that exited (`SharedLock`). An OSError too: hivemind's
    `MPFuture._send_update` drops an update it cannot send on such errors, as it does for a broken pipe."""


class PeerRefused(RuntimeError):
    """This peer cannot take part in the swarm (its clock, its reachability); the message is one line."""


# How long a wait for a lock hivemind's processes share lasts before its holder is looked at (`SharedLock`): such a
# lock is held for microseconds. Then every ORPHANED_LOCK_S while the holder runs; every ORPHANED_AGAIN_S for a lock
# found orphaned before, or held with no holder recorded at the last look.
ORPHANED_LOCK_S = 1.0
ORPHANED_AGAIN_S = 0.05
# A lock's holder as `SharedLock` records it (`holder_identity`): the holder's pid in the low PID_BITS bits (Linux's
# pids are below 2**22) and its start time (clock ticks after boot, /proc/<pid>/stat) above them, one int64 written
# and read whole, so that a pid given to a new process since is not taken for the holder.
PID_BITS = 22
_PID_MASK = (1 << PID_BITS) - 1
# Whether this system has /proc (Linux): without it a holder is the pid alone, looked for with kill(pid, 0).
_PROC = Path("/proc/self/stat").exists()
# The hivemind processes (DHT, averager) started by a process and not yet forgotten (`forget_started`): (the
# starter's pid, the kind, the process). A forked child inherits the list and skips its parent's entries.
_STARTED: list[tuple[int, str, Any]] = []


def note_started(kind: str, process: Any) -> None:
    """Note `process` (a hivemind DHT's or averager's, `kind`) as started by this process, until `forget_started`."""
    _STARTED.append((os.getpid(), kind, process))


def forget_started(process: Any) -> None:
    """After `process`'s shutdown: forget it if it ended of itself (exit code 0). One ended the hard way (terminated
    after its grace period, killed) stays noted: it may have died holding a shared lock before it recorded itself as
    the holder, which `SharedLock` then blames on a noted process that exited."""
    if process.exitcode == 0:
        _STARTED[:] = [entry for entry in _STARTED if entry[2] is not process]


def exited_process() -> str:
    """"" while every hivemind process this process started (and did not forget) runs, else which one exited."""
    for pid, kind, process in _STARTED:
        if pid == os.getpid() and not process.is_alive():
            return f"its hivemind {kind} process (pid {process.pid}) exited with code {process.exitcode}"
    return ""


def proc_stat(pid: int | str) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the process's name: its state first, its parent's pid second, its start
    time (clock ticks after boot) 20th. FileNotFoundError when no process has that pid (`pid`: "self" for this one)."""
    with open(f"/proc/{pid}/stat", "rb") as file:
        stat = file.read()
    return stat[stat.rindex(b")") + 2:].split()


_IDENTITY = 0  # this process's `holder_identity`, 0 until its first lock (again in a forked child)


def holder_identity() -> int:
    """This process as a `SharedLock` records its holder: its pid and start time in one int (`PID_BITS`), computed at
    its first lock (a forked child computes its own: `os.register_at_fork` resets it)."""
    global _IDENTITY
    if not _IDENTITY:
        start = int(proc_stat("self")[19]) if _PROC else 0
        _IDENTITY = start << PID_BITS | os.getpid()
    return _IDENTITY


def _forget_identity() -> None:
    global _IDENTITY
    _IDENTITY = 0


os.register_at_fork(after_in_child=_forget_identity)


def holder_exited(holder: int) -> str:
    """Why the process `holder` names (`holder_identity`) no longer runs ("" while it does): it is gone, a zombie
    (exited, not yet reaped: kill(pid, 0) still finds it), or its pid now belongs to another process (another start
    time)."""
    pid, start = holder & _PID_MASK, holder >> PID_BITS
    if not _PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"process {pid} exited"
        except PermissionError:
            pass
        return ""
    try:
        fields = proc_stat(pid)
    except FileNotFoundError:
        return f"process {pid} exited"
    if fields[0] in (b"Z", b"X"):
        return f"process {pid} exited (not yet reaped)"
    if start and int(fields[19]) != start:
        return f"process {pid} exited (its pid is another process's now)"
    return ""


class SharedLock:
    """A lock hivemind's processes share (`MPFuture`'s update lock, `SharedBytes`' lock, an averager's tensors' lock:
    `guard_shared_locks`) that records its holder, and whose wait ends with OrphanedLock once the lock stays held past
    ORPHANED_LOCK_S by a holder that exited: nothing would ever release it.

    Any thread of any process sharing the lock calls `acquire`/`release` or uses it as a context manager; each writes
    itself as the holder (`holder_identity`, into `holder`: shared memory made here, with the lock, before hivemind
    forks the processes that share it) after taking the lock, and clears it before releasing it. A waiter that finds
    the lock held past ORPHANED_LOCK_S looks at the holder: one that runs is slow, not dead, and is waited for (in one
    process running several peers, another peer's exited DHT is no reason to give up on a live holder); one that
    exited orphaned the lock. A lock held with no holder recorded at two looks ORPHANED_AGAIN_S apart (its holder died
    between taking it and writing itself, microseconds) is given up on when a hivemind process this process started
    has exited (`exited_process`), the guess that was all there was before holders were recorded.

    A signal to a worker's whole process group (a terminal's Ctrl-C, `kill -- -PGID`) ends its DHT and averager at
    any instant, and the DHT takes MPFuture's update lock a thousand times a second while an averager looks for a group
    alone: the worker's stop then waited for ever on that lock, cancelling its averaging step (3 of 6 trials). In
    hivemind's `_send_update` the OrphanedLock drops the update, as for a broken pipe; elsewhere it is the worker's
    PeerDied. A lock found orphaned is looked at again after ORPHANED_AGAIN_S from then on."""

    def __init__(self, lock: Any) -> None:
        self.lock, self.orphaned = lock, False
        self.holder = multiprocessing.RawValue(ctypes.c_int64, 0)

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """The lock's own `acquire`, the holder recorded; an untimed blocking one waits as `__enter__` does. This
        process's identity is known before the lock is taken: reading it (/proc, at a process's first lock) may fail
        (EMFILE), which must not leave the lock held with nobody to release it."""
        identity = _IDENTITY or holder_identity()
        if block and timeout is None:
            if not self.lock.acquire(False):
                self._wait()
        elif not self.lock.acquire(block, timeout):
            return False
        self.holder.value = identity
        return True

    def release(self) -> None:
        self.holder.value = 0
        self.lock.release()

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _wait(self) -> None:
        """Take the lock, found held: waited for while its holder runs, OrphanedLock once it has exited."""
        unrecorded = False  # the last look found the lock held and no holder recorded
        while not self.lock.acquire(True, ORPHANED_AGAIN_S if self.orphaned or unrecorded else ORPHANED_LOCK_S):
            holder = self.holder.value
            if holder:
                problem = holder_exited(holder)
            else:  # none recorded: at the second look in a row, the guess
                problem = exited_process() if unrecorded else ""
            unrecorded = not holder and not unrecorded
            if problem:
                self.orphaned = True
                raise OrphanedLock(f"{problem}, holding a lock hivemind's processes share")


def guard_shared_locks() -> None:
    """Wrap hivemind's process-wide shared locks in `SharedLock` (idempotent; again after `MPFuture.reset_backend`).
    Done when this module is imported and by `start_dht`, so the processes it forks inherit them."""
    if not isinstance(MPFuture._update_lock, SharedLock):
        MPFuture._update_lock = SharedLock(MPFuture._update_lock)
    if not isinstance(SharedBytes._lock, SharedLock):
        SharedBytes._lock = SharedLock(SharedBytes._lock)


guard_shared_locks()


def start_torch_shm_manager() -> None:
    """Have torch start this process's torch_shm_manager now (hivemind shares its futures' state in torch's file_system
    strategy; idempotent: once a process), with each signal this process handles in Python restarting the system calls
    it interrupts meanwhile. torch's `start_manager` reads the manager's socket name from a pipe and, where that read
    fails with EINTR, loops for ever without reading again (it re-checks the failed read's result): a SIGTERM or Ctrl-C
    arriving then (the worker's handler, cli/signals.py) spun the worker at full CPU for good as its peer began to start
    (7 of 10 stops sent then; its manager, never contacted, exited). `start_dht` calls it before the DHT's first
    future."""
    handled = [sig for sig in signal.valid_signals()
               if sig not in (signal.SIGKILL, signal.SIGSTOP) and callable(signal.getsignal(sig))]
    # The signals blocked while their flags change: a handler that raised between two of them left some restarting.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, handled)
    try:
        for sig in handled:
            signal.siginterrupt(sig, False)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        torch.zeros(1).share_memory_()
    finally:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, handled)
        try:
            for sig in handled:
                signal.siginterrupt(sig, True)  # Python's own: interrupted, retried by Python (PEP 475)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@dataclass(frozen=True)
class ClockSample:
    """One ping of an initial peer: its DHT time and this peer's before and after (seconds since the epoch)."""

    peer: str
    sent: float
    remote: float
    received: float
    available: bool

    @property
    def skew_s(self) -> float:
        """This peer's clock minus the other's, estimated at the round trip's midpoint."""
        return (self.sent + self.received) / 2.0 - self.remote


def clock_problem(samples: Sequence[ClockSample], limit_s: float = MAX_DHT_TIME_DISCREPANCY_SECONDS) -> str:
    """Why this peer must not join ("" when it may): its clock is off an initial peer's by more than hivemind accepts
    (the peer's time outside [sent − limit, received + limit], hivemind's rule), named with the skew."""
    for sample in samples:
        if sample.remote < sample.sent - limit_s or sample.remote > sample.received + limit_s:
            skew = sample.skew_s
            return (f"this peer's clock is {abs(skew):,.1f} s {'ahead of' if skew > 0 else 'behind'} peer "
                    f"{sample.peer}'s (a {1e3 * (sample.received - sample.sent):.0f} ms round trip): hivemind needs "
                    f"every peer's clock within {limit_s:g} s of the others' (\"local time must be within {limit_s:g} "
                    "seconds\"); synchronize the clocks (NTP, chrony; docs/DEPLOY.md) and start again")
    return ""


async def _ping_initial_peer(address: str, timeout_s: float, _dht: Any, node: Any) -> ClockSample | None:
    """In the DHT's process: ping the initial peer at `address` once, asking it to dial back (`validate`); None when
    it does not answer within `timeout_s`."""
    from hivemind.p2p import PeerID
    from hivemind.proto import dht_pb2
    from hivemind.utils.multiaddr import Multiaddr

    peer = PeerID.from_base58(Multiaddr(address)["p2p"])
    request = dht_pb2.PingRequest(peer=node.protocol.node_info, validate=True)
    sent = get_dht_time()
    try:
        # Bounded here too: hivemind's own timeout did not always end a ping of a peer whose DHT process is stopped
        # while its p2pd runs (one waited over 60 s for a 2 s timeout, two such peers pinged at once).
        response = await asyncio.wait_for(node.protocol.get_stub(peer).rpc_ping(request, timeout=timeout_s), timeout_s)
    except Exception:  # noqa: BLE001 - an unreachable peer is hivemind's bootstrap's to report
        return None
    return ClockSample(str(peer), sent, response.dht_time, get_dht_time(), response.available)


async def _ping_initial_peers(addresses: Sequence[str], timeout_s: float, _dht: Any, node: Any) -> list[ClockSample]:
    """In the DHT's process: ping every initial peer at once (`_ping_initial_peer`), so that silent ones cost one
    `timeout_s` together, not one each; the samples of those that answered."""
    pings = [_ping_initial_peer(address, timeout_s, _dht, node) for address in addresses]
    return [sample for sample in await asyncio.gather(*pings) if sample is not None]


def check_peer(dht: hivemind.DHT, options: HivemindOptions, timeout_s: float = 10.0,
               stop: threading.Event | None = None) -> str:
    """Why this freshly started peer must not join ("" when it may): a clock off the initial peers' (hivemind's DHT
    is started not strict so that this one line says so, naming the skew, instead of a traceback), or, for a peer
    not in client mode, an initial peer that cannot dial it back. The initial peers are pinged at once (at most
    `timeout_s` in all: before, one after the other, 10 s for each silent one); given `stop` (the worker's),
    PeerStopped within STOP_POLL_S once it is set (`dht_result`), not at the end of the pings."""
    if not options.initial_peers:
        return ""
    raise_if_stopped(stop, "its initial peers were checked")
    pings = dht.run_coroutine(functools.partial(_ping_initial_peers, list(options.initial_peers), timeout_s),
                              return_future=True)
    samples = dht_result(dht, "ping of an initial peer", pings, timeout_s + DHT_ANSWER_S, stop=stop)
    problem = clock_problem(samples)
    if problem:
        return problem
    unreachable = [s.peer for s in samples if not s.available]
    if unreachable and not options.client_mode and len(unreachable) == len(samples):
        return (f"no initial peer can dial this peer back ({', '.join(unreachable)}): behind NAT use --client-mode, "
                "or give the addresses others reach it at with --announce-maddrs")
    return ""


def keep_command_pipe_blocking(module: Any, fd: int) -> None:
    """In a hivemind child process (the DHT's or the averager's), before its `run`: put its command pipe back in
    blocking mode as its event loop starts.

    `run` registers the pipe with its uvloop loop (`add_reader`, libuv's uv_poll_init), which makes the fd
    non-blocking. Python's Connection writes a message over 16 KiB as two writes, header then body; a `recv`
    between them (the parent stopped, paused or slow) fails with EAGAIN after consuming the header, the next
    `recv` reads the body as a header and the process dies (learning-at-home/hivemind#660; seen in the hivemind
    soak, issue #31). Blocking again, `poll()` still says when a message begins and `recv()` waits for its end.
    `module` is hivemind's module whose `switch_to_uvloop` that `run` calls; replaced in this process only."""
    make_loop = module.switch_to_uvloop

    def loop_with_blocking_pipe() -> Any:
        loop = make_loop()
        loop.call_soon(os.set_blocking, fd, True)  # runs once the loop starts: after `run`'s add_reader
        return loop

    module.switch_to_uvloop = loop_with_blocking_pipe


# What unpickling a command's reply pipe raises when the process that sent it has exited (its resource sharer gone).
SENDER_GONE = (EOFError, FileNotFoundError, ConnectionRefusedError, ConnectionResetError)


def drop_commands_of_exited_senders(pipe: Any) -> None:
    """In a hivemind child process (the DHT's or the averager's), before its `run`: a command whose reply pipe cannot
    be had because the process that sent it has exited is dropped, quietly, and the command loop goes on.

    A command carries its future, whose pipe back to its origin process unpickles by connecting to that process
    (multiprocessing's resource sharer). The averager's DHT requests still queued when it exits (a worker's stop after
    a signal to its whole process group, which ended p2pd too) then failed in the DHT's loop: EOFError ended the DHT
    process with a traceback; ConnectionResetError or FileNotFoundError were logged with one by hivemind, which then
    slept 3 s before its next command, the worker's shutdown, which came too late: "DHT did not shut down within the
    grace period". Nobody waits for such a command's answer. A pipe that cannot be read is still an error."""
    def recv() -> Any:
        message = pipe.recv_bytes()
        try:
            return ForkingPickler.loads(message)
        except SENDER_GONE as exc:  # its resource sharer is gone; another error (EMFILE) is hivemind's to log
            log.debug("a command from a process that has exited is dropped: %r", exc)
            return ("_drop_command", [], {})

    pipe.recv = recv


def default_sigterm() -> None:
    """In the averager's process (forked; the DHT's: `end_children_on_sigterm`): SIGTERM ends it again. The fork
    inherits the handler `rcswarm worker` installed in its parent (cli/signals.py), which only wakes the parent's
    stop, so `terminate()`, with which hivemind's `shutdown` ends a process that missed its grace period (one whose
    p2pd a terminal's Ctrl-C ended), did nothing, and the parent waited for it forever at exit (multiprocessing joins
    its children)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def child_pids(pid: int) -> list[int]:
    """The pids of the running processes whose parent is `pid` (read from /proc; none where there is no /proc)."""
    children = []
    for entry in os.scandir("/proc") if _PROC else ():
        try:
            if entry.name.isdigit() and int(proc_stat(entry.name)[1]) == pid:
                children.append(int(entry.name))
        except (OSError, IndexError, ValueError):  # exited meanwhile
            continue
    return children


def end_processes(pids: Sequence[int]) -> None:
    """SIGTERM to each of `pids` that still runs."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def end_children_on_sigterm() -> None:
    """In the DHT's process (forked), before its `run`: SIGTERM ends its children (its p2pd, which removes its socket
    as it exits), then the process itself, as SIGTERM's default action does (`default_sigterm`: the handler the fork
    inherited only woke its parent's stop). p2pd is the DHT process's child: ended by SIGTERM's default, a DHT
    terminated before it was ready (a stop during its start, `_DHT.shutdown`) or past hivemind's grace period left its
    p2pd running. The handler runs on the process's main thread, which runs the DHT's event loop (and so starts
    p2pd): no p2pd starts while it looks for them."""
    def end_with_children(signum: int, _frame: Any) -> None:
        end_processes(child_pids(os.getpid()))
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, end_with_children)


def end_when_orphaned(kind: str, starter_pid: int, poll_s: float = ORPHAN_POLL_S,
                      grace_s: float = ORPHAN_GRACE_S) -> threading.Thread:
    """In a hivemind child process (`kind`: the DHT's, the averager's), as its `run` begins: a daemon thread that ends
    this process once the process that started it (`starter_pid`, recorded before the fork) is gone, looked at every
    `poll_s`. It ends as on SIGTERM (the DHT's process ends its p2pd first, `end_children_on_sigterm`; the averager's
    dies, `default_sigterm`) and, still running `grace_s` later, SIGTERMs its children and SIGKILLs itself.

    SIGKILL of a worker's (or `rcswarm dht`'s) main process alone (the OOM killer, `kill -9 PID`) left its DHT process,
    averager process, p2pd and torch_shm_manager running for good, and the orphaned averager went on declaring the dead
    peer's state, so the live peers never found themselves alone. A dead starter's children are re-parented (to init
    or a subreaper), so `os.getppid()` then differs from `starter_pid`. Where this process's parent is not the starter
    as it begins (a forkserver or spawn start: a server process forked it), whether `starter_pid` still runs is looked
    at instead (`still_runs`). prctl's PR_SET_PDEATHSIG is not used: it fires when the thread that forked exits, and a
    peer may be started on a thread that ends before its process does."""
    forked_by_starter = os.getppid() == starter_pid

    def watch() -> None:
        while os.getppid() == starter_pid if forked_by_starter else still_runs(starter_pid):
            time.sleep(poll_s)
        log.warning("hivemind %s process %d: the process that started it (pid %d) is gone; it ends", kind,
                    os.getpid(), starter_pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        end_processes(child_pids(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)

    watcher = threading.Thread(target=watch, name="rcswarm-orphan-watch", daemon=True)
    watcher.start()
    return watcher


def still_runs(pid: int) -> bool:
    """Whether a process of id `pid` exists (signal 0 reaches it, or only a permission keeps it from being sent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def was_ready(process: Any) -> bool:
    """Whether a hivemind process (its DHT, its averager) said it was ready: only then does it read commands, the
    shutdown's first."""
    return process._ready.done() and not process._ready.cancelled()


def end_unready(process: Any) -> None:
    """End a hivemind process whose start had not ended (it reads no commands yet): SIGTERM (the DHT's process ends
    its p2pd first, `end_children_on_sigterm`), SIGKILL after DHT_HANDLERS_S if it ignores that, its children sent
    SIGTERM from here first (a SIGTERM that came before its handler was installed)."""
    if not process.is_alive():
        return
    process.terminate()
    process.join(DHT_HANDLERS_S)
    if process.is_alive():
        with contextlib.suppress(ProcessLookupError):  # stopped first: it starts no child while they are listed
            os.kill(process.pid, signal.SIGSTOP)
        end_processes(child_pids(process.pid))
        process.kill()
        process.join()


class _DHT(hivemind.DHT):
    """hivemind's DHT whose command pipe stays blocking in its process (`keep_command_pipe_blocking`), and whose
    blocking calls from the process that started it (hivemind's `peer_id`, `get_visible_maddrs`, rcswarm's
    `check_peer`) wait at most DHT_ANSWER_S (`dht_result`) instead of forever. `record_subkey`: the signed subkey
    this peer's records go under (set by `start_dht`)."""

    record_subkey = ""

    def start(self) -> None:
        self.starter_pid = os.getpid()
        super().start()
        note_started("DHT", self)

    def run(self) -> None:
        end_children_on_sigterm()
        end_when_orphaned("DHT", self.starter_pid)
        keep_command_pipe_blocking(hm_dht_module, self._inner_pipe.fileno())
        drop_commands_of_exited_senders(self._inner_pipe)
        super().run()

    async def _drop_command(self) -> None:
        """What a command whose sender exited becomes (`drop_commands_of_exited_senders`)."""

    async def _shutdown(self) -> None:
        """hivemind's, bounded by DHT_HANDLERS_S. Where p2pd has already exited (a signal to the whole process group,
        a terminal's Ctrl-C, ends it too), removing the DHT's handlers from it waited for ever (a unary handler's
        removal awaits an answer over the daemon's persistent connection) or failed on its missing socket, and the
        worker waited out its grace period before it terminated this process ("DHT did not shut down within the grace
        period", 3 s). Then p2pd is shut down regardless (its files removed)."""
        try:
            await asyncio.wait_for(super()._shutdown(), timeout=DHT_HANDLERS_S)
        except OSError as exc:  # a TimeoutError too
            log.debug("the DHT's p2pd did not answer its shutdown (it had exited?): %r", exc)
            if getattr(self._node, "_should_shutdown_p2p", True):
                await self._node.p2p.shutdown()

    def shutdown(self) -> None:
        """hivemind's shutdown (a command, then its grace period, 3 s, then SIGTERM) for a DHT that was ready; one
        whose start had not ended (it reads no commands before: a stop during its start, `start_dht`) is terminated at
        once, its p2pd with it (`end_children_on_sigterm`), and killed after DHT_HANDLERS_S if it ignores that."""
        try:
            if was_ready(self):
                super().shutdown()
            else:
                end_unready(self)
        finally:
            forget_started(self)

    def run_coroutine(self, coro: Any, return_future: bool = False) -> Any:
        future = super().run_coroutine(coro, return_future=True)
        if return_future:
            return future
        if os.getpid() != getattr(self, "starter_pid", None):  # the averager's process: it cannot watch this one
            return future.result()
        name = getattr(getattr(coro, "func", coro), "__name__", "call").strip("_").replace("_", " ")
        return dht_result(self, name, future, timeout_s=DHT_ANSWER_S)


@functools.lru_cache(maxsize=4096)
def peer_id_of(public_key: str) -> str:
    """The libp2p peer id (base58) of an RSA public key in OpenSSH form: the SHA-256 multihash of the key's
    protobuf encoding (libp2p's peer-id spec, as hivemind's `PeerID.from_identity` computes it). ValueError for
    anything but an RSA key."""
    key = serialization.load_ssh_public_key(public_key.encode())
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    return PeerID(multihash.encode(hashlib.sha256(encoded).digest(), multihash.coerce_code("sha2-256"))).to_base58()


def subkey_owner(subkey: Any) -> tuple[str, str]:
    """(peer id, "") when `subkey` is `<peer id>[owner:<RSA key>]` with the peer id derived from that key (a record
    under it was signed by that key: every DHT node's RSASignatureValidator checks it), else ("", why not)."""
    match = _OWNER_SUBKEY.fullmatch(subkey) if isinstance(subkey, str) else None
    if match is None:
        return "", "its subkey is not <peer id>[owner:<RSA public key>]: an unsigned record"
    try:
        derived = peer_id_of(match.group(2))
    except ValueError as error:
        return "", f"its owner key is not an RSA public key ({error})"
    if derived != match.group(1):
        return "", f"its peer id is not its owner key's ({derived})"
    return match.group(1), ""


@dataclass(frozen=True)
class PeerIdentity:
    """A peer's RSA identity: the p2pd identity file `path` (libp2p's protobuf PrivateKey) and its key, which signs
    this peer's records. `made_dir`: the private directory of a key made for this process, removed once the DHT
    has started (`start_dht`)."""

    path: Path
    key: RSAPrivateKey
    made_dir: Path | None = None

    @classmethod
    def of(cls, identity_path: Path | None) -> PeerIdentity:
        """The identity at `identity_path` (created there, as hivemind does, when the file is missing), or a new one
        in a private temporary directory when None. ValueError naming the file when it holds no RSA key."""
        made_dir = None
        if identity_path is None:
            made_dir = Path(tempfile.mkdtemp(prefix="rcswarm-identity-"))
            identity_path = made_dir / "identity.key"
        try:
            if not identity_path.exists():
                P2P.generate_identity(str(identity_path))
            return cls(identity_path, read_identity(identity_path), made_dir)
        except BaseException:
            if made_dir is not None:
                shutil.rmtree(made_dir, ignore_errors=True)
            raise

    @property
    def public_key(self) -> str:
        return self.key.get_public_key().to_bytes().decode()

    @property
    def peer_id(self) -> str:
        return peer_id_of(self.public_key)

    def subkey(self) -> str:
        """The subkey this peer files its records under (`owner_subkey`)."""
        return owner_subkey(self.peer_id, self.public_key)

    def forget_made_key(self) -> None:
        if self.made_dir is not None:
            shutil.rmtree(self.made_dir, ignore_errors=True)


def read_identity(path: Path) -> RSAPrivateKey:
    """The RSA key of the libp2p identity file `path` (protobuf PrivateKey, as hivemind writes it); ValueError naming
    the file when it holds anything else."""
    try:
        stored = crypto_pb2.PrivateKey.FromString(path.read_bytes())
        if stored.key_type != crypto_pb2.RSA:
            raise ValueError(f"a key of type {crypto_pb2.KeyType.Name(stored.key_type)}")
        key = RSAPrivateKey.__new__(RSAPrivateKey)
        key.__setstate__({"_private_key": stored.data})  # the DER key, as hivemind's own pickling restores it
    except Exception as error:
        raise ValueError(f"--identity-path {path}: expected a libp2p RSA private key (rcswarm signs its DHT records "
                         f"with it), got {error}") from error
    return key


def owner_subkey(peer_id: str, public_key: str) -> str:
    """`<peer id>[owner:<public key>]`: hivemind's owner marker makes every node require that key's signature."""
    marker = RSASignatureValidator.PUBLIC_KEY_FORMAT.decode().replace("_key_", public_key)
    return f"{peer_id}{marker}"


# The exceptions a peer's reset makes in multiprocessing's resource sharer (`quiet_resource_sharer`).
PEER_RESETS = (ConnectionResetError, BrokenPipeError, EOFError)


def resource_sharer_reset(exc: BaseException | None, tb: Any) -> bool:
    """Whether an exception given to sys.excepthook is multiprocessing's resource sharer losing the process it was
    handing a resource (a file descriptor) to: a reset raised in multiprocessing/resource_sharer.py, its serving
    thread's loop, the outermost frame of the traceback."""
    if not isinstance(exc, PEER_RESETS) or tb is None:
        return False
    return tb.tb_frame.f_code.co_filename.endswith(os.path.join("multiprocessing", "resource_sharer.py"))


def quiet_resource_sharer() -> None:
    """Route multiprocessing's resource sharer's resets to one INFO line instead of a traceback (idempotent). Its
    serving thread hands hivemind's processes what they ask of this one and reports any exception through
    sys.excepthook, so a signal to the worker's whole process group that ends an averager in the middle of such a
    handshake printed a ConnectionResetError traceback into a worker's clean stop (1 of the 8 group-SIGTERM cases of
    a default-suite run, 2026-11-29). Every other exception goes to the hook from before."""
    previous = sys.excepthook
    if getattr(previous, "rcswarm_quiet_resource_sharer", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        if resource_sharer_reset(exc, tb):
            log.info("a hivemind process ended while this one handed it a resource (%s: %s); nothing to do",
                     exc_type.__name__, exc)
            return
        previous(exc_type, exc, tb)

    hook.rcswarm_quiet_resource_sharer = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def start_dht(options: HivemindOptions, stop: threading.Event | None = None) -> hivemind.DHT:
    """A DHT node (and its p2pd) with rcswarm's record validators (the schema, and hivemind's RSA signatures with this
    peer's identity, `PeerIdentity`); no relays, no NAT traversal. Not strict: a clock or reachability problem is
    `check_peer`'s to report, in one line. The DHT's `record_subkey` is the subkey `store_record` files its records
    under. It bounds this process's P2P messages first (`bound_p2p_messages`), guards hivemind's shared locks
    (`guard_shared_locks`) and quiets the resource sharer's resets (`quiet_resource_sharer`). Ready within DHT_START_S, else PeerDied, at once if its process exits first (a signal to
    the whole process group); PeerStopped within STOP_POLL_S once `stop` is set during its start, and when it is set
    by the time it is ready (the DHT shut down either way: one not yet ready terminated with its p2pd at once,
    `_DHT.shutdown`)."""
    bound_p2p_messages()
    guard_shared_locks()
    quiet_resource_sharer()
    try:
        start_torch_shm_manager()
    except Exception as exc:
        raise_if_stopped(stop, "torch's shared-memory manager started", exc)
        raise
    identity = PeerIdentity.of(options.identity_path)
    kwargs: dict[str, Any] = dict(
        host_maddrs=list(options.host_maddrs), client_mode=options.client_mode, use_relay=False,
        use_auto_relay=False, auto_nat=False, nat_port_map=False, strict=False, identity_path=str(identity.path),
    )
    if identity.made_dir is not None:
        kwargs["check_if_identity_free"] = False  # a key made a moment ago is nobody else's
    if options.announce_maddrs:
        kwargs["announce_maddrs"] = list(options.announce_maddrs)
    dht = _DHT(initial_peers=list(options.initial_peers), start=False,
               record_validators=[RSASignatureValidator(identity.key), record_validator()], **kwargs)
    try:
        dht.run_in_background(await_ready=False)
        process_result(dht, "DHT", dht._ready, DHT_START_S, "during its start",
                       f"was not ready within {DHT_START_S:g} s", stop)
        raise_if_stopped(stop, "its DHT started")
    except BaseException as exc:
        dht.shutdown()
        raise_if_stopped(stop, "its DHT started", exc)
        raise
    finally:
        identity.forget_made_key()  # p2pd has read it (or never will)
    dht.record_subkey = identity.subkey()
    return dht


# What p2pd says when it cannot start, and the flag that gave it what it refused (`p2pd_problem`).
P2PD_FLAGS = (("bootstrap peers", "--initial-peers"), ("announce", "--announce-maddrs"), ("listen", "--host-maddrs"),
              ("identity", "--identity-path"))
# Go's log prefix of each p2pd line, a date and a time: dropped from the line rcswarm prints.
_GO_LOG_TIME = re.compile(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d ")


def p2pd_problem(error: P2PDaemonError, options: HivemindOptions) -> str:
    """One line on a p2pd that could not start (hivemind's P2PDaemonError, `error`): the flag whose value it refused,
    known from its message (`P2PD_FLAGS`; the flags that reach p2pd when none matches) with that value, then what the
    daemon said. A peer's start raises it where its --host-maddrs cannot be listened on (a port in use, an address not
    on this machine, a port over 65535) or none of its --initial-peers answers."""
    said = " ".join(_GO_LOG_TIME.sub("", str(error)).split()) or type(error).__name__
    values = {"--initial-peers": options.initial_peers, "--announce-maddrs": options.announce_maddrs,
              "--host-maddrs": options.host_maddrs,
              "--identity-path": (str(options.identity_path),) if options.identity_path is not None else ()}
    flag = next((flag for words, flag in P2PD_FLAGS if words in said.lower()), "")
    if not flag:
        return f"p2pd cannot start with these --host-maddrs, --announce-maddrs or --initial-peers: {said}"
    given = " ".join(values[flag]) or "(none given)"
    return f"p2pd cannot start with {flag} {given}: {said}"


def raise_if_stopped(stop: threading.Event | None, phase: str, failure: BaseException | None = None) -> None:
    """PeerStopped when `stop` is set: a peer's start checks it after each of its phases, and as a phase fails
    (`failure`, an Exception other than PeerDied: a signal to the whole process group ends p2pd and a starting
    torch_shm_manager too, failing the start with their errors, which are then the stop's doing; the stop that signal
    sends may come a moment after, so it is waited for up to STOP_GRACE_S)."""
    if failure is not None and (not isinstance(failure, Exception) or isinstance(failure, PeerDied)):
        return
    if stop is not None and (stop.wait(STOP_GRACE_S) if failure is not None else stop.is_set()):
        why = "" if failure is None else f" ({type(failure).__name__}: {(str(failure).splitlines() or [''])[0][:200]})"
        raise PeerStopped(f"stopped as {phase}{why}") from failure


def visible_maddrs(dht: hivemind.DHT) -> list[str]:
    return [str(addr) for addr in dht.get_visible_maddrs()]


def request_timeout(options: HivemindOptions, rules: HivemindSection) -> float:
    """hivemind's matchmaking request timeout: how long a follower waits for a would-be leader's answer and, past
    its window, for the group's start. A leader drops a follower whose request stream closed when its event loop
    reads the close; a leader starved of CPU past the follower's timeout wakes to its expired matchmaking timer first
    and assembles the group with the follower in it: a ghost, whose parts never come. Each reducer then waits its
    sender timeout (a quarter of the all-reduce timeout, 15 s in a first round) and ends with a part missing, while
    the ghost looks for another group until its own step times out (60 s and more). Seen in fresh swarms' first
    rounds on a loaded host with the 1 s of before; `hivemind.request_timeout_s` (5 s), at least half the matchmaking
    window. It narrows the window, not closes it: a leader starved longer still leaves a ghost."""
    return max(rules.request_timeout_s, options.matchmaking_s / 2)


class _QuietRequestTimeoutAdvice(logging.Filter):
    """Drops hivemind's start-up advice to keep request_timeout below min_matchmaking_time: rcswarm keeps it longer
    on purpose (`request_timeout`), and its own start-up line says how long."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "request_timeout smaller than min_matchmaking_time" not in record.getMessage()


logging.getLogger("hivemind.averaging.matchmaking").addFilter(_QuietRequestTimeoutAdvice())


class _QuietListenerClosed(logging.Filter):
    """Drops p2pd's ERROR that its listener was closed ("error accepting connection: ...: use of closed network
    connection"), which it logs as it shuts down on a signal of its own: a terminal's Ctrl-C (SIGINT to the whole
    process group) reaches it as well as the worker, which says it stopped in its own line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("error accepting connection" in message and "use of closed network connection" in message)


logging.getLogger("hivemind.p2p.p2p_daemon").addFilter(_QuietListenerClosed())


def renew_torch_thread_pool() -> None:
    """In a process forked from one that used torch's CPU thread pool (the averager, forked from a worker that
    trained): have torch rebuild that pool now, on this one thread, before hivemind's executor threads exist.

    After a fork torch replaces the inherited pool at its next use, and (as we read torch's pthreadpool code) the
    replacement is not safe against a second thread using the pool meanwhile: each new thread's first parallel op sets its thread count through the pool, and
    a thread that came between the old pool's release and the new one's creation failed with "pool INTERNAL ASSERT
    FAILED ... Invalid thread pool!". In the averager that was an executor thread compressing a part for one
    groupmate in a fresh swarm's first all-reduce (the first use of its threads): the stream to that groupmate ended
    unsent, its reducer waited the sender timeout for the parts ("Reducer: received 66.7% of input tensors") and the
    sender waited for that reducer's results: one link lost both ways (docs/RELIABILITY.md, "the pool")."""
    torch.set_num_threads(torch.get_num_threads())


def declared_priority(value: Any) -> float | None:
    """A state's declared priority (a peer's version) as rcswarm reads it from the DHT: a number in [0, MAX_VERSION]
    (not a bool, NaN or inf), else None. Any node may store a declaration: it is outside rcswarm's record schema."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_VERSION:
        return float(value)
    return None


@dataclass(frozen=True)
class StateLimits:
    """The most one donor may send for a state of this run (θ and the outer momentum, float32, uncompressed): a state
    download stops reading a donor past `tensors` tensors or `bytes` bytes (each message counted with MESSAGE_COST),
    or past `seconds` (a donor serving slower than MIN_STATE_BYTES_PER_S)."""

    tensors: int
    bytes: int

    def seconds(self, message_timeout_s: float) -> float:
        """The longest one donor may take to serve a state within these limits: `bytes` at MIN_STATE_BYTES_PER_S,
        plus `message_timeout_s` (the wait for its first message)."""
        return self.bytes / MIN_STATE_BYTES_PER_S + message_timeout_s

    @classmethod
    def of(cls, shapes: Sequence[tuple[int, ...]]) -> StateLimits:
        sizes = [4 * math.prod(shape) for shape in shapes] * 2  # θ, then the momentum
        parts = sum(max(1, math.ceil(size / STREAMING_CHUNK_SIZE_BYTES)) for size in sizes)
        return cls(len(sizes), sum(sizes) + STATE_SLACK_BYTES + parts * PART_SLACK_BYTES)


@dataclass(frozen=True)
class Download:
    """What one `_StateAverager.download_state` got: the state (metadata, tensors), the peer id of the donor that
    served it and the priority that donor declared (None, "" and None when none did), and the donors it stopped
    reading, past its `StateLimits`."""

    state: tuple[Any, list[torch.Tensor]] | None
    donor: str
    dropped: tuple[str, ...] = ()
    priority: float | None = None


class _StateAverager(DecentralizedAverager):
    """An averager whose state for late joiners comes from `state_fn` (called in this process), and whose reducer
    counts each groupmate's weight at most `_weight_bound` (set before each step, `set_weight_bound`)."""

    state_fn: Any = None
    _weight_bound: float = math.inf

    def run(self) -> None:
        default_sigterm()
        keep_command_pipe_blocking(hm_averager_module, self._inner_pipe.fileno())
        drop_commands_of_exited_senders(self._inner_pipe)
        renew_torch_thread_pool()  # on this process's one thread: before the watcher's
        end_when_orphaned("averager", self.starter_pid)
        super().run()

    def start(self) -> None:
        self.starter_pid = os.getpid()
        super().start()
        note_started("averager", self)

    def shutdown(self) -> None:
        """hivemind's shutdown for an averager that was ready and runs (hivemind logs an error with a traceback's
        "NoneType: None" for an exited one); one whose start had not ended (a stop during it) is terminated at once
        (`end_unready`)."""
        try:
            if not was_ready(self):
                end_unready(self)
            elif self.is_alive():
                super().shutdown()
        finally:
            forget_started(self)

    async def _drop_command(self) -> None:
        """What a command whose sender exited becomes (`drop_commands_of_exited_senders`)."""

    def run_in_background(self, await_ready: bool = True, timeout: float | None = None) -> None:
        """hivemind's start, but SIGINT keeps its handler in the process that starts the averager: hivemind sets
        SIGINT to SIG_IGN there for good (so its forked process ignores a terminal's Ctrl-C, as it still does), which
        replaced the handler `rcswarm worker` installed (cli/signals.py), so Ctrl-C left a worker training to its
        last round. Ready within `timeout` s, as hivemind's (`wait_until_ready`)."""
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGINT) if in_main else None
        if in_main:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.start()
        finally:
            if in_main and previous is not None:
                signal.signal(signal.SIGINT, previous)
        if await_ready:
            self.wait_until_ready(timeout)

    def get_current_state(self):
        return self.state_fn()

    async def _shutdown(self, timeout: float | None) -> None:
        """hivemind's shutdown, then this process's replica of the DHT's P2P closed: hivemind leaves it open, and with
        it its client socket (`$TMPDIR/hivemind-p2pclient-*.sock`), one file left per peer that ever ran. Where p2pd
        has already exited (a signal to the whole process group ends it too), removing the handlers fails on its
        missing socket, which ended this process's loop with a traceback: it ends quietly."""
        try:
            await super()._shutdown(timeout)
        except (FileNotFoundError, ConnectionError) as exc:  # not a TimeoutError: all-reduces left unfinished
            log.debug("the averager's p2pd had exited before its shutdown: %r", exc)
        finally:
            p2p = getattr(self, "_p2p", None)
            if p2p is not None:
                await p2p.shutdown()

    async def _set_timeouts(self, allreduce_s: float, sender_s: float, reducer_s: float) -> None:
        """In the averager process, before a step queued after it: the timeouts of its all-reduce."""
        self._allreduce_timeout = allreduce_s
        self.allreduce_kwargs.update(sender_timeout=sender_s, reducer_timeout=reducer_s)

    def set_timeouts(self, allreduce_s: float, sender_s: float, reducer_s: float) -> None:
        """Hand the timeouts to the averager process (its control pipe keeps them ahead of the next `step`)."""
        self._outer_pipe.send(("_set_timeouts", [], dict(allreduce_s=allreduce_s, sender_s=sender_s, reducer_s=reducer_s)))

    async def _set_weight_bound(self, bound: float) -> None:
        self._weight_bound = bound

    def set_weight_bound(self, bound: float) -> None:
        """The most weight (tokens) this peer's reducer counts for any groupmate's parts, from the next step on."""
        self._outer_pipe.send(("_set_weight_bound", [], dict(bound=bound)))

    async def rpc_aggregate_part(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], context: P2PContext
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        """A groupmate's parts, each with the weight it claims (its tokens), reduced by hivemind with that weight
        bounded to [0, `_weight_bound`] first: the weight is the sender's word, and without a bound one peer
        claiming 1,000× the tokens outweighs every honest groupmate (issue #31). One WARNING per bounded stream."""
        bound, sender = self._weight_bound, context.remote_id

        async def bounded():
            warned = False
            async for message in stream:
                claimed = message.weight
                if not 0.0 <= claimed <= bound:
                    message.weight = bound if claimed > bound else 0.0
                    if not warned:
                        log.warning("peer %s claimed the weight %.6g for its parts: counted as %.6g (the run's "
                                    "batch × seq_len × inner.steps)", sender, claimed, message.weight)
                        warned = True
                yield message

        async for reply in super().rpc_aggregate_part(bounded(), context):
            yield reply

    def begin_step(self, gather: Any, weight: float, timeout: float, scheduled_time: float) -> StepControl:
        """hivemind's `step(gather=…, weight=…, timeout=…, scheduled_time=…, wait=False)`, whose wait for this
        averager's process to take the step up ends with PeerDied as soon as that process has exited (or after
        DHT_ANSWER_S) instead of never: a signal to the whole process group may end it just before a step."""
        deadline = get_dht_time() + timeout
        assert scheduled_time < deadline, "Scheduled start time does not fit within timeout"
        data_for_gather = self.serializer.dumps([self.bandwidth, self.mode.value, self.serializer.dumps(gather)])
        step = StepControl(scheduled_time=scheduled_time, deadline=deadline, allow_retries=True, weight=weight,
                           data_for_gather=data_for_gather)
        future_for_init = MPFuture()
        self._outer_pipe.send(("_step", [], {"step": step, "future_for_init": future_for_init}))
        try:
            trigger, cancel = process_result(self, "averager", future_for_init, DHT_ANSWER_S, "as its step began",
                                             f"did not begin a step within {DHT_ANSWER_S:g} s")
        except BaseException:
            unused: concurrent.futures.Future = concurrent.futures.Future()
            unused.set_result(None)
            step.attach(unused, unused)  # hivemind's StepControl.__del__ fails on a step with no trigger attached
            raise
        step.attach(trigger, cancel)
        step.allow_allreduce()
        return step

    def download_state(self, timeout_s: float, limits: StateLimits, exclude: Collection[str] = ()) -> Download:
        """A state from the other peers declaring one, asked by descending declared priority (ties in random order),
        leaving out the peer ids in `exclude`, within `timeout_s` (each donor silent at most `next_chunk_timeout`
        between messages). In place of hivemind's `load_state_from_peers`, which always asks the highest declared
        priority first whatever it served before, so one peer declaring a high version and serving a state this run
        refuses blocked a late joiner for its whole timeout, and which buffers whatever a donor streams. Here a donor
        is read until it passes `limits` (a WARNING naming it; the next donor is asked), and the answer names the
        donor, for the caller to exclude it when it refuses its state (`HivemindPeer.load_state`)."""
        future = MPFuture()
        self._outer_pipe.send(("_download_state", [], dict(future=future, timeout_s=timeout_s, limits=limits,
                                                            exclude=tuple(exclude))))
        try:
            return process_result(self, "averager", future, timeout_s + DOWNLOAD_GRACE_S, "during a state download")
        except TimeoutError:  # the averager did not answer (stuck): no state this time
            return Download(None, "")

    async def _download_state(self, future: MPFuture, timeout_s: float, limits: StateLimits,
                              exclude: tuple[str, ...]) -> None:
        """In the averager process: `download_state`'s answer."""
        dropped: list[str] = []
        found = None
        try:
            found = await asyncio.wait_for(self._state_from_donors(limits, exclude, dropped), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - a timeout, the DHT's errors: no state this time
            log.info("no state from peers within %.1fs: %r", timeout_s, exc)
        if not future.done():
            donor, priority, state = found or ("", None, None)
            future.set_result(Download(state, donor, tuple(dropped), priority))

    async def _state_from_donors(self, limits: StateLimits, exclude: tuple[str, ...],
                                 dropped: list[str]) -> tuple[str, float, tuple[Any, list[torch.Tensor]]] | None:
        """(peer id, declared priority, state) of the first donor, by declared priority, that served a state within
        `limits` (its bytes, tensors and time, `StateLimits.seconds`); a donor past them is added to `dropped`."""
        declared = f"{self._matchmaking.group_key_manager.prefix}.all_averagers"
        found = await self.dht.get(declared, latest=True, return_future=True)
        entries = found.value if found is not None and isinstance(found.value, dict) else {}
        order = {}
        for key, item in entries.items():
            priority = declared_priority(getattr(item, "value", None))
            if priority is not None and isinstance(key, bytes) and key != self.peer_id.to_bytes():
                peer = PeerID(key)
                if str(peer) not in exclude:
                    order[peer] = (priority, random.random())
        for peer in sorted(order, key=order.__getitem__, reverse=True):
            try:
                state = await self._state_from(peer, limits)
            except Exception as exc:  # noqa: BLE001 - unreachable, silent past next_chunk_timeout, a bad tensor
                log.info("no state from peer %s: %r", peer, exc)
                continue
            if isinstance(state, str):
                log.warning("stopped reading the state of peer %s: %s; asking the next donor", peer, state)
                dropped.append(str(peer))
            elif state is not None:
                # Judged against the newest declaration: an honest donor moves on while another is read.
                return str(peer), max(order[peer][0], await self._declared_by(declared, peer)), state
        return None

    async def _declared_by(self, declared: str, peer: PeerID) -> float:
        """The state version `peer` declares under the DHT key `declared` now (-1 when none can be read)."""
        try:
            found = await self.dht.get(declared, latest=True, return_future=True)
        except Exception:  # noqa: BLE001 - the DHT's errors: the declaration read before stands
            return -1.0
        entries = found.value if found is not None and isinstance(found.value, dict) else {}
        priority = declared_priority(getattr(entries.get(peer.to_bytes()), "value", None))
        return -1.0 if priority is None else priority

    async def _state_from(self, peer: PeerID, limits: StateLimits) -> tuple[Any, list[torch.Tensor]] | str | None:
        """The (metadata, tensors) `peer` serves, None when it serves none, or what it exceeded of `limits` (a str) as
        soon as it does: rcswarm serves its state uncompressed, so the bytes read bound what the tensors hold. A donor
        is read only while it keeps up MIN_STATE_BYTES_PER_S after one message's timeout (`slow_donor_problem`), and
        each message is waited for at most until then: its pace is checked at every message and at that deadline,
        never left to one cancellation (asyncio's wait_for of Python 3.11 drops a cancellation that meets a
        message)."""
        message_s = self.next_chunk_timeout or self.request_timeout
        stub = self.get_stub(self._p2p, peer, namespace=self.prefix)
        stream = await stub.rpc_download_state(averaging_pb2.DownloadRequest())
        metadata, tensors, parts, received, count = None, [], [], 0, 0
        started = time.monotonic()
        try:
            while True:
                slow = slow_donor_problem(received, time.monotonic() - started, message_s, limits)
                if slow:
                    return slow
                due = started + message_s + received / MIN_STATE_BYTES_PER_S  # when this pace falls behind
                wait_s = max(0.0, min(message_s, due - time.monotonic() + 1e-3))
                try:
                    message = await asyncio.wait_for(stream.__anext__(), timeout=wait_s)
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:  # the stream is cancelled: never read again
                    slow = slow_donor_problem(received, time.monotonic() - started, message_s, limits)
                    if slow:
                        return slow
                    raise  # silent for a whole message timeout while ahead of the pace
                received += message.ByteSize() + MESSAGE_COST
                part = message.tensor_part
                if part.dtype or not parts:  # a tensor begins
                    count += 1
                    if parts:
                        tensors.append(deserialize_torch_tensor(combine_from_streaming(parts)))
                        parts = []
                if received > limits.bytes:
                    return f"over {limits.bytes:,} bytes ({received:,} read), the most this run's state takes"
                if count > limits.tensors:
                    return f"over {limits.tensors} tensors, as many as this run's state holds"
                if part.compression != runtime_pb2.CompressionType.NONE:
                    return f"a tensor of compression type {part.compression}, not NONE (uncompressed)"
                if message.metadata:
                    metadata = self.serializer.loads(message.metadata)
                parts.append(part)
        finally:
            await stream.aclose()  # the donor's handler sees the stream close and stops sending
        if parts:
            tensors.append(deserialize_torch_tensor(combine_from_streaming(parts)))
        return None if metadata is None else (metadata, tensors)


def slow_donor_problem(received: int, elapsed_s: float, message_s: float, limits: StateLimits) -> str:
    """Why a donor that sent `received` bytes in `elapsed_s` is read no further ("" while it may go on): past one
    message's timeout (`message_s`, its first message's allowance), it must have kept up MIN_STATE_BYTES_PER_S, until
    the whole state is in (`limits.bytes`, which `StateLimits.seconds` takes at that pace)."""
    owed = min(limits.bytes, MIN_STATE_BYTES_PER_S * (elapsed_s - message_s))
    if received >= owed:
        return ""
    return (f"{received:,} bytes in {elapsed_s:.1f} s, under {MIN_STATE_BYTES_PER_S:,} bytes/s after the first "
            f"{message_s:g} s (the slowest a donor may serve)")


@dataclass
class Averaged:
    """One successful averaging step: the group's Δ̄ (float32, the peer's order) and what each member gathered."""

    deltas: list[torch.Tensor]
    gathered: list[dict[str, Any]]
    seconds: float

    @property
    def group_version(self) -> int:
        """The highest version a groupmate gathered (-1 when none did): only a plain int in [0, MAX_VERSION) counts,
        whatever else a groupmate sent (the gather is msgpack from the wire)."""
        return max((g.get("version") for g in self.gathered if is_version(g.get("version"))), default=-1)


class HivemindPeer:
    """One DHT and one averager over Δ buffers shaped like `shapes` (one thread: the worker loop).

    `spec_digest`: the digest of the run spec every peer of the swarm shares (`HivemindWorker` passes its spec's):
    the averager's prefix carries it (`averager_prefix`), and a state whose metadata names another is refused.

    `state_fn()` returns (metadata dict, tensors) for a late joiner; it runs on hivemind's
    state-serving thread and must read a consistent snapshot (the worker swaps whole lists).

    `stop`: once set (the worker was asked to stop), the start ends with PeerStopped, its processes shut down: within
    STOP_POLL_S in the DHT's start, the check of the initial peers and the averager's start (a half-started process
    terminated at once, `end_unready`; the DHT's with its p2pd). Each phase ends
    with PeerDied at once when its process exits (a signal to the whole process group), not at its timeout.
    """

    def __init__(self, run: str, shapes: Sequence[tuple[int, ...]], codec: str, block_size: int,
                 options: HivemindOptions, state_fn: Any, min_group_size: int = 2,
                 target_group_size: int | None = None, rules: HivemindSection = HivemindSection(),
                 value_bits: int = 0, spec_digest: str = "", stop: threading.Event | None = None) -> None:
        self.run, self.options, self.rules = run, options, rules
        self.spec_digest, self.prefix = spec_digest, averager_prefix(run, spec_digest)
        self.timer = RoundTimer(options.matchmaking_s, rules)
        self.dht = start_dht(options, stop)
        self.averager: _StateAverager | None = None
        try:
            problem = check_peer(self.dht, options, stop=stop)
            if problem:
                raise PeerRefused(problem)
            raise_if_stopped(stop, "its initial peers were checked")
        except BaseException as exc:
            self.dht.shutdown()
            raise_if_stopped(stop, "its initial peers were checked", exc)
            raise
        buffers = [torch.zeros(shape, dtype=torch.float32) for shape in shapes]
        self.request_timeout_s = request_timeout(options, rules)
        compression = compression_for(codec, block_size, value_bits)
        use_in_replies(compression)
        try:
            self.averager = _StateAverager(
                buffers, self.dht, start=False, prefix=self.prefix, min_group_size=min_group_size,
                target_group_size=target_group_size,
                min_matchmaking_time=options.matchmaking_s, request_timeout=self.request_timeout_s,
                # A state download's wait between chunks before a silent donor is left for the next, as it was
                # (hivemind takes the request timeout when none is given; the sender and reducer timeouts this also
                # defaults are set before every step, `set_timeouts`).
                next_chunk_timeout=max(1.0, options.matchmaking_s / 2),
                allreduce_timeout=rules.initial_allreduce_s, compression=compression,
                state_compression=NoCompression(), declare_state_period=rules.state_declare_s,
                client_mode=options.client_mode, allow_state_sharing=not options.client_mode,
            )
            self.averager.state_fn = state_fn
            self.averager.lock_averaged_tensors = SharedLock(self.averager.lock_averaged_tensors)
            self.averager.run_in_background(await_ready=False)
            process_result(self.averager, "averager", self.averager._ready, AVERAGER_START_S, "during its start",
                           f"was not ready within {AVERAGER_START_S:g} s", stop)
            raise_if_stopped(stop, "its averager started")
        except BaseException as exc:
            self.shutdown()
            raise_if_stopped(stop, "its averager started", exc)
            raise
        log.info("hivemind peer %s of %s listening on %s; matchmaking request timeout %.1fs; %s", self.peer_id, run,
                 " ".join(visible_maddrs(self.dht)), self.request_timeout_s, self.timer.describe())

    @property
    def peer_id(self) -> str:
        return str(self.dht.peer_id)

    def set_state_version(self, version: float, shareable: bool = True) -> None:
        """Declare this peer's state at `version` (priority: higher versions are loaded first; a fraction above a
        version marks the replica a group ends on, `HivemindWorker._settle`). A peer in client mode serves no state:
        hivemind refuses it a priority."""
        if not self.options.client_mode:
            self.averager.state_sharing_priority = float(version)
        self.averager.allow_state_sharing = shareable and not self.options.client_mode

    def declared_versions(self) -> list[float | None]:
        """The version each other live averager of this run declares for its state, None for one that declares it
        does not serve it now (a peer loading a state, `set_state_version(shareable=False)`, or declaring
        anything but a finite number in [0, MAX_VERSION]: these declarations are outside rcswarm's record schema, any
        node may store one). A declaration lives hivemind.state_declare_s: a peer that exited drops out."""
        declared = f"{self.prefix}.all_averagers"
        found = dht_result(self.dht, "get", self.dht.get(declared, latest=True, return_future=True))
        if found is None or not isinstance(found.value, dict):
            return []
        mine = self.averager.peer_id.to_bytes()
        return [declared_priority(getattr(item, "value", None)) for key, item in found.value.items() if key != mine]

    def newest_declared_version(self) -> int:
        """The highest version another averager of this run declares for its state (0 when none does)."""
        return int(max((v for v in self.declared_versions() if v is not None), default=0))

    def load_state(self, names: Sequence[str], shapes: Sequence[tuple[int, ...]], timeout_s: float,
                   accept: Callable[[tuple[int, list[torch.Tensor]]], str] | None = None,
                   stop: threading.Event | None = None) -> tuple[int, list[torch.Tensor]] | None:
        """(version, θ tensors + momentum tensors) from the highest-priority peer whose state this run takes
        (`_check_state`: this peer's spec digest, if it has one, and a version at most what the donor declares,
        `served_version_problem`) and, given `accept`, that `accept` takes (it returns "" or why not: `_load_final` wants the
        group's reference replica), retried within `timeout_s` (at least the time the state takes at the slowest
        pace a donor may serve, `StateLimits.seconds`) or until `stop` is set. A donor whose state is
        refused, or that sent more than such a state holds (`StateLimits`), is not asked again in this call: the
        next attempt asks the next donor at once."""
        limits, refused = StateLimits.of(shapes), set()
        message_s = getattr(self.averager, "next_chunk_timeout", None)  # None: a stand-in averager (tests)
        if message_s and limits.seconds(message_s) > timeout_s:  # the state takes longer at the slowest pace
            timeout_s = limits.seconds(message_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            download = self.averager.download_state(max(1.0, deadline - time.monotonic()), limits, refused)
            refused.update(download.dropped)
            problem, state = _check_state(download.state, self.run, names, shapes, self.spec_digest)
            if not problem:
                problem = served_version_problem(state[0], download.priority)
            if not problem and accept is not None:
                problem = accept(state)
            if not problem:
                return state
            if download.donor:
                refused.add(download.donor)
                log.warning("refused the state of peer %s (%s); asking the others", download.donor, problem)
                continue
            log.info("no state from peers yet (%s); retrying", problem)
            if stop is not None:
                stop.wait(0.5)
            else:
                time.sleep(0.5)
        return None

    def average(self, deltas: Sequence[torch.Tensor], tokens: int, gather: dict[str, Any],
                window_s: float | None = None, max_tokens: float = math.inf,
                alone: Callable[[], bool] | None = None, stop: threading.Event | None = None) -> Averaged | None:
        """Average `deltas` with a group, weighted by `tokens`; None when no group formed or the all-reduce failed.

        `window_s`: how long a group may take to assemble once this peer looks (default: the matchmaking time).
        `max_tokens`: the most tokens a round of this run trains; this peer's weight and, in the parts it reduces,
        every groupmate's are counted at most that.
        `alone`: asked once, when no group has begun its all-reduce by the end of the window plus the request
        timeout (a group that formed at the window's end has begun by then): True ends the step there, instead of
        looking on for the step timeout, which a peer with nobody to average with spent every round.
        `stop`: once set (the worker was asked to stop), the step is cancelled within a poll (50 ms) and returns None,
        in matchmaking or in the all-reduce, instead of running to its step timeout (~60 s after a SIGTERM).
        """
        with self.averager.get_tensors() as buffers:
            for buffer, delta in zip(buffers, deltas):
                buffer.copy_(delta)
        window = max(window_s or 0.0, self.options.matchmaking_s)
        timeout = window + self.timer.step_timeout()
        self.averager.set_timeouts(self.timer.allreduce_timeout(), self.timer.sender_timeout(), self.timer.reducer_timeout())
        self.averager.set_weight_bound(float(max_tokens))
        started = time.monotonic()
        weight = float(min(max(tokens, 1), max_tokens))
        control = self.averager.begin_step(gather, weight, timeout, get_dht_time() + window)
        formed = _wait_for_group(control, started + timeout, started + window + self.request_timeout_s, alone, stop)
        stopped = stop is not None and stop.is_set()
        if formed is None and not control.done() and time.monotonic() < started + timeout and not stopped:
            control.cancel()
            log.info("no other peer of the run to average with: the step ends after %.1fs (window %.1fs), not at "
                     "its step timeout %.1fs", time.monotonic() - started, window, timeout)
            return None
        while stop is not None and not control.done() and time.monotonic() < started + timeout:
            if stop.wait(0.05):
                control.cancel()
                log.info("stopped %.1fs into its averaging step: the step is cancelled", time.monotonic() - started)
                return None
        try:
            result = control.result(timeout=max(0.1, started + timeout - time.monotonic()))
        except Exception as exc:  # hivemind raises its own errors, timeouts and cancellations alike
            control.cancel()
            stage = (f"{time.monotonic() - formed:.1f}s into its group's all-reduce" if formed is not None
                     else f"looking for a group (window {window:.1f}s, step timeout {timeout:.1f}s)")
            log.warning("averaging failed after %.1fs, %s: %r", time.monotonic() - started, stage, exc)
            return None
        seconds = time.monotonic() - started
        if not result:
            log.warning("no averaging group within %.1fs", seconds)
            return None
        self.timer.record(time.monotonic() - formed if formed is not None else 0.0)  # unseen: under the 10 ms poll
        with self.averager.get_tensors() as buffers:
            averaged = [buffer.clone() for buffer in buffers]
        gathered = [g for g in result.values() if isinstance(g, dict)]
        return Averaged(averaged, gathered, seconds)

    def publish(self, key: str, value: dict[str, Any]) -> bool:
        """Store `value` (a record of `key`'s schema) signed by this peer; whether the DHT accepted it."""
        return store_record(self.dht, self.dht.record_subkey, key, value, self.rules.record_ttl_s)

    def records(self, key: str, run: str, other_specs: bool = False) -> dict[str, dict[str, Any]]:
        """Every valid record under `key` for `run`, by peer id (this peer's included), of this peer's run spec (the
        same digest, or none on either side: metrics records carry none, so a peer with a spec digest finds them all
        under `other_specs`); with `other_specs`, those of every other spec instead: peers of the run's name but
        another config, whose replicas are not this swarm's (never counted in its decisions). A digest record that
        names no spec while this peer has one is logged once per peer (`warn_specless`)."""
        found = read_records(self.dht, key, run)
        if key == DIGEST_KEY and self.spec_digest:
            warn_specless(found)
        return {peer: r for peer, r in found.items() if (r.get("spec", "") == self.spec_digest) != other_specs}

    def failure(self) -> str:
        """Why this peer can take no further part ("" while it can): its DHT or averager process has exited."""
        for what, process in (("DHT", self.dht), ("averager", self.averager)):
            if not process.is_alive():
                return f"its hivemind {what} process (pid {process.pid}) exited with code {process.exitcode}"
        return ""

    def shutdown(self) -> None:
        """Stop the averager, then the DHT (which stops its p2pd)."""
        try:
            if self.averager is not None:
                self.averager.shutdown()
        finally:
            self.dht.shutdown()


def _wait_for_group(control: Any, deadline: float, ask_at: float = math.inf,
                    alone: Callable[[], bool] | None = None, stop: threading.Event | None = None) -> float | None:
    """When (time.monotonic) the step's group began its all-reduce: None if the step ended, `deadline` passed or
    `stop` was set first, or, asked once at `ask_at` while no group has begun, `alone()` said this peer has nobody
    to average with."""
    while time.monotonic() < deadline and not control.done() and not (stop is not None and stop.is_set()):
        if control.began_allreduce:
            return time.monotonic()
        if alone is not None and time.monotonic() >= ask_at:
            ask_at = math.inf
            if alone() and not control.began_allreduce:
                return None
        time.sleep(0.01)
    return None


def process_result(process: Any, kind: str, future: Any, timeout_s: float, during: str, late: str = "",
                   stop: threading.Event | None = None) -> Any:
    """The result of `future`, which hivemind's `kind` process (`process`: its DHT, its averager) resolves, waited for
    at most `timeout_s`: PeerDied as soon as that process has exited (its future would never resolve), saying it
    exited `during` what; when it did not answer in time, PeerDied saying it `late`, or without `late` TimeoutError.
    Given `stop` (the worker's), PeerStopped within STOP_POLL_S of its being set; the future is left as it is (its
    process is shut down next; one cancelled here is an error in hivemind's process as it answers)."""
    deadline = time.monotonic() + timeout_s
    poll_s = 1.0 if stop is None else STOP_POLL_S
    while True:
        try:
            return future.result(timeout=max(0.0, min(poll_s, deadline - time.monotonic())))
        except TimeoutError:
            if future.done():  # the process's own operation raised a timeout: its error, not a silent process
                raise
        name = f"its hivemind {kind} process (pid {process.pid})"
        if stop is not None and stop.is_set():
            raise PeerStopped(f"stopped while {name} was waited for {during}")
        if not process.is_alive():
            try:  # what it wrote before it exited (a failed start's error) may not have been read yet
                return future.result(timeout=LAST_WORD_S)
            except TimeoutError:
                if future.done():
                    raise
            raise PeerDied(f"{name} exited with code {process.exitcode} {during}")
        if time.monotonic() >= deadline:
            future.cancel()
            if not late:
                raise TimeoutError(f"{name} did not answer within {timeout_s:g} s {during}")
            raise PeerDied(f"{name} {late}")


def dht_result(dht: hivemind.DHT, what: str, future: Any, timeout_s: float = DHT_ANSWER_S,
               stop: threading.Event | None = None) -> Any:
    """The result of a call into the DHT's process (`future`, from `return_future=True`), waited for at most
    `timeout_s`; PeerDied as soon as that process has exited (its future would never resolve) or when it did not
    answer in time; given `stop`, PeerStopped once it is set (`process_result`). `what` names the call in the
    message."""
    return process_result(dht, "DHT", future, timeout_s, f"during a {what}",
                          f"did not answer a {what} within {timeout_s:g} s", stop)


def store_record(dht: hivemind.DHT, subkey: str, key: str, value: dict[str, Any], ttl_s: float) -> bool:
    """Store `value` under `key`, `subkey` (a peer's `record_subkey`: its DHT signs the record), for `ttl_s` seconds;
    whether the DHT accepted it."""
    future = dht.store(key, value, get_dht_time() + ttl_s, subkey=subkey, return_future=True)
    return bool(dht_result(dht, "store", future))


# (key, subkey, problem) of the records `read_records` refused and logged: a record lingering for its TTL is logged
# once. The peer ids `warn_specless` logged, likewise.
_REFUSED: set[tuple[str, str, str]] = set()
_SPECLESS: set[str] = set()
_MAX_REFUSED_LOGGED = 4096


def _first_time(logged: set[Any], item: Any) -> bool:
    """Whether `item` is not yet in `logged` (then added): a line is logged once per item. `logged` is emptied when it
    holds _MAX_REFUSED_LOGGED items, so that records under ever new subkeys repeat a line rather than grow it."""
    if item in logged:
        return False
    if len(logged) >= _MAX_REFUSED_LOGGED:
        logged.clear()
    logged.add(item)
    return True


def warn_specless(records: Mapping[str, Mapping[str, Any]]) -> None:
    """Log a WARNING, once per peer id, for each digest record of `records` (by peer id) that names no run spec digest:
    its peer runs an rcswarm from before digest records carried one (a rolling upgrade), so a peer with a digest does
    not count it in its decisions (`HivemindPeer.records`) and loads no state from it (`_check_state`)."""
    for peer, record in records.items():
        if not record.get("spec") and _first_time(_SPECLESS, peer):
            log.warning("peer %s publishes no run spec digest in its digest records (probably an older rcswarm): it "
                        "is not counted in this peer's decisions (re-sync, alone, the final replica) and no state is "
                        "loaded from it; run every peer of the swarm on one rcswarm version", peer)


def read_records(dht: hivemind.DHT, key: str, run: str) -> dict[str, dict[str, Any]]:
    """The records under `key` whose run is `run`, by the peer id that signed them (`subkey_owner`), each checked
    against the schema again (`record_problem`: a DHT node with an older validator may serve a record this one
    refuses); a refused record is left out and logged once. The signatures themselves are checked by this node's
    RSASignatureValidator on every record it stores or receives."""
    found = dht_result(dht, "get", dht.get(key, latest=True, return_future=True))
    if found is None or not isinstance(found.value, dict):
        return {}
    out = {}
    for subkey, item in found.value.items():
        value = getattr(item, "value", None)
        if not isinstance(value, dict) or value.get("run") != run:
            continue
        owner, problem = subkey_owner(subkey)
        problem = problem or record_problem(key, value)
        if not problem:
            out[owner] = value
        elif _first_time(_REFUSED, (key, str(subkey), problem)):
            log.warning("the %s record of subkey %.80s is left out: %s", key, str(subkey), problem)
    return out


def _check_state(loaded: Any, run: str, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                 spec_digest: str = "") -> tuple[str, Any]:
    """("", (version, tensors)) for a state that matches this run's 2 × len(names) tensors (and, given `spec_digest`,
    whose metadata names that digest of the run spec), else (problem, None)."""
    if loaded is None:
        return "no peer answered", None
    metadata, tensors = loaded
    if not isinstance(metadata, dict) or metadata.get("run") != run or not is_version(metadata.get("version")):
        return (f"metadata {str(metadata)[:200]!r}: expected run {run!r} and a version, an integer in "
                f"[0, {MAX_VERSION})"), None
    if spec_digest and metadata.get("spec") != spec_digest:
        return (f"the donor's run spec differs from this peer's (digest {str(metadata.get('spec'))[:64]!r}, this "
                f"peer's {spec_digest!r}): a peer of another config is another swarm"), None
    want = list(shapes) * 2
    got = [tuple(t.shape) for t in tensors]
    if got != want:
        return f"{len(got)} tensors of shapes {got[:4]}...: expected {len(want)} of this model's shapes", None
    tensors = [t.to(torch.float32) for t in tensors]
    if not all(codecs.all_finite(t) for t in tensors):
        return "the state has non-finite values", None
    return "", (int(metadata["version"]), tensors)

