"""Regenerate gpuq/v1 from proto/gpuq/v1/*.proto: `python proto/generate.py`.

tests/unit/test_wire_generated.py runs the same generation into a temporary folder and fails
when the committed files differ, so a .proto edit without regeneration cannot land.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent


def generate(out_dir: Path) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every .proto under out_dir/gpuq/v1."""
    from grpc_tools import protoc  # the pinned grpcio-tools of the test extra

    protos = sorted(PROTO_ROOT.glob("gpuq/v1/*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(PROTO_ROOT)) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed")
    return sorted((out_dir / "gpuq" / "v1").glob("*_pb2*.py*"))


if __name__ == "__main__":
    written = generate(REPO_ROOT)
    print("\n".join(str(p.relative_to(REPO_ROOT)) for p in written))
    sys.exit(0)
