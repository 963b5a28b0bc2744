"""An interactive job's launch spec: its terminal goes to spec.json, its TERM to the job, and
no output file is named (gpuq/agent/jobs/launch_spec.py)."""

from __future__ import annotations

from gpuq.agent.jobs.launch_spec import LaunchOrder, LaunchSpec, NodePolicy, build_launch
from gpuq.domain.interactive_jobs import Terminal
from gpuq.domain.model import JobSpec


def launch(terminal: Terminal | None, env: dict[str, str]) -> LaunchSpec:
    spec = JobSpec(name="j", script="#!/bin/sh\nsh\n", workdir="/tmp", env=env, terminal=terminal)
    return build_launch(
        LaunchOrder(job_id=7, spec=spec, gpus=(), user="alice"), NodePolicy("n1", {})
    )


def test_a_terminal_job_gets_its_terminal_and_term() -> None:
    terminal = Terminal(rows=50, cols=132, term="screen-256color", stdin_tty=True, stdout_tty=False)
    spec = launch(terminal, {"TERM": "xterm", "EDITOR": "vi"})
    assert spec.terminal == {
        "rows": 50,
        "cols": 132,
        "term": "screen-256color",
        "stdin_tty": True,
        "stdout_tty": False,
    }
    assert spec.env["TERM"] == "screen-256color" and spec.env["EDITOR"] == "vi"
    assert (spec.stdout_path, spec.stderr_path) == ("", "")
    assert LaunchSpec.from_dict(spec.to_dict()) == spec  # what an adopting agent reads back


def test_an_empty_term_keeps_the_submitters_and_batch_jobs_have_none() -> None:
    assert launch(Terminal(term=""), {"TERM": "vt100"}).env["TERM"] == "vt100"
    batch = launch(None, {"TERM": "vt100"})
    assert batch.terminal is None and batch.env["TERM"] == "vt100"
    assert batch.stdout_path.endswith(".out")
