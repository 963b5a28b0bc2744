"""The CLI's fast path: a `gpuq` call served by a fork of a warm per-user process (the CLI
helper) instead of a Python start-up plus the imports of click, grpc, the protobuf descriptors
and the verbs. Fenced here: no verb knows of it, and it knows no verb (gpuq.cli.verbs is the
one table of verbs; gpuq.cli.group.run is the one implementation of a call, here and in-process).

    stub.c             the installed `gpuq` command: the stub's fast path in C, no Python
                       started; runs stub.py (installed as gpuq-py) for everything else
    stub.py            the Python stub (scripts/gpuq-py calls main()): hands the call to a
                       helper and forwards signals, or runs it in-process and starts a helper;
                       links the helper's socket for stub.c
    protocol.py        where a helper listens, and every message of the fast path
    helper_control.py  starting a helper (after a call that found none) and stopping helpers
    helper_process.py  the helper: loads the CLI, keeps two spares forked ahead, tracks the
                       calls, leaves when idle or when its code changed
    code_check.py      whether the loaded code is still what is on disk (a fingerprint, and
                       an inotify watch that spares taking it on every call)
    spare.py           a child forked ahead of a call: warms gRPC and a client, accepts the
                       call and checks it (uid, code, groups, gRPC settings)
    become_caller.py   the spare turning into the caller (fds, folder, umask, environment,
                       locale, streams, signals) and running gpuq.cli.group.run
    serve_again.py     after a call that leaves nothing running, the child putting all that
                       back and serving the next call instead of leaving
    warm_client.py     the client the spare connected ahead of the call

The latency budget, measured with bench/cli_bench.py (a wheel in a fresh venv, so `gpuq` is
the C stub; `gpuq serve` with 4 fake GPUs, medians of 21 runs, on 2 CPUs shared with other
work, load average 0.5-1.5: read the ratios). Before: the Python stub was `gpuq` (issue 27).

                                                       Python stub (before)   C stub (now)
    python3 -c pass (the floor: any Python command)     11.5 ms  1.00x       11.7 ms  1.00x
    the Python stub's imports before main()             12.4 ms  1.07x       12.5 ms  1.07x
    status                                              26.2 ms  2.27x       16.3 ms  1.40x
    queue                                               20.1 ms  1.74x       11.4 ms  0.97x
    submit --wrap true --hold                           23.3 ms  2.02x       14.3 ms  1.22x
    show, cancel, logs                                  21-26 ms 1.8-2.3x    12-16 ms 1.0-1.4x
    status through the Python stub (gpuq-py)               -                 25.7 ms  2.20x
    gpuq submit in a shell loop, back to back           22.8 ms  44/s        18.5 ms  54/s
      (two spares, the watch: another day, slower)                           17.0 ms  59/s
    gpuq queue, cold (no helper yet: runs in-process)   131 ms  11x          128 ms  11x
    gpuq queue, GPUQ_CLI_HELPER=off (in-process)        135 ms  12x          128 ms  11x

So a call through the helper costs the C stub's exec and one request (no interpreter: `gpuq
queue` is as fast as `python3 -c pass`) plus the helper's side; the target (issue 13) of every
command within 2x the floor is met.

The shell loop (issue 27: 100/s). With one spare, a call back to back waited for the spare
forked after the previous call to warm up (8-9.5 ms: gRPC's start 1.9 ms, the settings and
client 2.5, the connection, click's parser 1.8), then spent 2-3 ms in the code check (300
stats) before running. Two spares and an inotify watch for the check (code_check.py) took it
from 41.7/s to 58.8/s. What was left was CPU: a call back to back cost ~33 ms of CPU on 2
CPUs, the fresh child ~19 ms of it (2,300 copy-on-write page faults ~5 ms, gRPC's threads and
connection, the command ~6 ms), the coordinator ~4 ms, the helper's fork ~2 ms. So a child
whose verb leaves nothing running now serves the next call too (serve_again.py), with its
gRPC, its connected client and Submit stream, and the pages it owns already: no fork, start,
connection or fault per call. bench/cli_bench.py, two interleaved runs against the commit
before (de7095b), same session: 64.6/s and 64.4/s -> 160.2/s and 174.9/s (15.5 -> 5.7-6.2 ms
a call); single calls unchanged (submit 21.4/18.6 -> 19.1/19.6 ms).

What keeps the Python stub's imports at the floor (it still runs the first call, and every
call where the C stub falls back):
- the stub loads nothing but the interpreter's own modules and six small ones of gpuq's (the
  packages gpuq, gpuq.cli and this one, the stub, the protocol and gpuq.cli.verbs: checked by
  tests/unit/test_cli_fast_path.py), and scripts/gpuq-py is a plain script, not pip's launcher
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
