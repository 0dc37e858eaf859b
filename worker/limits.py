"""The worker's own limits on what a run spec may make it allocate (issue #31).

A coordinator, or a RUN.toml, names the model a worker builds. Before building it the worker counts its
parameters on the meta device (`registry.parameter_count_of`: shapes only, nothing allocated) and refuses a
model above its limit with one line naming both numbers. The limit is `--max-params` or, by default, what
the device's memory holds at `TRAINING_BYTES_PER_PARAMETER` bytes per parameter: θ, its gradient, AdamW's
two moments, the round's base θ_v, Δ, the error-feedback residual and a received payload, float32 each
(8 × 4 bytes). Activations come on top and depend on the window; the limit bounds what the parameters
alone would take, so a spec that asks for more than the machine has is refused before the first byte.
The memory is the device's: a GPU's total memory, or the host's physical memory (lowered to the cgroup's
limit in a container: `models/limits.host_memory_bytes`, which the coordinator's own bound uses too).

The window is bounded too, coarsely: a step's positions (batch × seq_len of the windows every worker of the run
trains, `RunSpec.training_windows`: its data or each schedule row; of its held-out windows; and of every assignment
the coordinator sends, a per-worker length or an adaptive rung among them) at most `--max-step-tokens`, DEFAULT_MAX_STEP_TOKENS by
default, 16 × the largest step of the shipped GPU configs; a coordinator that assigned batch 2^22 × seq_len 256
made a worker allocate until the machine swapped (review of a hostile coordinator, 2026-11-28). What a position
costs depends on the model (a language model's logits, a frame model's streamed states), so this bound stops the
absurd, not every window a device cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from rcswarm.config.runspec import RunSpec
from rcswarm.models.limits import (
    GIB,
    bounded_parameter_count,
    counted,
    describe_model,
    host_memory_bytes,
    modules_problem,
)

TRAINING_BYTES_PER_PARAMETER = 32
DEFAULT_MAX_STEP_TOKENS = 1 << 21


def device_memory_bytes(device: str) -> int:
    """The memory of the torch device `device` ("cpu", "cuda", "cuda:1"): a GPU's total memory, else the host's."""
    if device.startswith("cuda"):
        import torch  # only for a GPU

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return host_memory_bytes()


@dataclass(frozen=True)
class ModelLimit:
    """The most parameters this worker builds, and where that number comes from; the most positions one step
    trains or evaluates (`max_step_tokens`)."""

    max_params: int
    source: str
    max_step_tokens: int = DEFAULT_MAX_STEP_TOKENS

    @classmethod
    def of(cls, device: str, max_params: int = 0, max_step_tokens: int = 0) -> ModelLimit:
        """`max_params` (--max-params) when > 0, else what `device`'s memory holds; `max_step_tokens`
        (--max-step-tokens) when > 0, else DEFAULT_MAX_STEP_TOKENS."""
        step_tokens = max_step_tokens if max_step_tokens > 0 else DEFAULT_MAX_STEP_TOKENS
        if max_params > 0:
            return cls(max_params, "--max-params", step_tokens)
        memory = device_memory_bytes(device)
        return cls(memory // TRAINING_BYTES_PER_PARAMETER,
                   f"the {memory / GIB:.1f} GiB of {device} memory at {TRAINING_BYTES_PER_PARAMETER} bytes of training "
                   "state per parameter; --max-params sets it", step_tokens)

    def window_problem(self, seq_len: int, batch: int, what: str) -> str:
        """Why this worker does not train or evaluate `batch` windows of `seq_len` at once ("" when it may)."""
        if seq_len * batch <= self.max_step_tokens:
            return ""
        return (f"{what}: batch {batch:,} × seq_len {seq_len:,} = {seq_len * batch:,} positions a step, more than "
                f"this worker's limit of {self.max_step_tokens:,} (--max-step-tokens)")

    def windows_problem(self, spec: RunSpec, assigned: bool = False) -> str:
        """Why this worker does not train or evaluate a window of `spec`, one run's ("" when it may): the windows
        every worker of the run trains in turn (data.seq_len, or each schedule row) and the held-out windows; with
        `assigned`, also the lengths a coordinator assigns per worker (curriculum.worker_seq_lens, the adaptive
        ladder), which a worker checks when it is assigned one (`rcswarm run` checks them for its workers)."""
        data, run = spec.data, spec.run
        windows = [(seq_len, batch, f"the run spec's {key} = {seq_len}") for key, seq_len, batch in spec.training_windows()
                   if assigned or key in ("data.seq_len", "curriculum.schedule")]
        windows.append((run.eval_seq_len or data.seq_len, data.batch_size, "the run spec's held-out windows"))
        for seq_len, batch, what in windows:
            window = self.window_problem(seq_len, batch, what)
            if window:
                return window
        return ""

    def problem(self, spec: RunSpec) -> str:
        """Why this worker does not build the spec's model or train its windows ("" when it may); ValueError for a
        model config that does not build at all (an unknown name, preset or field)."""
        window = self.windows_problem(spec)
        if window:
            return window
        model = spec.model
        # Stopped far past the limit: counting n_layers = 100000 in full took 70 s and 2.7 GiB (models/limits.py).
        count = bounded_parameter_count(model.name, model.preset, model.overrides, self.max_params)
        if count.complete and count.parameters <= self.max_params:
            return ""
        described = describe_model(model.name, model.preset, model.overrides)
        need = (count.parameters if count.complete else self.max_params) * TRAINING_BYTES_PER_PARAMETER / GIB
        return modules_problem(count, self.max_params, described, "a worker") or (
            f"the model ({described}) has {counted(count, self.max_params)} ({'about' if count.complete else 'more than'} "
            f"{need:,.1f} GiB of training state): more than this worker's limit of {self.max_params:,} ({self.source})")
