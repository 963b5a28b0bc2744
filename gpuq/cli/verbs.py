"""The `gpuq` verbs: the module that defines each, loaded only when that verb runs (the CLI
must start fast; gpuq.cli.group's LazyGroup reads this table).

Adding a verb: define it as any click command or group, a module-level object named like the
verb (a `-` in it as `_`: slurm_shims), in a module of gpuq.cli; add one line here, `"verb":
"gpuq.cli.module"`. That is all: the verb then runs in-process and through the CLI helper alike
(gpuq.cli.fast: its helper loads every module named here before the first call, and runs each
call through gpuq.cli.group.run, as the in-process path does). Nothing in gpuq.cli.fast names a
verb. What a verb must keep, as any well-behaved click command does: its module is imported
once, in the helper, under the first caller's environment, and the helper forks every call from
it; so read the environment, the working folder and the umask when the verb runs (never at
import), and start no thread or gRPC channel at import.

A verb imports inside its functions what only it needs (so that an in-process call loads
no more than its own verb needs). The helper loads those ahead of calls when they are named
in CALL_TIME_IMPORTS; one that is not is loaded by each call through the helper (slower,
never wrong: add it there when bench/cli_bench.py or `python -X importtime` says it costs).

Only a verb whose process must not be a fork of the long-lived helper is also named in
OWN_PROCESS: a daemon (it owns sockets, threads, logging and children for hours), or a verb
that needs the controlling terminal itself (job control, a local interactive shell). Such a
verb always runs in the `gpuq` process itself, and its module is not loaded by the helper.
A verb named in PROCESS_REUSABLE (a few requests and their output, nothing left running) may
run in a helper's child that served a call before it, and will serve another after it.

This module is imported by the `gpuq` stub before main(): plain data, no imports.
"""

VERBS = {
    "submit": "gpuq.cli.job_verbs",
    "status": "gpuq.cli.listings",
    "queue": "gpuq.cli.listings",
    "show": "gpuq.cli.job_verbs",
    "cancel": "gpuq.cli.job_verbs",
    "hold": "gpuq.cli.job_verbs",
    "release": "gpuq.cli.job_verbs",
    "logs": "gpuq.cli.job_verbs",
    "diagnose": "gpuq.cli.diagnose_verb",
    "update": "gpuq.cli.edit",
    "requeue": "gpuq.cli.edit",
    "run": "gpuq.cli.interactive",
    "alloc": "gpuq.cli.interactive",
    "history": "gpuq.cli.listings",
    "report": "gpuq.cli.usage_verbs",
    "eff": "gpuq.cli.usage_verbs",
    "web": "gpuq.cli.web_verbs",
    "nodes": "gpuq.cli.listings",
    "completion": "gpuq.cli.completion",
    "cron": "gpuq.cli.cron_verbs",
    "drain": "gpuq.cli.drain_verbs",
    "resume": "gpuq.cli.drain_verbs",
    "admin": "gpuq.cli.security",
    "slurm-shims": "gpuq.cli.slurm_verb",
    "serve": "gpuq.cli.daemon_verbs",
    "coordinator": "gpuq.cli.daemon_verbs",
    "agent": "gpuq.cli.daemon_verbs",
}
OWN_PROCESS = frozenset({"serve", "coordinator", "agent"})
# verbs whose call leaves nothing behind in its process (requests to the coordinator and
# output: no thread, signal handler, terminal mode or child of its own): the helper's child
# that ran one may stay and serve the next call of the same user instead of a fresh fork
# (gpuq.cli.fast.serve_again). A verb not named here always gets a child of its own.
PROCESS_REUSABLE = frozenset(
    {
        "submit",
        "status",
        "queue",
        "show",
        "cancel",
        "hold",
        "release",
        "history",
        "nodes",
        "update",
        "requeue",
    }
)
# what the verbs import inside their functions, loaded by the CLI helper before the first call
CALL_TIME_IMPORTS = (
    "gpuq.submission",
    "gpuq.directives",
    "gpuq.convert",
    "gpuq.domain.dependencies",
    "gpuq.domain.gpu_types",
    "gpuq.domain.node_constraints",
    "gpuq.domain.interactive_jobs",
    "gpuq.domain.states",
    "gpuq.cli.render",
    "google.protobuf.json_format",
    "getpass",
    "pwd",
)
