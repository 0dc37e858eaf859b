"""A real full disk (a write past RLIMIT_FSIZE, in a child process) reaches the worker as the OSError it handles:
safetensors reports it as its own SafetensorError, which `save_feedback` turns into an OSError
(tests/worker/test_feedback_restart.py covers what the worker does with it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from rcswarm.sync.feedback_state import FEEDBACK_FILE


def test_safetensors_reports_a_full_disk_as_an_os_error(tmp_path) -> None:
    """A real write past the space left (RLIMIT_FSIZE, as a full disk): safetensors raises its own SafetensorError,
    which `save_feedback` turns into the OSError the worker handles."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from pathlib import Path
        import torch
        from rcswarm.protos.v1 import coordinator_pb2 as pb
        from rcswarm.sync.codec import ErrorFeedback, WireFormat
        from rcswarm.sync.feedback_state import save_feedback
        feedback = ErrorFeedback(0.95)
        feedback.restore({{"w": torch.ones(100_000)}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            save_feedback(Path({str(tmp_path)!r}), "run", WireFormat.of(pb.CODEC_FP32), feedback, 3)
        except OSError as exc:
            print("OSError", exc)
            sys.exit(0)
        sys.exit(1)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "File too large" in done.stdout
    assert not (tmp_path / FEEDBACK_FILE).exists() and not list(tmp_path.iterdir())
