"""Every submission gpuq accepts stays good for every later step (issue 8): whatever options a
user combines, a spec that `build_spec` and the coordinator accept survives a scheduling pass,
`queue`, `show`, `history` and a coordinator restart, and scheduling goes on for everyone."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path
from typing import Any

from e2e_cluster import Cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuq.cli.group import run
from gpuq.errors import GpuqError
from gpuq.submission import build_spec


def fuzz(*values: Any) -> st.SearchStrategy[Any]:
    """Values as people type them (the first half is usually valid, the rest hostile), and
    arbitrary text; mostly the former, so that many combinations get accepted."""
    good = st.sampled_from(values[: (len(values) + 1) // 2])
    return st.one_of(good, good, good, st.sampled_from(values), st.text(max_size=12))


OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "gpus": fuzz(0, 1, 2, "2", 4, 5, 64, -1, "1e3"),
        "cpus": fuzz(1, 2, "2", 0, 100000, "-4"),
        "mem": fuzz("1G", "512", "40GiB", "-1", "99999999T", "1e400", "nan"),
        "gpu_mem": fuzz("40G", "81559M", "200G", "0"),
        "time": fuzz("1", "90:00", "1-00:00:00", "0", "9999-00:00:00", "-5"),
        "begin": fuzz("now+60", "16:00", "2026-12-01T09:00", "tomorrow", "now+3000000d", "x"),
        "signal": fuzz("USR1@3", "TERM", "USR2@0", "USR1@99999999999999999", "KILL", "64@1"),
        "array": fuzz("0-3", "0-9999%8", "1,3,5-7", "0-15:4%2", "5", "0-99999999999", "0-3%0"),
        "nice": fuzz(0, 100, -5, 10**9),
        "name": fuzz("ok", "a.b-c", "n@1", "bad name", "ü", "x" * 200, "a\nb", "a\x1b[31m"),
        "qos": fuzz("low", "high", "normal", "nope"),
        "after": st.lists(
            fuzz("1", "1:any", "afterok:1", "singleton", "999999", "1_0"), max_size=2
        ),
        "hold": st.booleans(),
        "env": st.lists(fuzz("A=1", "X=\u00e9", "BAD KEY=1", "=1"), max_size=2),
        "output": fuzz("out-%j.txt", "%x-%a.out", "/dev/null", "a\nb"),
        "no_requeue": st.booleans(),
        "singleton": st.booleans(),
    },
)


def cli(home: Path, *args: str) -> tuple[int, str]:
    """The real command line, in this process (a process per call would make this slow)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(["--home", str(home), *args])
    return code, err.getvalue()


def test_every_accepted_submission_survives_every_later_step(bare_cluster: Cluster) -> None:
    cluster = bare_cluster
    cluster.start_coordinator()
    cluster.start_agent("a", "4xA100-80GB")
    client = cluster.client()
    first = cluster.submit("true")  # so that `--after 1` names a job
    accepted: list[int] = []
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(cluster.root)}

    def scheduling_goes_on() -> None:
        probe = cluster.submit("true", qos="high")
        cluster.wait_state(probe, "completed")

    @settings(
        max_examples=100,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(OPTIONS)
    def check(options: dict[str, Any]) -> None:
        try:
            spec = build_spec(wrap="true", environ=environ, chdir=str(cluster.root), **options)
        except GpuqError:
            return  # refused at the edge: one clear error, nothing created
        if spec.array is not None and len(spec.array.indices) > 20:
            spec = dataclasses.replace(spec, hold=True)  # keep the suite fast
        try:
            [job_id] = client.submit_spec(spec)
        except GpuqError:
            return  # refused by the coordinator (no such qos, can never run, ...)
        accepted.append(job_id)
        scheduling_goes_on()
        client.get(job_id)
        for args in (["queue"], ["queue", "--long"], ["show", str(job_id)], ["history"]):
            code, err = cli(cluster.home, *args)
            assert code == 0 and "Traceback" not in err, (args, options, err)

    check()
    assert first not in accepted
    cluster.kill(cluster.coordinator)
    cluster.start_coordinator()
    for job_id in accepted:
        client.get(job_id)
        code, err = cli(cluster.home, "show", str(job_id))
        assert code == 0, err
    for args in (["queue", "--long"], ["status"], ["history", "-n", "1000"]):
        code, err = cli(cluster.home, *args)
        assert code == 0 and "Traceback" not in err, (args, err)
    scheduling_goes_on()
