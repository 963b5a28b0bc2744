"""sbatch, scancel, scontrol, srun and salloc on gpuq (gpuq.slurm). Each does what the gpuq
verb of the same meaning does, through the same code: sbatch's command line is read exactly
as `#SBATCH` lines are (gpuq.directives) and submitted by gpuq.submission as `gpuq submit`
does; srun and salloc outside a job are `gpuq run` and `gpuq alloc`, and inside one srun is
the job-step launcher (gpuq.steps.srun_main)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from gpuq.errors import InvalidInput
from gpuq.slurm.arguments import Refused, context, given, last, options, split_list, values
from gpuq.slurm.formats import LONG_STATE, exit_code_text, parse_states, slurm_duration, slurm_time

# sbatch's options that change what sbatch itself does (check instead of submitting, print
# help): refused, since taking them as unused options would submit the job
NOT_RUN = frozenset({"test-only", "usage", "help", "version"})
# sbatch's flags that are sbatch's own, not a submit option
SBATCH_SHORT = "WQ"
SBATCH_LONG = ("parsable", "wrap=", "wait", "quiet", "requeue")


def _flag_specs(skip: frozenset[str] = frozenset()) -> tuple[str, list[str]]:
    """getopt's short and long specs of every option sbatch has (gpuq.sbatch_table), but those
    whose gpuq meaning is in `skip`: the command line then goes through the `#SBATCH` reader,
    which takes what gpuq uses, warns of what it does not, and refuses what sbatch would.
    getopt has no optional values: those take none here (`--nice` needs its value)."""
    from gpuq.sbatch_table import LONG, SHORT, USED

    def skipped(name: str) -> bool:
        return name in USED and USED[name][0] in skip

    long = [
        n + ("=" if takes_value(n) else "") for n in LONG if not skipped(n) and n not in NOT_RUN
    ]
    short = "".join(
        letter + (":" if takes_value(name) else "")
        for letter, name in SHORT.items()
        if not skipped(name) and name not in NOT_RUN
    )
    return short, long


def takes_value(name: str) -> bool:
    """Whether sbatch's long option `name` takes a value on these commands' command lines
    (getopt has no optional values: those take none, but `--nice` needs its value)."""
    from gpuq.sbatch_table import LONG, NONE, OPTIONAL

    return LONG[name] != NONE and not (LONG[name] == OPTIONAL and name != "nice")


def own_flags(short: str, long: Sequence[str]) -> frozenset[str]:
    """The flags of getopt specs (`"WQ"`, `["parsable", "wrap="]`) as written: -W, --wrap."""
    return frozenset(
        [f"-{c}" for c in short if c != ":"] + [f"--{name.rstrip('=')}" for name in long]
    )


SBATCH_OWN = own_flags(SBATCH_SHORT, SBATCH_LONG)


def submit_options(
    command: str, pairs: Sequence[tuple[str, str]], own: frozenset[str] = SBATCH_OWN
) -> tuple[dict[str, Any], dict[str, str]]:
    """The submit flags among `pairs`, as gpuq options by name, and how each was written (for
    errors: `-J`, not `--name`): read by the code that reads `#SBATCH` lines, so `sbatch
    --gres=gpu:2` means what `#SBATCH --gres=gpu:2` means."""
    from gpuq.directives import SBATCH, Header
    from gpuq.sbatch_table import SHORT

    tokens = []
    for flag, value in pairs:
        if flag in own:  # the command's own flag (--parsable, srun's --pty), not the job's
            continue
        long = flag[2:] if flag.startswith("--") else SHORT[flag[1]]
        if not takes_value(long):
            tokens.append(flag)
        elif flag.startswith("--"):
            tokens.append(f"{flag}={value}")
        else:  # apart, as getopt gave it: `-J ''` and `-J =x` keep their values whole
            tokens += [flag, value]
    if not tokens:
        return {}, {}
    notes: list[str] = []
    try:
        header = Header(f"#!/bin/sh\n{SBATCH} {shlex.join(tokens)}\n", notes)
    except InvalidInput as exc:  # said of the command line, not of a script's line 2
        raise InvalidInput(_unlined(exc.field), exc.value, exc.problem) from None
    for note in notes:  # a value gpuq reads only in part (--gres=gpu:1,mps:10)
        sys.stderr.write(f"{command}: warning: {_printable(_unlined(note))}\n")
    return dict(header.sbatch), dict(header.sbatch_written)


def _unlined(text: str) -> str:
    """A note or field of the one `#SBATCH` line the command line was read as, without it."""
    from gpuq.directives import SBATCH

    for where in (f" ({SBATCH} line 2)", f"{SBATCH} (line 2)", " (line 2)", f"{SBATCH} "):
        text = text.replace(where, "")
    return text.strip() or "option"


def sbatch(argv: Sequence[str]) -> int:
    """`sbatch [options] script [args]` or `sbatch [options] --wrap CMD`: prints
    `Submitted batch job N` (`--parsable`: `N`); `--wait` exits as the job did."""
    from gpuq.cli.job_verbs import _defaults, build_spec_warning, ended_exit

    short, long = _flag_specs()
    pairs, rest = options(
        "sbatch",
        argv,
        short + SBATCH_SHORT,
        list(dict.fromkeys([*long, *SBATCH_LONG])),
        interspersed=False,
    )
    wrap = last(pairs, "--wrap")
    script, args = (rest[0], rest[1:]) if rest else (None, [])
    if wrap is not None and script is not None:
        raise Refused("error: give a script or --wrap, not both")
    if wrap is None and script is None:
        raise Refused(
            "error: a script on stdin is not supported by gpuq's sbatch: give a file or --wrap"
        )
    obj = context()
    submit, spelled = submit_options("sbatch", pairs)
    spec = build_spec_warning(
        "sbatch",
        script=script,
        args=tuple(args),
        wrap=wrap,
        defaults=_defaults(obj),
        spelled=spelled,
        **submit,
    )
    client = obj.client()
    job_id = client.submit_spec(spec)[0]
    if given(pairs, "--parsable"):
        print(job_id)
    elif not given(pairs, "--quiet", "-Q"):
        print(f"Submitted batch job {job_id}")
    sys.stdout.flush()
    if not given(pairs, "--wait", "-W"):
        return 0
    return int(ended_exit(client.wait(job_id), job_id))


def scancel(argv: Sequence[str]) -> int:
    """`scancel [IDS] [-u USER] [-n NAME] [-t STATE]`: every filter given must match, ids
    too (`scancel -u bob 12` cancels 12 only if it is bob's). Silent when it worked."""
    pairs, rest = options(
        "scancel",
        argv,
        "u:n:t:qv",
        ["user=", "name=", "jobname=", "state=", "quiet", "verbose", "me"],
    )
    ids = split_list(rest)
    users = split_list(values(pairs, "-u", "--user"))
    if given(pairs, "--me"):
        users.append(_me())
    names = split_list(values(pairs, "-n", "--name", "--jobname"))
    states = sorted(parse_states(values(pairs, "-t", "--state")))
    if len(users) > 1 or len(names) > 1:
        raise Refused("error: gpuq's scancel takes one user and one name")
    if not (ids or users or names or states):
        raise Refused("error: No job identification provided")
    user, name = (users or [""])[0], (names or [""])[0]
    client = context().client()
    if given(pairs, "-t", "--state") and not states:
        return 0  # states gpuq never has (COMPLETING...): no job is in them
    if ids and (user or name or states):
        ids = _matching(client, ids, user, name, states)
        if not ids:
            return 0
        user, name, states = "", "", []
    outcomes = client.cancel(*ids, user=user, states=states, name=name)
    failed = [o for o in outcomes if not o.done]
    for outcome in failed:
        sys.stderr.write(
            f"scancel: error: Kill job error on job id {outcome.job_id}: "
            f"{_printable(outcome.message)}\n"
        )
    return 1 if failed else 0


def _matching(client: Any, ids: list[str], user: str, name: str, states: list[str]) -> list[str]:
    """Those of `ids` that name a live job matching the filters."""
    from gpuq.slurm.listing_commands import jobs_by_ids, names_job

    jobs = jobs_by_ids(client, ids, users=[user] if user else [], names=[name] if name else [])
    jobs = [j for j in jobs if j.state in (states or ("pending", "held", "running"))]
    return [i for i in ids if any(names_job(j, [i]) for j in jobs)]


def _me() -> str:
    import getpass

    return getpass.getuser()


# scontrol update's keys (any case) -> gpuq update's flags (gpuq.cli.edit.update_fields)
UPDATE_KEYS = {
    "timelimit": "time",
    "jobname": "name",
    "name": "name",
    "nice": "nice",
    "qos": "qos",
    "dependency": "after",
    "starttime": "begin",
    "begintime": "begin",
    "reqnodelist": "nodelist",
    "nodelist": "nodelist",
    "excnodelist": "exclude",
    "features": "constraint",
    "numcpus": "cpus",
    "mincpusnode": "cpus",
    "minmemorynode": "mem",
}
UPDATE_FLAGS = (
    *("time", "qos", "after", "nice", "hold", "name", "begin", "gpus", "cpus", "mem"),
    *("gpu_mem", "nodelist", "exclude", "constraint"),
)
QUIET_FLAGS = frozenset({"-o", "--oneliner", "-d", "--details", "-Q", "--quiet", "-a", "--all"})


def scontrol(argv: Sequence[str]) -> int:
    """`scontrol show job [ID]`, `show hostnames [LIST]`, `update JobId=ID KEY=VALUE...`,
    `hold|release|requeue|requeuehold ID[,ID...]`."""
    words = [w for w in argv if w not in QUIET_FLAGS]
    unknown = [w for w in words if w.startswith("-")]
    if unknown:
        raise Refused(f"{unknown[0]} is not supported by gpuq's scontrol")
    if not words:
        raise Refused("error: give a command: show, update, hold, release, requeue")
    verb, rest = words[0].lower(), words[1:]
    if verb == "show" and rest and rest[0].lower() in ("hostnames", "hostname"):
        from gpuq.steps import scontrol_main

        return scontrol_main.main(["show", "hostnames", *rest[1:]])
    if verb == "show" and rest and rest[0].lower() in ("job", "jobs"):
        oneliner = any(w in ("-o", "--oneliner") for w in argv)
        return _show_jobs(split_list(rest[1:]), oneliner)
    if verb == "update":
        return _update(rest)
    if verb in ("hold", "uhold", "release", "requeue", "requeuehold"):
        return _act(verb, split_list(rest))
    shown = " ".join([verb, *rest[:1]])
    raise Refused(f"{shown} is not supported by gpuq's scontrol")


def _act(verb: str, ids: list[str]) -> int:
    if not ids:
        raise Refused(f"error: {verb} needs a job id")
    client = context().client()
    if verb in ("requeue", "requeuehold"):
        outcomes = client.requeue(*ids, hold=verb == "requeuehold")
    else:
        outcomes = getattr(client, "release" if verb == "release" else "hold")(*ids)
    return _report(outcomes)


def _report(outcomes: Any) -> int:
    failed = [o for o in outcomes if not o.done]
    for outcome in failed:
        sys.stderr.write(f"scontrol: error: job {outcome.job_id}: {_printable(outcome.message)}\n")
    return 1 if failed else 0


def _update(words: list[str]) -> int:
    from gpuq.cli.edit import update_fields

    ids: list[str] = []
    flags: dict[str, Any] = dict.fromkeys(UPDATE_FLAGS)
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            raise Refused(f"error: update takes KEY=VALUE, not {word!r}")
        if key.lower() == "jobid":
            ids += split_list([value])
        elif key.lower() in UPDATE_KEYS:
            flags[UPDATE_KEYS[key.lower()]] = value
        else:
            raise Refused(f"update {key} is not supported by gpuq's scontrol")
    if not ids:
        raise Refused("error: update needs JobId=ID")
    changes = update_fields(**flags)
    return _report(context().client().update(*ids, **changes))


def _show_jobs(ids: list[str], oneliner: bool) -> int:
    client = context().client()
    if ids:
        jobs = [client.detail_from(client.detail_reply(i))[0] for i in ids]
    else:
        jobs = client.list_raw(expand_arrays=True)
    if not jobs:
        print("No jobs in the system")
    for job in jobs:
        lines = [" ".join(f"{k}={v}" for k, v in line) for line in job_lines(job)]
        print(" ".join(lines) if oneliner else "\n   ".join(lines) + "\n")
    return 0


def job_lines(job: Any) -> list[list[tuple[str, str]]]:
    """`scontrol show job`'s key=value lines, the ones scripts read."""
    import time

    from gpuq.cli.render import node_count, node_text
    from gpuq.slurm.listing_commands import partition, reason_word, tres

    res = job.spec.resources
    started = job.start_time if job.HasField("start_time") else None
    ended = job.end_time if job.HasField("end_time") else None
    run_time = ((ended or time.time()) - started) if started is not None else 0
    result = job.result if job.HasField("result") else None
    code = exit_code_text(
        result.exit_code if result and result.HasField("exit_code") else None,
        result.signal if result and result.HasField("signal") else None,
    )
    limit = slurm_duration(res.time_limit) if res.HasField("time_limit") else "UNLIMITED"
    array = (
        [("ArrayJobId", str(job.array_job_id)), ("ArrayTaskId", str(job.array_task_id))]
        if job.HasField("array_job_id")
        else []
    )
    nodes = node_text(job) or "(null)"
    return [
        [("JobId", str(job.id)), ("JobName", job.spec.name)],
        [("UserId", _user_id(job.user)), *array],
        [("Priority", str(job.priority)), ("Nice", str(job.spec.nice)), ("QOS", job.qos)],
        [("JobState", LONG_STATE.get(job.state, job.state.upper())), ("Reason", reason_word(job))],
        [("Requeue", "0" if job.spec.no_requeue else "1"), ("Restarts", str(job.requeue_count))],
        [("ExitCode", code)],
        [("RunTime", slurm_duration(run_time)), ("TimeLimit", limit)],
        [("SubmitTime", slurm_time(job.submit_time or None))],
        [("StartTime", slurm_time(started)), ("EndTime", slurm_time(ended))],
        [("Partition", partition(job))],
        [("NodeList", nodes), ("BatchHost", job.node or "(null)")],
        [("NumNodes", str(node_count(res))), ("NumCPUs", str(res.cpus * node_count(res)))],
        [("TRES", tres(job))],
        [("WorkDir", job.spec.workdir)],
        [("StdErr", job.stderr_path or job.stdout_path), ("StdOut", job.stdout_path)],
    ]


def _user_id(user: str) -> str:
    """`alice(1000)`, as scontrol prints a user (the name alone where this machine has no
    such account)."""
    import pwd

    try:
        return f"{user}({pwd.getpwnam(user).pw_uid})"
    except KeyError:
        return user


def srun(argv: Sequence[str]) -> int:
    """Inside a job, the job-step launcher (gpuq.steps.srun_main, as the in-job shim);
    elsewhere `gpuq run`: CMD as a job with this terminal attached (srun --pty)."""
    from gpuq.steps import inside_job

    if inside_job(os.environ):
        from gpuq.steps.srun_main import main

        return main(list(argv))
    from gpuq.cli.interactive import RUN_SCRIPT, _job_name, attach_session, interactive_spec

    pairs, rest, submit = _interactive("srun", argv, "u", ["pty", "unbuffered"])
    if not rest:
        raise Refused("error: give a command to run")
    name = submit.pop("name", None) or _job_name(rest[0])
    spec = interactive_spec(RUN_SCRIPT, rest, "--run", name, submit)
    return int(attach_session(context().client(), spec, given(pairs, "-Q", "--quiet")))


def salloc(argv: Sequence[str]) -> int:
    """`gpuq alloc`: a shell on a node with the allocation."""
    from gpuq.cli.interactive import ALLOC_SCRIPT, attach_session, interactive_spec

    pairs, rest, submit = _interactive("salloc", argv, "", [])
    if rest:
        raise Refused(
            "a command is not supported by gpuq's salloc: it gives a shell on the node "
            "(use srun CMD for a command)"
        )
    name = submit.pop("name", None) or "alloc"
    spec = interactive_spec(ALLOC_SCRIPT, (), "--alloc", name, submit)
    return int(attach_session(context().client(), spec, given(pairs, "-Q", "--quiet")))


def _interactive(
    command: str, argv: Sequence[str], short: str, long: list[str]
) -> tuple[list[tuple[str, str]], list[str], dict[str, Any]]:
    """srun's and salloc's options: the submit flags an interactive job takes."""
    from gpuq.cli.interactive import NOT_INTERACTIVE

    flags_short, flags_long = _flag_specs(NOT_INTERACTIVE)
    pairs, rest = options(
        command, argv, flags_short + short + "Q", [*flags_long, *long, "quiet"], interspersed=False
    )
    submit, _spelled = submit_options(command, pairs, own_flags(short + "Q", [*long, "quiet"]))
    return pairs, rest, submit


def _printable(text: object) -> str:
    from gpuq.cli.render import printable

    return printable(text)
