"""Regenerate the committed gRPC stubs from agent.proto (`make proto`).

The stubs are committed rather than built at install time so that devices need
no grpcio-tools; tests/test_proto_stubs.py regenerates them into a temporary
directory and fails when the committed ones are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("deploy/proto/agent.proto")


def generate(out_dir: Path) -> list[Path]:
    """Write agent_pb2.py, agent_pb2.pyi and agent_pb2_grpc.py under out_dir/deploy/proto."""
    from grpc_tools import protoc  # test-only dependency: devices never regenerate

    (out_dir / PROTO.parent).mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(ROOT / PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    return sorted((out_dir / PROTO.parent).glob("agent_pb2*"))


if __name__ == "__main__":
    written = generate(ROOT)
    print("\n".join(str(p.relative_to(ROOT)) for p in written))
    sys.exit(0)
