"""models/limits.py: the host's memory both sides' limits divide, and a parameter count on the meta device that
stops once past a limit, so that counting an absurd model costs neither time nor memory (review of the coordinator's
own bound: the full count of the byte LSTM at n_layers = 100000 took 70 s and 2.7 GiB of Python objects)."""

from __future__ import annotations

import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from rcswarm.models import limits, registry
from rcswarm.models.limits import bounded_parameter_count, describe_model, host_memory_bytes
from rcswarm.models.registry import ModelEntry

HUGE_LAYERS = {"n_layers": 100_000}
# Python-level memory a stopped count may cost, far below the 2.7 GiB of the full count.
PEAK_BOUND = 64 << 20


def test_host_memory_is_the_cgroup_limit_when_that_is_lower(tmp_path: Path, monkeypatch) -> None:
    unlimited, limited = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    unlimited.write_text("max\n")
    limited.write_text(f"{3 << 30}\n")
    monkeypatch.setattr(limits, "CGROUP_LIMITS", (tmp_path / "absent", unlimited))
    physical = host_memory_bytes()
    assert physical > 3 << 30
    monkeypatch.setattr(limits, "CGROUP_LIMITS", (unlimited, limited))
    assert host_memory_bytes() == 3 << 30
    limited.write_text(f"{physical * 2}\n")
    assert host_memory_bytes() == physical


def test_the_worker_uses_the_one_host_memory_function() -> None:
    from rcswarm.worker import limits as worker_limits

    assert worker_limits.host_memory_bytes is host_memory_bytes
    assert not hasattr(worker_limits, "CGROUP_LIMITS")


def test_describe_model_names_the_overrides_only_when_there_are_some() -> None:
    assert describe_model("lstm_lm", "small", {}) == "lstm_lm preset 'small'"
    assert describe_model("lstm_lm", "small", {"n_layers": 8}) == "lstm_lm preset 'small', overrides {'n_layers': 8}"


def test_the_bounded_count_is_the_models_count_for_every_shipped_preset_and_stops_past_twice_the_limit() -> None:
    for name in registry.list_models():
        for preset in registry.get(name).presets:
            count = registry.parameter_count_of(name, preset)
            # The running count never passes the model's: it ends at it while twice the limit is not below it.
            full = bounded_parameter_count(name, preset, None, (count + 1) // 2)
            assert full.complete and full.parameters == count, (name, preset, full)
            stopped = bounded_parameter_count(name, preset, None, (count - 1) // 2)
            assert stopped.stopped == "parameters" and stopped.parameters == count, (name, preset, stopped)


@dataclass(frozen=True)
class TiedConfig:
    vocab_size: int = 1000
    d_model: int = 64


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight (the output layer built with its own, then given the
    embedding's), and a body built after them."""

    def __init__(self, config: TiedConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.embed.weight
        self.body = nn.Linear(config.d_model, 3 * config.vocab_size, bias=False)


def test_a_tied_parameter_is_counted_once_and_a_replaced_one_no_more(monkeypatch) -> None:
    registry.get("lstm_lm")  # the built-in models registered before one is added beside them
    monkeypatch.setitem(registry._REGISTRY, "tied", ModelEntry("tied", TiedConfig, Tied, {"one": {}}, "tied weights"))
    count = registry.parameter_count_of("tied", "one")
    assert count == 4 * 64_000
    # Twice the limit is the model's count: the head's own weight, replaced, no longer counts once the body is built.
    assert bounded_parameter_count("tied", "one", None, count // 2) == limits.ModelCount(count, 3, "", 4)
    assert bounded_parameter_count("tied", "one", None, count // 2 - 1).stopped == "parameters"


def test_a_huge_model_is_counted_only_until_past_the_limit_quickly_and_in_little_memory() -> None:
    started = time.monotonic()
    tracemalloc.start()
    try:
        count = bounded_parameter_count("lstm_lm", "small", HUGE_LAYERS, 5 * 10**8, max_tensors=10**6)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    seconds = time.monotonic() - started
    assert count.stopped == "parameters" and not count.complete and 10**9 < count.parameters < 10**9 + 10**6, count
    # Counted only until past the limit: the count above and the memory decide; the time is a hang guard only (the
    # whole model counted takes minutes; this took 5-16 s on 2 cores under tracemalloc as their speed varied).
    assert peak < PEAK_BOUND and seconds < 60, (peak, seconds)


def test_a_model_of_many_small_modules_stops_at_the_most_modules() -> None:
    started = time.monotonic()
    count = bounded_parameter_count("lstm_lm", "tiny", HUGE_LAYERS, 10**12, max_modules=1000)
    assert count.stopped == "modules" and count.modules == 1001 and count.parameters < 10**12, count
    assert time.monotonic() - started < 10
    assert limits.MAX_MODULES >= 100 * max(
        bounded_parameter_count(name, preset, None, 10**12).modules
        for name in registry.list_models() for preset in registry.get(name).presets)


def test_one_module_of_many_parameter_tensors_stops_at_the_most_tensors() -> None:
    """The `lstm` baseline is one `nn.LSTM(num_layers=N)`: one submodule, 4 N parameter registrations, each slower
    than the last (torch's RNNBase.__setattr__ searches a list): 100,000 layers counted for minutes, 76 s to a refusal
    at --max-params 10^8 (review of the coordinator's bound, 2026-11-28)."""
    started = time.monotonic()
    count = bounded_parameter_count("lstm", "tiny", HUGE_LAYERS, 10**12)
    assert count.stopped == "tensors" and count.tensors == limits.MAX_TENSORS + 1 and count.modules == 1, count
    assert time.monotonic() - started < 10
    assert "more than 16,384 parameter tensors" in limits.modules_problem(count, 10**12, "lstm", "a coordinator")
    shipped = max(bounded_parameter_count(name, preset, None, 10**12).tensors
                  for name in registry.list_models() for preset in registry.get(name).presets)
    assert 0 < shipped and limits.MAX_TENSORS >= 50 * shipped


def test_a_stopped_count_leaves_no_hook_and_no_meta_device_behind() -> None:
    assert bounded_parameter_count("lstm_lm", "tiny", HUGE_LAYERS, 1).stopped == "parameters"
    assert bounded_parameter_count("lstm_lm", "tiny", HUGE_LAYERS, 10**12, max_modules=1).stopped == "modules"
    layer = nn.Linear(4, 4)  # built after the counts: on the CPU, and no hook stops it
    assert layer.weight.device.type == "cpu" and torch.empty(1).device.type == "cpu"


def test_modules_other_threads_build_meanwhile_are_not_counted() -> None:
    stop = threading.Event()

    def build_elsewhere() -> None:
        while not stop.is_set():
            nn.Linear(64, 64)

    thread = threading.Thread(target=build_elsewhere)
    thread.start()
    try:
        deeper = {"n_layers": 40}
        exact = registry.parameter_count_of("lstm_lm", "small", deeper)
        # Twice the limit is the model's count: a parameter of another thread's counted would stop the count.
        counts = [bounded_parameter_count("lstm_lm", "small", deeper, (exact + 1) // 2, max_modules=300)
                  for _ in range(3)]
    finally:
        stop.set()
        thread.join()
    assert all(count.complete and count.parameters == exact for count in counts), counts


def test_an_unknown_model_config_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no-such-preset"):
        bounded_parameter_count("lstm_lm", "no-such-preset", None, 10)
