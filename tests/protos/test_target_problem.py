"""`target_problem`, the one check of a client's HOST:PORT (protos/transport.py): a host that is no host name or IP
address, and a port no client can dial, are refused with one rule and one message for every client. Port 0 only where
the target is `dialled` (a launcher plans with `head:0` before its coordinator has a port); servers bind theirs with
checks of their own."""

from __future__ import annotations

import pytest

from rcswarm.protos.transport import target_problem
from rcswarm.worker.options import ClientOptions


@pytest.mark.parametrize("target", ["127.0.0.1:50051", "coordinator:1", "coordinator.ml.svc.cluster.local.:443",
                                    "compose_service:50051", "[::1]:65535", "[fe80::1%eth0]:50051",
                                    "dns:///coordinator", "dns:///coordinator:50051", "unix:/run/rcswarm.sock"])
def test_the_targets_a_client_dials_pass(target: str) -> None:
    assert target_problem(target) is None and target_problem(target, dialled=True) is None


@pytest.mark.parametrize(("target", "refusal"), [
    ("a b:50051", "host 'a b': expected a host name (letters, digits, '-', '_' and '.') or an IP address"),
    ("a..b:50051", "host 'a..b': expected a host name"),
    ("h\u00e9te:1", "host 'h\u00e9te': expected a host name"),
    ("[zz]:1", "'zz' is not an IP address; expected [V6]:PORT"),
    ("127.0.0.1:65536", "port 65536: expected HOST:PORT with a port in 0..65535"),
    ("dns:///coordinator:70000", "port 70000: expected HOST:PORT with a port in 0..65535"),
    ("127.0.0.1:abc", "port 'abc': expected HOST:PORT with a port in 0..65535"),
])
def test_a_host_or_port_no_client_dials_is_refused(target: str, refusal: str) -> None:
    """"a b" was dialled as a name no resolver finds: UNAVAILABLE, retried for the whole patience."""
    assert target_problem(target).startswith(f"--coordinator {target!r}: {refusal}")
    with pytest.raises(ValueError, match=r"^--coordinator "):
        ClientOptions(target)


@pytest.mark.parametrize("target", ["127.0.0.1:0", "[::1]:0", "dns:///coordinator:0", "ipv4:127.0.0.1:0", "head:0"])
def test_port_0_is_refused_only_where_it_is_dialled(target: str) -> None:
    """Before, the transport said "a port in 0..65535" while `rcswarm worker` refused port 0 by a rule of its own."""
    assert target_problem(target) is None
    assert target_problem(target, dialled=True) == (f"--coordinator {target!r}: port 0: expected HOST:PORT with a port "
                                                    "in 1..65535 (0 cannot be dialled)")
