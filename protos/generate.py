"""Regenerate the committed Python stubs from protos/v1/coordinator.proto.

The stubs are committed (so neither the wheel nor an editable install needs grpcio-tools);
tests/protos/test_protos.py fails when regenerating them would change them. Run after editing
the .proto:  python -m rcswarm.protos.generate
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent / "v1"
PROTO_NAME = "coordinator.proto"
GENERATED = ("coordinator_pb2.py", "coordinator_pb2.pyi", "coordinator_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Compile the .proto as rcswarm/protos/v1/coordinator.proto into out_dir; return the stub paths."""
    from grpc_tools import protoc  # dev dependency, imported only here

    with tempfile.TemporaryDirectory() as tmp:
        include_root = Path(tmp)
        package_dir = include_root / "rcswarm" / "protos" / "v1"
        package_dir.mkdir(parents=True)
        shutil.copy(PROTO_DIR / PROTO_NAME, package_dir / PROTO_NAME)
        args = [
            "protoc",
            f"-I{include_root}",
            f"--python_out={include_root}",
            f"--pyi_out={include_root}",
            f"--grpc_python_out={include_root}",
            f"rcswarm/protos/v1/{PROTO_NAME}",
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_DIR / PROTO_NAME}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in GENERATED:
            target = out_dir / name
            shutil.copy(package_dir / name, target)
            written.append(target)
        return written


def main() -> int:
    for path in generate(PROTO_DIR):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
