"""The `gpuq` verbs: the module that defines each, loaded only when that verb runs (the CLI
must start fast; gpuq.cli.group's LazyGroup reads this table).

Adding a verb: define it as any click command or group, a module-level object named like the
verb, in a module of gpuq.cli; add one line here, `"verb": "gpuq.cli.module"`. That is all:
the verb then runs in-process and through the CLI helper alike (gpuq.cli.fast: its helper
loads every module named here before the first call, and runs each call through
gpuq.cli.group.run, as the in-process path does). Nothing in gpuq.cli.fast names a verb.

Only a verb whose process must not be a fork of the long-lived helper is also named in
OWN_PROCESS: a daemon (it owns sockets, threads, logging and children for hours), or a verb
that needs the controlling terminal itself (job control, a local interactive shell). Such a
verb always runs in the `gpuq` process itself, and its module is not loaded by the helper.

This module is imported by the `gpuq` stub before main(): plain data, no imports.
"""

VERBS = {
    "submit": "gpuq.cli.jobs",
    "status": "gpuq.cli.listings",
    "queue": "gpuq.cli.listings",
    "show": "gpuq.cli.jobs",
    "cancel": "gpuq.cli.jobs",
    "hold": "gpuq.cli.jobs",
    "release": "gpuq.cli.jobs",
    "logs": "gpuq.cli.jobs",
    "update": "gpuq.cli.edit",
    "requeue": "gpuq.cli.edit",
    "run": "gpuq.cli.interactive",
    "alloc": "gpuq.cli.interactive",
    "history": "gpuq.cli.listings",
    "report": "gpuq.cli.listings",
    "web": "gpuq.cli.web",
    "nodes": "gpuq.cli.listings",
    "completion": "gpuq.cli.completion",
    "cron": "gpuq.cli.cron_verbs",
    "drain": "gpuq.cli.admin",
    "resume": "gpuq.cli.admin",
    "admin": "gpuq.cli.security",
    "serve": "gpuq.cli.daemon_verbs",
    "coordinator": "gpuq.cli.daemon_verbs",
    "agent": "gpuq.cli.daemon_verbs",
}
OWN_PROCESS = frozenset({"serve", "coordinator", "agent"})
