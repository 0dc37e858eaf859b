"""What importing a facade loads, checked in a fresh interpreter (the test process has loaded everything)."""

from __future__ import annotations

import subprocess
import sys


def test_the_worker_facade_names_what_it_serves_and_loads_nothing_heavy() -> None:
    """`rcswarm.worker` lists its public names; `import rcswarm.worker` imports no torch, grpc, hivemind or Ray."""
    import rcswarm.worker as facade

    assert set(facade.__all__) == {*facade._HOME_OF, "hivemind_sync"}
    for name in set(facade.__all__) - {"hivemind_sync", "HivemindWorker"}:  # hivemind is an optional extra
        assert getattr(facade, name) is not None, name
    probe = ("import sys, rcswarm.worker; heavy = {'torch', 'grpc', 'hivemind', 'ray'} & set(sys.modules); "
             "assert not heavy, heavy")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60).returncode == 0
