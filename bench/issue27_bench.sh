#!/bin/bash
# Issue 27's table in one command: every row's benchmark, this checkout against another one
# (the "before": a checkout with its own .venv, e.g. a worktree of the round's first commit),
# one after another on a quiet machine. Prints figures, asserts nothing.
#
#     bash bench/issue27_bench.sh /path/to/before-checkout [LOG]
#
# Rows and their benchmarks (each also runs alone, see its docstring):
#   submit -> first command (client, CLI), drain of 500, daemon CPU per job: dispatch_bench.py
#   listing 500 queued jobs, coordinator CPU per call:                          queue_cpu_bench.py
#   idle daemon CPU, nothing queued, 8 GPUs:                                    idle_bench.py
#   gpuq status / submit wall, CLI submissions in a loop:                       cli_bench.py
#   scheduler pass 10k / 100k, ranking and explaining 100k:                     scheduler_bench.py
set -u
before=${1:?usage: bash bench/issue27_bench.sh BEFORE_CHECKOUT [LOG]}
log=${2:-/dev/stdout}
here=$(cd "$(dirname "$0")/.." && pwd)
py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
{
    echo "== issue 27 benchmarks: $(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "   this: $(git -C "$here" rev-parse --short HEAD)  before: $(git -C "$before" rev-parse --short HEAD 2>/dev/null || echo "$before")"
    echo "== dispatch and drain"; "$py" "$here/bench/dispatch_bench.py" --against "$before"
    echo "== listing"; "$py" "$here/bench/queue_cpu_bench.py" --against "$before"
    echo "== idle"; "$py" "$here/bench/idle_bench.py" --baseline "$before"
    echo "== scheduler (this)"; "$py" "$here/bench/scheduler_bench.py" --rows
    echo "== scheduler (before: its own bench)"; (cd "$before" && "$before/.venv/bin/python" bench/scheduler_bench.py)
    echo "== CLI (this)"; "$py" "$here/bench/cli_bench.py"
    echo "== CLI (before: this bench, building the other checkout's wheel)"
    "$py" "$here/bench/cli_bench.py" --repo "$before"
    echo "== done: load $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$log"
