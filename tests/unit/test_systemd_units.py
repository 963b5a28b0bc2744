"""The systemd units in systemd/ are valid (systemd-analyze verify), once ExecStart points at
this installation's gpuq, which is what an admin adjusts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from helpers import skip_or_fail

UNITS = Path(__file__).resolve().parents[2] / "systemd"


def test_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        skip_or_fail("systemd-analyze is not installed (.ci/run installs it)")
    gpuq = Path(sys.executable).parent / "gpuq"
    assert gpuq.exists()
    names = sorted(p.name for p in UNITS.glob("*.service"))
    assert names == ["gpuq-agent.service", "gpuq-coordinator.service"]
    for name in names:
        text = (UNITS / name).read_text()
        assert "ExecStart=/usr/local/bin/gpuq " in text
        (tmp_path / name).write_text(text.replace("/usr/local/bin/gpuq", str(gpuq)))
    result = subprocess.run(
        [analyze, "verify", *(str(tmp_path / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_agent_unit_leaves_jobs_running_on_restart() -> None:
    text = (UNITS / "gpuq-agent.service").read_text()
    assert "KillMode=process" in text
    assert "Delegate=yes" in text
