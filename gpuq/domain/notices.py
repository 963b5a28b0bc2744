"""What to tell whom when a job changes state or a node's health changes: pure decisions and
message texts. Delivery (the MTA, HTTP, retries) is gpuq.coordinator.notifications'.

Mail follows SLURM's --mail-type (gpuq.domain.notify.MAIL_TYPES): one mail per event, whatever
number of the job's types it matches (a failure asked for with END,FAIL is one mail). Webhooks
get every state change of every job and task. Everything a user typed (a job name) reaches a
header only through EmailMessage with control characters removed, and is bounded.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from email.message import EmailMessage
from email.policy import default as _default_policy
from urllib.parse import urlsplit

from gpuq.domain.states import JobState

# ends that SLURM's FAIL covers
FAILURES = frozenset(
    {JobState.FAILED, JobState.NODE_FAIL, JobState.TIMEOUT, JobState.OUT_OF_MEMORY}
)
INVALID_DEPEND_REASON = "dependency can never be met"  # gpuq.scheduler.eligibility's words
WARNINGS = (("TIME_LIMIT_90", 0.9), ("TIME_LIMIT_80", 0.8), ("TIME_LIMIT_50", 0.5))
MAX_SUBJECT_NAME = 64  # characters of a job name in a subject
BACKOFF_CAP = 60.0  # seconds between two attempts, at most
# lines up to RFC 5322's 998: a subject stays on one line (names are bounded), as SLURM's
_MAIL_POLICY = _default_policy.clone(max_line_length=998)


@dataclass(frozen=True, slots=True)
class Change:
    """One job's state change, as webhooks receive it (and mails describe it)."""

    job_id: int
    array_job_id: int | None
    array_task_id: int | None
    name: str
    user: str
    from_state: str | None
    state: str
    reason: str
    at: float
    exit_code: int | None = None
    signal: int | None = None
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None

    def body(self) -> bytes:
        """The webhook's JSON body."""
        return json.dumps(asdict(self), ensure_ascii=True, sort_keys=True).encode()


def triggered(
    from_state: JobState | None, to_state: JobState, reason: str, requeued: bool
) -> frozenset[str]:
    """The mail types an event matches. `requeued`: an end (preempted, node_fail) that put
    the job straight back in the queue; that is a REQUEUE, not an END."""
    if from_state is None or from_state is to_state:
        return frozenset()
    if to_state is JobState.RUNNING:
        return frozenset({"BEGIN"})
    if to_state is JobState.PENDING and from_state in (
        JobState.PREEMPTED,
        JobState.NODE_FAIL,
        JobState.RUNNING,
    ):
        # running -> pending: a start its agent never received; it never ran, no mail
        return frozenset() if from_state is JobState.RUNNING else frozenset({"REQUEUE"})
    if to_state.is_live or requeued:
        return frozenset()
    found = {"END"}
    if to_state in FAILURES:
        found.add("FAIL")
    if to_state is JobState.TIMEOUT:
        found.add("TIME_LIMIT")
    if to_state is JobState.CANCELLED and reason.startswith(INVALID_DEPEND_REASON):
        found.add("INVALID_DEPEND")
    return frozenset(found)


def mail_kinds(wanted: Iterable[str], kinds: frozenset[str]) -> frozenset[str]:
    """What of `kinds` the job asked for (none: no mail)."""
    return kinds & frozenset(wanted)


def due_warnings(
    wanted: Iterable[str], elapsed: float, limit: float, sent: Iterable[str]
) -> list[str]:
    """The TIME_LIMIT_NN warnings now due and not sent: only the highest passed, as SLURM
    (a job found at 85 % gets TIME_LIMIT_80 only); the lower ones then count as sent."""
    if limit <= 0:
        return []
    chosen = set(wanted)
    done = set(sent)
    for kind, share in WARNINGS:
        if elapsed >= share * limit:
            return [kind] if kind in chosen and kind not in done else []
    return []


def passed_warnings(elapsed: float, limit: float) -> list[str]:
    """Every warning whose share of the limit has passed (to mark them sent)."""
    return [k for k, share in WARNINGS if limit > 0 and elapsed >= share * limit]


def clock_text(seconds: float | None) -> str:
    """SLURM's run time: HH:MM:SS, or D-HH:MM:SS."""
    if seconds is None:
        return "00:00:00"
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{text}" if days else text


def header_text(text: str, limit: int = MAX_SUBJECT_NAME) -> str:
    """A user's text as a header may carry it: control characters (newlines) as spaces,
    runs of spaces as one, at most `limit` characters (then "...")."""
    flat = " ".join(re.sub(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", " ", text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def subject(
    change: Change,
    kinds: frozenset[str],
    array_counts: Mapping[str, int] | None = None,
) -> str:
    """SLURM's subject: `gpuq Job_id=12 Name=train Ended, Run time 00:01:02, COMPLETED,
    ExitCode 0`. For an array as a whole (`array_counts`: tasks by state) the id is `12_*`."""
    if array_counts is not None:
        ident = f"Job_id={change.array_job_id}_*"
    elif change.array_job_id is not None and change.array_task_id is not None:
        ident = f"Job_id={change.array_job_id}_{change.array_task_id} ({change.job_id})"
    else:
        ident = f"Job_id={change.job_id}"
    head = f"gpuq {ident} Name={header_text(change.name)}"
    if "BEGIN" in kinds:
        queued = None
        if change.start_time is not None and change.submit_time is not None:
            queued = change.start_time - change.submit_time
        return f"{head} Began, Queued time {clock_text(queued)}"
    if "REQUEUE" in kinds:
        return f"{head} Requeued"
    warning = [k for k, _ in WARNINGS if k in kinds]
    if warning:
        share = warning[0].rsplit("_", 1)[1]
        return f"{head} Reached {share}% of time limit"
    run = None
    if change.start_time is not None and change.end_time is not None:
        run = change.end_time - change.start_time
    if array_counts is not None:
        states = sorted(array_counts)
        shown = states[0].upper() if len(states) == 1 else "Mixed"
        verb = "Failed" if "FAIL" in kinds else "Ended"
        tasks = ", ".join(f"{n} {s}" for s, n in sorted(array_counts.items()))
        return f"{head} {verb}, {shown} ({tasks})"
    if "INVALID_DEPEND" in kinds:
        verb = "Invalid dependency"
    elif "TIME_LIMIT" in kinds:
        verb = "Reached time limit"
    elif "FAIL" in kinds:
        verb = "Failed"
    else:
        verb = "Ended"
    code = change.exit_code if change.exit_code is not None else "-"
    if change.signal:
        code = f"{code} (signal {change.signal})"
    return f"{head} {verb}, Run time {clock_text(run)}, {change.state.upper()}, ExitCode {code}"


def mail_message(
    change: Change,
    kinds: frozenset[str],
    sender: str,
    recipient: str,
    array_counts: Mapping[str, int] | None = None,
) -> EmailMessage:
    """The whole mail. `sender` and `recipient` are checked addresses or user names
    (gpuq.domain.notify.check_mail_user); the subject is built by `subject`."""
    message = EmailMessage(policy=_MAIL_POLICY)
    message["From"] = sender
    message["To"] = recipient
    message["Subject"] = subject(change, kinds, array_counts)
    message["Auto-Submitted"] = "auto-generated"  # RFC 3834: no auto-replies
    lines = [
        f"Job: {change.job_id}",
        f"Name: {header_text(change.name, 256)}",
        f"User: {change.user}",
        f"State: {change.from_state or '-'} -> {change.state}",
        f"Reason: {header_text(change.reason, 1000)}",
    ]
    if change.array_job_id is not None:
        lines.append(f"Array: {change.array_job_id}")
    if array_counts is not None:
        tasks = ", ".join(f"{n} {s}" for s, n in sorted(array_counts.items()))
        lines.append(f"Tasks: {tasks}")
    if change.exit_code is not None:
        lines.append(f"Exit code: {change.exit_code}")
    if change.signal:
        lines.append(f"Signal: {change.signal}")
    message.set_content("\n".join(lines) + "\n")
    return message


def backoff(attempt: int, cap: float = BACKOFF_CAP) -> float:
    """Seconds before retry `attempt` (0: the first retry): 1, 2, 4, ... up to `cap`."""
    return float(min(cap, 2 ** min(attempt, 30)))


def retryable(status: int) -> bool:
    """An HTTP answer worth trying again: a server error, a timeout, too many requests."""
    return status >= 500 or status in (408, 429)


def redact(url: str) -> str:
    """A URL as a log may show it: no user:password, no query or fragment (tokens)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = parts.port
    except ValueError:
        return "(a malformed URL)"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port else host
    return f"{parts.scheme}://{netloc}{parts.path}"


def address_allowed(address: str, allow: Iterable[str]) -> bool:
    """A user's webhook may reach a public address, or one inside an allowed network; never
    loopback, private, link-local, multicast, reserved or unspecified ones otherwise."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for network in allow:
        try:
            if ip in ipaddress.ip_network(network, strict=False):
                return True
        except ValueError:
            continue
    return not (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


@dataclass(frozen=True, slots=True)
class HealthChange:
    """A node's or a GPU's health changed: what an admin webhook receives."""

    kind: str  # "node" or "gpu"
    node: str
    gpu: str | None  # the unit's UUID (index in `index`)
    index: int | None
    from_state: str | None  # None: first seen
    to_state: str
    reason: str
    at: float

    def body(self) -> bytes:
        data = {
            "kind": self.kind,
            "node": self.node,
            "gpu": self.gpu,
            "index": self.index,
            "from": self.from_state,
            "to": self.to_state,
            "reason": self.reason,
            "at": self.at,
        }
        return json.dumps(data, ensure_ascii=True, sort_keys=True).encode()


# a node's or a unit's health: (state, reason), keyed by (node, uuid or "") with its index
Health = Mapping[tuple[str, str], tuple[str, str, int | None]]


def health_changes(before: Health, after: Health, at: float) -> list[HealthChange]:
    """What changed from one look at the cluster to the next (a node or unit that appears is
    told with from None; one that disappears is not told: its node says so)."""
    changes: list[HealthChange] = []
    for key, (state, reason, index) in sorted(after.items()):
        old = before.get(key)
        if old is not None and old[0] == state:
            continue
        node, unit = key
        changes.append(
            HealthChange(
                "gpu" if unit else "node",
                node,
                unit or None,
                index,
                old[0] if old is not None else None,
                state,
                reason,
                at,
            )
        )
    return changes
