"""The CLI's wall time against a bare interpreter: prints figures, asserts nothing.

    python bench/cli_bench.py [--runs 21] [--cold 5] [--pause 0.2] [--loop 200] [--keep]

Builds a wheel of this checkout (`pip wheel --no-deps`), installs it into a fresh virtual
environment (dependencies from the package index, as pip does), starts that environment's
`gpuq serve` with 4 fake GPUs in a temporary GPUQ_HOME, and times, round-robin so that a busy
machine weighs on every figure alike, each as a new process with its output on a pipe, with
--pause seconds (untimed) before each, as when a person types:
  - `python3 -c pass` (the venv's python): the baseline;
  - `gpuq status`, `queue`, `submit --wrap true --hold`, `show ID`, `cancel ID`, `logs ID`,
    through a warm CLI helper (gpuq.cli.fast), as users run them;
  - the Python stub's own cost before main() (the interpreter and the stub's imports), and
    `gpuq status` through it (`gpuq-py`, where `gpuq` is the C stub: gpuq/cli/fast/stub.c);
  - `for i in $(seq 200); do gpuq submit --hold --wrap true; done` in bash (--loop): per call,
    and submissions per second (target, issue 27: >= 100/s);
  - the cold call: `gpuq queue` with no helper (it runs in-process and starts one), --cold
    times, the helper stopped before each;
  - the slow path (`GPUQ_CLI_HELPER=off`) of `gpuq queue`, for comparison.
Medians, and ratios to the baseline, with the load average. Target (issue 13): every command
<= 2x `python3 -c pass`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuq.cli.fast.helper_control import stop_helpers  # noqa: E402

STUB_IMPORTS = "import sys; from gpuq.cli.fast.stub import main"


def build_venv(work: Path, repo: Path = REPO) -> Path:
    """A fresh venv with the wheel of checkout `repo` (this one) installed; its bin folder."""
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(repo)],
        check=True,
    )
    wheel = next(wheels.glob("lab_gpu_queue-*.whl"))
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)]
    subprocess.run(pip, check=True)
    return venv / "bin"


def wall(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    began = time.perf_counter()
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    return time.perf_counter() - began, result


def serve(bin_dir: Path, home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(home.parent / "serve.log", "ab")  # noqa: SIM115 - lives with the process
    process = subprocess.Popen(
        [str(bin_dir / "gpuq"), "serve", "--fake-gpus", "4"], env=env, stdout=log, stderr=log
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (
            wall([str(bin_dir / "gpuq"), "nodes"], {**env, "GPUQ_CLI_HELPER": "off"})[1].returncode
            == 0
        ):
            return process
        time.sleep(0.2)
    raise SystemExit("gpuq serve did not answer within 60 s; see serve.log")


def submit(gpuq: list[str], env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [*gpuq, "submit", "--parsable", *args], env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"gpuq submit failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--cold", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--loop", type=int, default=200, help="submissions in the shell loop")
    parser.add_argument(
        "--repo", type=Path, default=REPO, help="the checkout to time (default: this one)"
    )
    parser.add_argument(
        "--pause", type=float, default=0.2, help="seconds between commands (not timed)"
    )
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuq-cli-bench-"))
    runtime = work / "run"
    runtime.mkdir(mode=0o700)
    home = work / "home"
    home.mkdir(mode=0o700)
    # root's jobs are refused unless allowed (the bench may run as root, as CI does)
    allow = "allow_root_jobs = true\n"
    (home / "config.toml").write_text(f"[coordinator]\n{allow}[agent]\n{allow}")
    process = None
    try:
        print(f"building the wheel and a fresh venv in {work} ...", flush=True)
        bin_dir = build_venv(work, options.repo.resolve())
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUQ_", "PYTHON", "VIRTUAL_ENV"))
        }
        env.update(
            GPUQ_HOME=str(home),
            XDG_RUNTIME_DIR=str(runtime),
            PATH=f"{bin_dir}:{env.get('PATH', '')}",
        )
        process = serve(bin_dir, home, env)
        gpuq = [str(bin_dir / "gpuq")]
        python = str(bin_dir / "python3")
        done = submit(gpuq, env, "--wait", "--wrap", "echo hello")
        held = [submit(gpuq, env, "--hold", "--wrap", "true") for _ in range(options.runs + 2)]
        wall([*gpuq, "queue"], env)  # a helper starts
        deadline = time.monotonic() + 30
        while not list((runtime / "gpuq").glob("cli-*.sock")) and time.monotonic() < deadline:
            time.sleep(0.05)
        commands = {
            "python3 -c pass": lambda i: [str(bin_dir / "python3"), "-c", "pass"],
            "gpuq status": lambda i: [*gpuq, "status"],
            "gpuq queue": lambda i: [*gpuq, "queue"],
            "gpuq submit --wrap true --hold": lambda i: [
                *gpuq,
                "submit",
                "--wrap",
                "true",
                "--hold",
            ],
            "gpuq show ID": lambda i: [*gpuq, "show", done],
            "gpuq cancel ID": lambda i: [*gpuq, "cancel", held[i]],
            "gpuq logs ID": lambda i: [*gpuq, "logs", done],
            # what scripts/gpuq-py costs before main(): the interpreter and the stub's imports
            "(the gpuq script's imports only)": lambda i: [python, "-c", STUB_IMPORTS],
        }
        if (bin_dir / "gpuq-py").exists():  # `gpuq` is the C stub: the Python one beside it
            commands["gpuq status, the Python stub (gpuq-py)"] = lambda i: [
                str(bin_dir / "gpuq-py"),
                "status",
            ]
        times: dict[str, list[float]] = {name: [] for name in commands}
        for i in range(options.runs):
            for name, argv in commands.items():
                time.sleep(options.pause)  # a person types: the helper's spare is ready
                seconds, result = wall(argv(i), env)
                if result.returncode != 0:
                    print(f"  {name}: exit {result.returncode}: {result.stderr.strip()}")
                times[name].append(seconds)
        typed = "gpuq submit --hold --wrap true >/dev/null"
        shell = f"for i in $(seq {options.loop}); do {typed} || exit 1; done"
        began = time.perf_counter()
        looped = subprocess.run(["bash", "-c", shell], env=env, capture_output=True, text=True)
        took = time.perf_counter() - began
        if looped.returncode != 0:
            print(f"  the shell loop: exit {looped.returncode}: {looped.stderr.strip()}")
        times["gpuq submit in a shell loop, per call"] = [took / options.loop]
        loop_load = os.getloadavg()[0]
        slow, cold = [], []
        for _ in range(options.cold):
            slow.append(wall([*gpuq, "queue"], {**env, "GPUQ_CLI_HELPER": "off"})[0])
            stop_helpers(runtime / "gpuq")
            cold.append(wall([*gpuq, "queue"], env)[0])
        times["gpuq queue, cold (no helper yet)"] = cold
        times["gpuq queue, GPUQ_CLI_HELPER=off"] = slow
        base = statistics.median(times["python3 -c pass"])
        print(
            f"\nmedians of {options.runs} runs (cold, off: {options.cold}), {os.cpu_count()} CPUs,"
            f" load average {os.getloadavg()[0]:.2f}"
        )
        for name, values in times.items():
            median = statistics.median(values)
            print(f"  {name:40} {median * 1000:7.1f} ms   {median / base:5.2f}x")
        rate = options.loop / took
        print(f"  submissions from a shell loop: {rate:.1f}/s (load average {loop_load:.2f})")
    finally:
        if process is not None:
            process.terminate()
            process.wait(10)
        if (runtime / "gpuq").exists():
            stop_helpers(runtime / "gpuq")
        if not options.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
