"""scripts/release.sh builds what a release needs: an sdist that carries the C sources and a
wheel built from it with the C extension inside, and says where a compiler is needed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_release_builds_a_checked_sdist_and_wheel(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "release.sh")],
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHON": sys.executable,
            "OUT": str(out),
            "TMPDIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1 and len(list(out.glob("*.tar.gz"))) == 1
    wheel = zipfile.ZipFile(wheels[0])
    names = wheel.namelist()
    assert any(n.startswith("gpuq/agent/_supervise") and n.endswith(".so") for n in names)
    # `gpuq` the C stub (copied as is: no `#!` line to rewrite), `gpuq-py` the Python stub
    # (`#!python`, which pip rewrites to the environment's interpreter), both executable
    scripts = {n.rsplit("/", 1)[1]: n for n in names if ".data/scripts/" in n}
    assert set(scripts) == {"gpuq", "gpuq-py"}
    assert wheel.read(scripts["gpuq"]).startswith(b"\x7fELF")
    assert wheel.read(scripts["gpuq-py"]).startswith(b"#!python\n")
    for name in scripts.values():
        assert wheel.getinfo(name).external_attr >> 16 & 0o111 == 0o111, name
    tag = wheels[0].name.split("-", 2)[2].removesuffix(".whl")
    assert f"This wheel fits {tag} only" in result.stdout
    assert "apt install build-essential python3-dev" in result.stdout
    assert "== auditwheel" in result.stdout
