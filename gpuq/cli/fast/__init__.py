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

The latency budget, measured with bench/cli_bench.py (a wheel in a fresh venv, `gpuq serve`
with 4 fake GPUs, medians of 21 runs, on 2 CPUs shared with other work: read the ratios):

                                                          quiet machine     loaded (load 8-11)
    python3 -c pass (the floor: any Python command)      16-19 ms  1.00x   27-52 ms  1.00x
    the stub's imports before main()                     19-20 ms  1.1x    0.7-1.0x
    status, queue, submit, show, cancel, logs (helper)   30-38 ms  1.9-2.1x   1.2-2.1x
    gpuq submit in a loop, back to back                  50-62 ms  3.2x    2.2-3.9x
    gpuq queue, cold (no helper yet: runs in-process)   150-240 ms 10-13x  10-20x
    gpuq queue, GPUQ_CLI_HELPER=off (in-process)         190-260 ms 12-14x  12-26x

So the fast path saves about 150-230 ms of each call here (the difference of the last row
and the helper's), about 85 % of it; the target (issue 13) is every command within 2x the
floor. The stub's imports cost 1-2 ms over the floor: in a paired A/B of 200 starts each,
16.5 ms against 14.5 ms for `python3 -c pass`, of which +0.7 ms is the fenced layout's (three
more small modules: this package, the protocol, the verb table) over the single stub module
it replaced. What keeps it there:
- the stub loads nothing but the interpreter's own modules and six small ones of gpuq's (the
  packages gpuq, gpuq.cli and this one, the stub, the protocol and gpuq.cli.verbs: checked by
  tests/unit/test_cli_fast_path.py), and scripts/gpuq is a plain script, not pip's launcher
  (which imports `re`: 5-7 ms);
- the fork, gRPC's start-up, the connection to the coordinator, the credential handshake,
  click's parser and the copy-on-write faults of the loaded modules all happen in a spare
  before the call comes: a call pays its request (one sendmsg), its command, and its exit
  (the copy-on-write faults only when no call came within 50 ms: owning the pages costs the
  spare 10-12 ms of CPU, which calls back to back, a shell loop, cannot spare on 2 CPUs);
- the child says its exit code as soon as it closed the caller's fds, before it is torn down.

A new verb need not know any of this: it is a click command in a module of gpuq.cli and one
line in gpuq.cli.verbs.VERBS, which says what it must keep (read the caller's environment when
it runs, start nothing at import) and the two optional lines: OWN_PROCESS for a verb that must
not be a fork of the helper (a daemon), CALL_TIME_IMPORTS for a heavy import inside its
functions that the helper should load ahead.
"""
