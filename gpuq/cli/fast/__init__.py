"""The CLI's fast path: a `gpuq` call served by a fork of a warm per-user process (the CLI
helper) instead of a Python start-up plus the imports of click, grpc, the protobuf descriptors
and the verbs. Fenced here: no verb knows of it, and it knows no verb (gpuq.cli.verbs is the
one table of verbs; gpuq.cli.group.run is the one implementation of a call, here and in-process).

    stub.py            the `gpuq` process (scripts/gpuq calls main()): hands the call to a
                       helper and forwards signals, or runs it in-process and starts a helper
    protocol.py        where a helper listens, and every message of the fast path
    helper_control.py  starting a helper (after a call that found none) and stopping helpers
    helper_process.py  the helper: loads the CLI, forks a spare ahead of each call, tracks the
                       calls, leaves when idle or when its code changed
    spare.py           the child forked ahead of the next call: warms gRPC and a client,
                       accepts the call and checks it (uid, code, groups, gRPC settings)
    become_caller.py   the spare turning into the caller (fds, folder, umask, environment,
                       locale, streams, signals) and running gpuq.cli.group.run
    warm_client.py     the client the spare connected ahead of the call

The latency budget. bench/cli_bench.py (a wheel in a fresh venv, `gpuq serve` with 4 fake
GPUs, medians of 21 runs; 2 CPUs shared with other work, so read the ratios):

    python3 -c pass (the floor: any Python command)          1.00x   (27-52 ms here)
    the stub's imports before main()                         0.98-1.02x
    gpuq show / cancel / logs / queue, through a helper      1.2-1.8x
    gpuq status / submit, through a helper                   1.6-1.95x
    gpuq submit in a loop, back to back                      2.2-2.4x
    gpuq queue, cold (no helper yet: in-process, starts one)  10x
    gpuq queue, GPUQ_CLI_HELPER=off (in-process)             13-14x

So the fast path saves about 300 ms of a 350 ms call (12x the floor) on this machine; the
target (issue 13) is every command within 2x the floor. What keeps it there:
- the stub loads nothing but the interpreter's own modules and six small ones of gpuq's (the
  packages gpuq, gpuq.cli and this one, the stub, the protocol and gpuq.cli.verbs: checked by
  tests/unit/test_cli_fast_path.py), and scripts/gpuq is a plain script, not pip's launcher
  (which imports `re`: 5-7 ms);
- the fork, gRPC's start-up, the connection to the coordinator, the credential handshake,
  click's parser and the copy-on-write faults of the loaded modules all happen in a spare
  before the call comes: a call pays its request (one sendmsg), its command, and its exit;
- the child says its exit code as soon as it closed the caller's fds, before it is torn down.

A new verb need not know any of this: it is a click command in a module of gpuq.cli and one
line in gpuq.cli.verbs.VERBS, which says what it must keep (read the caller's environment when
it runs, start nothing at import) and the two optional lines: OWN_PROCESS for a verb that must
not be a fork of the helper (a daemon), CALL_TIME_IMPORTS for a heavy import inside its
functions that the helper should load ahead.
"""
