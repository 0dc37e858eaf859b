"""Option values the CLI fuzz review (2026-11-29) found accepted though no worker could use them: infinite or huge
seconds, --device types rcswarm does not train on, --coordinator forms gRPC dials as something else, a join token
too long for gRPC metadata, and a --threads torch refuses. Each is refused with a ValueError naming its flag."""

from __future__ import annotations

import pytest

from rcswarm.protos.wire import one_token
from rcswarm.worker.options import MAX_SECONDS, ClientOptions, WorkerOptions, device_problem, max_threads


@pytest.mark.parametrize("flag", ["patience_s", "rpc_timeout_s", "transfer_timeout_s"])
@pytest.mark.parametrize("value", [float("inf"), 1e300, float("nan"), MAX_SECONDS * 2])
def test_infinite_or_huge_seconds_are_refused_naming_the_flag(flag: str, value: float) -> None:
    """inf or 1e300 overflowed the gRPC deadline (every call DEADLINE_EXCEEDED, blamed on the coordinator) or
    made the patience endless."""
    name = "--" + flag.replace("_", "-")
    with pytest.raises(ValueError, match=rf"^{name} .*: expected a finite number of seconds > 0 and at most 1e\+06"):
        WorkerOptions("127.0.0.1:50051", **{flag: value})
    assert getattr(WorkerOptions("127.0.0.1:50051", **{flag: MAX_SECONDS}), flag) == MAX_SECONDS


@pytest.mark.parametrize("target", ["::1", ":50051", "host:1:2", " 127.0.0.1:1", "127.0.0.1:1 ", "[]:1", "[::1]"])
def test_coordinator_forms_gRPC_would_dial_as_another_address_are_refused(target: str) -> None:
    """"::1" was read as port 1 (gRPC dialed [::1]:443), ":50051" has no host, "host:1:2" no one port, and a
    leading space passed the check and then failed to resolve."""
    with pytest.raises(ValueError, match=r"^--coordinator "):
        WorkerOptions(target)
    with pytest.raises(ValueError, match=r"^--coordinator "):
        ClientOptions(target)


@pytest.mark.parametrize("target", ["127.0.0.1:50051", "[::1]:50051", "coordinator.example:443",
                                    "dns:///coordinator:50051", "ipv6:[::1]:50051", "unix:/run/rcswarm.sock"])
def test_the_coordinator_forms_gRPC_dials_as_written_pass(target: str) -> None:
    assert ClientOptions(target).coordinator == target


def test_a_join_token_longer_than_grpc_metadata_holds_is_refused_naming_its_source_not_the_token() -> None:
    """A 20,000-character token was accepted, then every call was refused RESOURCE_EXHAUSTED (metadata over
    16 KiB) for the whole patience."""
    token = "a" * 20_000
    with pytest.raises(ValueError, match=r"^the join token of --token has 20000 characters, more than 4096") as caught:
        one_token(token, "--token")
    assert token[:64] not in str(caught.value)
    assert one_token("b" * 4096 + "\n", "$RCSWARM_TOKEN") == "b" * 4096


@pytest.mark.parametrize("threads", [-1, 100_000, 18446744073709551616, max_threads() + 1])
def test_threads_torch_refuses_are_refused_naming_the_flag(threads: int) -> None:
    """100000 raised torch's RuntimeError; 2**64 "Overflow when unpacking long long", naming no flag."""
    with pytest.raises(ValueError, match=rf"^--threads {threads}: expected 0\.\.{max_threads()} "):
        WorkerOptions("127.0.0.1:50051", threads=threads)
    assert WorkerOptions("127.0.0.1:50051", threads=max_threads()).threads == max_threads()
    assert max_threads() <= 1024


@pytest.mark.parametrize("name", ["mps", "meta", "cuda:x", "gpu", "xla", "cpu:", "auto:0", " cpu", ""])
def test_devices_rcswarm_does_not_train_on_are_refused_by_form(name: str) -> None:
    assert device_problem(name) == f"--device {name!r}: expected auto, cpu, cuda or cuda:N"


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:3"])
def test_the_devices_a_worker_trains_on_pass_by_form(name: str) -> None:
    assert device_problem(name) is None


@pytest.mark.parametrize("name", ["mps", "meta"])
def test_resolve_device_refuses_torch_types_rcswarm_does_not_train_on(name: str) -> None:
    """torch.device("mps") and ("meta") passed resolve_device and the worker crashed later with a traceback."""
    from rcswarm.train.round import resolve_device

    with pytest.raises(ValueError, match=rf"^--device '{name}': expected auto, cpu, cuda or cuda:N$"):
        resolve_device(name)
    assert str(resolve_device("cpu")) == "cpu"
