"""Listings as people use them (issue 13 part 5), through the real `gpuq` command line against
a real coordinator and agent: squeue's filters and --format codes, 80 columns by default,
colour for states on a terminal only (never piped, never with NO_COLOR), history by date,
and job ids that Tab-complete in a real bash."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster
from helpers import needs

ESC = "\x1b["
LONG_NAME = "train-resnet-with-a-very-long-name-that-goes-on-and-on-and-on"
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, dict[str, int]]]:
    """One node, one GPU: a running job, held jobs (a long name, a sweep, an array) and two
    that ended (one failed). Shared by the module's tests: they only read."""
    cluster = Cluster(tmp_path_factory.mktemp("listings"))
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "1xA100-80GB")
        ids = {
            "ok": cluster.submit("true", name="done-ok", gpus=0),
            "bad": cluster.submit("exit 3", name="done-bad", gpus=0),
        }
        for key in ("ok", "bad"):
            cluster.wait_state(ids[key], "completed", "failed")
        ids["runner"] = cluster.submit("sleep 600", name="runner", gpus=1)
        cluster.wait_state(ids["runner"], "running")
        ids["long"] = cluster.submit("true", name=LONG_NAME, gpus=1, hold=True)
        ids["sweep1"] = cluster.submit("true", name="sweep-1", gpus=1, hold=True)
        ids["sweep2"] = cluster.submit("true", name="sweep-2", gpus=1, hold=True)
        ids["array"] = cluster.submit("true", name="arr", gpus=1, array="3-99%8", hold=True)
        ids["pending"] = cluster.submit("true", name="waits", gpus=1)  # the GPU is taken
        yield cluster, ids
    finally:
        cluster.close()


def listed(cluster: Cluster, *args: str) -> list[dict[str, object]]:
    result = cluster.gpuq(*args, "--json")
    assert result.returncode == 0, result.stderr
    found: list[dict[str, object]] = json.loads(result.stdout)
    return found


def names(cluster: Cluster, *args: str) -> set[object]:
    return {j["name"] for j in listed(cluster, *args)}


def test_queue_filters_by_name_state_user_and_node(jobs: tuple[Cluster, dict[str, int]]) -> None:
    cluster, _ = jobs
    me = os.environ.get("USER") or __import__("getpass").getuser()
    assert names(cluster, "queue", "-n", "sweep*") == {"sweep-1", "sweep-2"}
    assert names(cluster, "queue", "--name", "sweep-[!1],runner") == {"sweep-2", "runner"}
    assert names(cluster, "queue", "-t", "R") == {"runner"}
    assert names(cluster, "queue", "--state", "pending") == {"waits"}
    assert names(cluster, "queue", "-t", "PD,running") == {"waits", "runner"}
    assert names(cluster, "queue", "-w", "a") == {"runner"}
    assert names(cluster, "queue", "-w", "nowhere") == set()
    assert names(cluster, "queue", "-u", "nobody-here") == set()
    assert "runner" in names(cluster, "queue", "-u", f"nobody-here,{me}")
    assert "runner" in names(cluster, "queue", "--me")
    # the array's 97 waiting tasks are one entry, unless --array
    collapsed = [j for j in listed(cluster, "queue", "-n", "arr")]
    assert [j["display_id"] for j in collapsed] == [f"{collapsed[0]['id']}_[3-99%8]"]
    assert len(listed(cluster, "queue", "-n", "arr", "--array")) >= 1


@pytest.mark.parametrize(
    "args",
    [
        ("queue", "-t", "XX"),
        ("queue", "-t", "CD"),  # ended jobs are history's (a queue has no limit)
        ("queue", "-n", "[z-a]"),
        ("queue", "-u", "evil\x1b[31m"),
        ("queue", "-o", "%i %Z"),
        ("history", "--since", "last blue moon"),
        ("history", "--until", "3 parsecs ago"),
    ],
)
def test_bad_filters_exit_2_with_one_line(
    jobs: tuple[Cluster, dict[str, int]], args: tuple[str, ...]
) -> None:
    cluster, _ = jobs
    result = cluster.gpuq(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "\x1b" not in result.stderr


def test_format_codes_and_widths_as_squeue(jobs: tuple[Cluster, dict[str, int]]) -> None:
    cluster, ids = jobs
    result = cluster.gpuq("queue", "-t", "R", "-o", "%%%.6i|%-8j|%t|%T|%b|%N|%D|%q")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header == "% JOBID|NAME    |ST|STATE  |TRES_PER_NODE|NODELIST|NODES|QOS"
    runner = str(ids["runner"])
    assert row == f"%{runner:>6}|runner  |R |RUNNING|gpu:1        |a       |1    |normal"
    cut = cluster.gpuq("queue", "-n", "train*", "--noheader", "-o", "%.5i %.10j")
    assert cut.stdout.splitlines() == [f"{ids['long']:>5} {LONG_NAME[:10]}"]  # cut, as squeue


def test_default_listings_fit_80_columns(jobs: tuple[Cluster, dict[str, int]]) -> None:
    cluster, _ = jobs
    narrow = {**cluster.env, "COLUMNS": "80"}
    for args in (("queue",), ("status",), ("history",)):
        result = subprocess.run(
            [sys.executable, "-m", "gpuq.cli.main", *args],
            env=narrow,
            capture_output=True,
            text=True,
            timeout=30,
            cwd=cluster.root,
        )
        assert result.returncode == 0, result.stderr
        widest = max(len(line) for line in result.stdout.splitlines())
        assert widest <= 80, (args, result.stdout)
    queue = run_with(cluster, {"COLUMNS": "80"}, "queue").stdout
    assert LONG_NAME not in queue and "train-resnet" in queue and "…" in queue
    wide = run_with(cluster, {"COLUMNS": "250"}, "queue").stdout
    assert LONG_NAME in wide


def run_with(cluster: Cluster, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuq.cli.main", *args],
        env={**cluster.env, "PYTHONIOENCODING": "utf-8", **env},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cluster.root,
    )


def on_a_terminal(cluster: Cluster, env: dict[str, str], *args: str) -> str:
    """What `gpuq ARGS` writes to a terminal (a pty as its stdout, stdin and stderr)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.main", *args],
        env={k: v for k, v in {**cluster.env, "TERM": "xterm", **env}.items() if v is not None},
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=cluster.root,
    )
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the other side closed: all read
                break
            if not chunk:
                break
            out += chunk
        elif process.poll() is not None:
            break
    process.wait(10)
    os.close(leader)
    assert process.returncode == 0, out
    return out.decode().replace("\r\n", "\n")


def ticks(listing: str) -> str:
    """A listing with its elapsed times (H:MM:SS) masked, each keeping its width."""
    return re.sub(r"\d+:\d\d:\d\d", lambda m: "#" * len(m[0]), listing)


def test_colour_on_a_terminal_only(jobs: tuple[Cluster, dict[str, int]]) -> None:
    cluster, _ = jobs
    env = {"COLUMNS": "120"}
    coloured = on_a_terminal(cluster, env, "queue")
    assert f"{ESC}32mR " in coloured  # running: green, padded before colouring
    assert f"{ESC}36mHD" in coloured and f"{ESC}33mPD" in coloured
    plain = on_a_terminal(cluster, {**env, "NO_COLOR": "1"}, "queue")
    assert ESC not in plain
    # colour moves no column (a running job's TIME may tick between two calls: masked)
    assert ticks(ANSI_RE.sub("", coloured)) == ticks(plain)
    piped = run_with(cluster, env, "queue")
    assert ESC not in piped.stdout
    forced = run_with(cluster, env, "queue", "--color=always")
    assert ESC in forced.stdout and ticks(ANSI_RE.sub("", forced.stdout)) == ticks(piped.stdout)
    assert ESC not in on_a_terminal(cluster, env, "queue", "--color", "never")
    status = on_a_terminal(cluster, env, "status")
    assert f"{ESC}32mR" in status
    history = on_a_terminal(cluster, env, "history")
    assert f"{ESC}31mF" in history


def test_history_filters_by_date_state_user_and_name(
    jobs: tuple[Cluster, dict[str, int]],
) -> None:
    cluster, _ = jobs
    assert names(cluster, "history") == {"done-ok", "done-bad"}
    assert names(cluster, "history", "--since", "1h ago") == {"done-ok", "done-bad"}
    assert names(cluster, "history", "--since", "-2d", "--until", "now") == {"done-ok", "done-bad"}
    assert names(cluster, "history", "--until", "yesterday") == set()
    assert names(cluster, "history", "--since", "2099-01-01") == set()
    assert names(cluster, "history", "--until", "2099-01-01") == {"done-ok", "done-bad"}
    assert names(cluster, "history", "--state", "F") == {"done-bad"}
    assert names(cluster, "history", "-t", "completed") == {"done-ok"}
    assert names(cluster, "history", "--name", "done-o*") == {"done-ok"}
    assert names(cluster, "history", "-u", "nobody-here") == set()
    assert names(cluster, "history", "--me", "-n", "1") <= {"done-ok", "done-bad"}
    assert len(listed(cluster, "history", "-n", "1")) == 1


def bash_complete(cluster: Cluster, words: str, env: dict[str, str] | None = None) -> list[str]:
    """COMPREPLY after the completion function of `gpuq completion bash`, in a real bash,
    for the words typed so far (the last one being completed)."""
    source = cluster.gpuq("completion", "bash")
    assert source.returncode == 0, source.stderr
    gpuq = cluster.root / "bin" / "gpuq"
    gpuq.parent.mkdir(exist_ok=True)
    gpuq.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuq.cli.main "$@"\n')
    gpuq.chmod(0o755)
    (cluster.root / "complete.bash").write_text(source.stdout)
    script = (
        f"source {cluster.root / 'complete.bash'}\n"
        f"COMP_WORDS=({words})\n"
        "COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n"
        '[ -z "${COMP_WORDS[COMP_CWORD]}" ] || true\n'
        "_gpuq_completion gpuq\n"  # as complete -F calls it: the command first
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        env={**cluster.env, "PATH": f"{gpuq.parent}:{os.environ['PATH']}", **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.stderr == "", result.stderr
    return [line for line in result.stdout.splitlines() if line]


@needs(shutil.which("bash") is not None, "no bash")
def test_job_ids_complete_in_bash(jobs: tuple[Cluster, dict[str, int]]) -> None:
    cluster, ids = jobs
    found = bash_complete(cluster, 'gpuq cancel ""')
    assert str(ids["runner"]) in found and str(ids["sweep1"]) in found
    assert str(ids["array"]) in found  # the array's waiting tasks, by the array's id
    assert str(ids["ok"]) not in found  # ended: nothing to cancel
    prefix = str(ids["runner"])[:-1]
    assert all(c.startswith(prefix) for c in bash_complete(cluster, f"gpuq cancel {prefix}"))
    assert "queue" in bash_complete(cluster, "gpuq qu")


@needs(shutil.which("bash") is not None, "no bash")
def test_completion_is_silent_and_fast_without_a_coordinator(
    jobs: tuple[Cluster, dict[str, int]], tmp_path: Path
) -> None:
    cluster, _ = jobs
    empty = tmp_path / "nohome"
    empty.mkdir(mode=0o700)
    started = time.monotonic()
    found = bash_complete(cluster, 'gpuq cancel ""', {"GPUQ_HOME": str(empty)})
    assert found == []
    assert time.monotonic() - started < 10


def test_completion_scripts_for_each_shell(jobs: tuple[Cluster, dict[str, int]]) -> None:
    cluster, _ = jobs
    expected = {
        "bash": ("_gpuq_completion()", "_GPUQ_COMPLETE=bash_complete"),
        "zsh": ("#compdef gpuq", "_gpuq_completion", "_GPUQ_COMPLETE=zsh_complete"),
        "fish": ("function _gpuq_completion", "complete --no-files --command gpuq"),
    }
    for shell, needles in expected.items():
        result = cluster.gpuq("completion", shell)
        assert result.returncode == 0, result.stderr
        for needle in needles:
            assert needle in result.stdout, (shell, needle)
    assert cluster.gpuq("completion", "tcsh").returncode == 2
