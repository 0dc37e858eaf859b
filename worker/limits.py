"""The worker's own limits on what a run spec may make it allocate (issue #31).

A coordinator, or a RUN.toml, names the model a worker builds. Before building it the worker counts its
parameters on the meta device (`registry.parameter_count_of`: shapes only, nothing allocated) and refuses a
model above its limit with one line naming both numbers. The limit is `--max-params` or, by default, what
the device's memory holds at `TRAINING_BYTES_PER_PARAMETER` bytes per parameter: θ, its gradient, AdamW's
two moments, the round's base θ_v, Δ, the error-feedback residual and a received payload, float32 each
(8 × 4 bytes). Activations come on top and depend on the window; the limit bounds what the parameters
alone would take, so a spec that asks for more than the machine has is refused before the first byte.
The memory is the device's: a GPU's total memory, or the host's physical memory (lowered to the cgroup's
limit in a container).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rcswarm.config.runspec import RunSpec

TRAINING_BYTES_PER_PARAMETER = 32
GIB = 1 << 30
# cgroup v2, then v1: the memory a container may use ("max" or a huge number when unlimited).
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def host_memory_bytes() -> int:
    """The host's physical memory, or the cgroup's memory limit when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def device_memory_bytes(device: str) -> int:
    """The memory of the torch device `device` ("cpu", "cuda", "cuda:1"): a GPU's total memory, else the host's."""
    if device.startswith("cuda"):
        import torch  # only for a GPU

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return host_memory_bytes()


@dataclass(frozen=True)
class ModelLimit:
    """The most parameters this worker builds, and where that number comes from."""

    max_params: int
    source: str

    @classmethod
    def of(cls, device: str, max_params: int = 0) -> ModelLimit:
        """`max_params` (--max-params) when > 0, else what `device`'s memory holds."""
        if max_params > 0:
            return cls(max_params, "--max-params")
        memory = device_memory_bytes(device)
        return cls(memory // TRAINING_BYTES_PER_PARAMETER,
                   f"the {memory / GIB:.1f} GiB of {device} memory at {TRAINING_BYTES_PER_PARAMETER} bytes of training "
                   "state per parameter; --max-params sets it")

    def problem(self, spec: RunSpec) -> str:
        """Why this worker does not build the spec's model ("" when it may); ValueError for a model config that
        does not build at all (an unknown name, preset or field)."""
        from rcswarm.models import registry  # torch, only once a spec is checked

        model = spec.model
        count = registry.parameter_count_of(model.name, model.preset, model.overrides)
        if count <= self.max_params:
            return ""
        overrides = f", overrides {dict(model.overrides)}" if model.overrides else ""
        need = count * TRAINING_BYTES_PER_PARAMETER / GIB
        return (f"the model ({model.name} preset {model.preset!r}{overrides}) has {count:,} parameters (about "
                f"{need:,.1f} GiB of training state): more than this worker's limit of {self.max_params:,} "
                f"({self.source})")
