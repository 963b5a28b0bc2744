"""The committed gRPC code in gpuq/v1 matches proto/gpuq/v1/*.proto."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_generated_code_is_current(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("generate", REPO / "proto" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = {p.name: p.read_text() for p in module.generate(tmp_path)}
    committed = {p.name: p.read_text() for p in (REPO / "gpuq" / "v1").glob("*_pb2*.py*")}
    assert fresh.keys() == committed.keys(), "run: python proto/generate.py"
    stale = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not stale, f"stale generated files {stale}; run: python proto/generate.py"
