"""What one streaming backward pass did (`StreamingStats`), for either mode of `rcswarm.train.bptt.streaming`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StreamingStats:
    """What one `streaming_backward` call did.

    `max_grad_chunk_steps` is the largest number of steps encoded with
    gradients at once (never more than `chunk_steps`); `paged_tensors` and
    `paged_bytes` count the core's saved tensors that went through the pager,
    `resident_tensors` those it left in place (parameters and the embeddings
    leaf), `unpacked_tensors` the pages the backward pass read back, and
    `copied_to_host` whether pages, states or embeddings were actually copied
    (CUDA) rather than already on the host. `scored` is the number of targets
    the loss averaged over.

    Checkpointed runs (the paged fields are 0): `schedule` describes the
    schedule ("paged" otherwise) over segments of `segment_steps` steps,
    `stored_states` and `stored_state_bytes` are
    the most core states (and their bytes) kept at once, `core_advances` the
    segment forward passes run again without gradients, `embedding_bytes` the
    embeddings kept for them and `embeddings_on_disk` whether in a file.
    """

    n_steps: int
    chunk_steps: int
    n_chunks: int
    max_grad_chunk_steps: int
    paged_tensors: int
    paged_bytes: int
    resident_tensors: int
    unpacked_tensors: int
    copied_to_host: bool
    scored: int = 0
    schedule: str = "paged"
    segment_steps: int = 0
    stored_states: int = 0
    stored_state_bytes: int = 0
    core_advances: int = 0
    embedding_bytes: int = 0
    embeddings_on_disk: bool = False
