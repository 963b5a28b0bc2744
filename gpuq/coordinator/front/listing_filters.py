"""The listing filters of ListJobs (`gpuq queue -u a,b -n 'sweep*' -w node1`, `gpuq history
--since yesterday`): checked at the edge (one INVALID_ARGUMENT naming the bad filter), then
matched in memory for live jobs or handed to the store (SQL) for ended ones.

Pure: no I/O, tested without a server. Names are shell patterns read by gpuq.domain.patterns,
so memory and both databases select the same jobs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from gpuq.domain.limits import MAX_NODE_NAME, brief, check_text
from gpuq.domain.model import Job
from gpuq.domain.patterns import compile_patterns
from gpuq.errors import InvalidInput

MAX_FILTER_VALUES = 100  # users, name patterns or nodes in one listing
MAX_USER = 64  # the store's user column
MAX_PATTERN = 128  # a name pattern (a name is at most 128 characters)
MAX_STATES = 64  # state words (each may be a comma list; parse_states reads them)


@dataclass(frozen=True, slots=True)
class ListFilters:
    """What a listing asked for besides states, ids and a limit (None: not asked)."""

    users: tuple[str, ...] | None = None
    names: tuple[str, ...] | None = None
    nodes: tuple[str, ...] | None = None
    since: float | None = None
    until: float | None = None
    name_re: re.Pattern[str] | None = None

    def matches(self, job: Job) -> bool:
        """For a live job (in memory): submitted in [since, until)."""
        if self.users is not None and job.user not in self.users:
            return False
        if self.nodes is not None and not any(n in self.nodes for n in job.node_names):
            return False
        if self.since is not None and job.submit_time < self.since:
            return False
        if self.until is not None and job.submit_time >= self.until:
            return False
        return self.name_re is None or self.name_re.fullmatch(job.spec.name) is not None

    def hiding_names(self, caller: str) -> ListFilters:
        """When job names are hidden from other users, a name filter may match only the
        caller's own jobs (else it would tell what the hidden names are)."""
        if self.names is None:
            return self
        mine = (caller,) if self.users is None or caller in self.users else ()
        return ListFilters(mine, self.names, self.nodes, self.since, self.until, self.name_re)


def _texts(what: str, values: Any, limit: int) -> tuple[str, ...] | None:
    if len(values) > MAX_FILTER_VALUES:
        raise InvalidInput(what, len(values), f"at most {MAX_FILTER_VALUES} in one listing")
    for value in values:
        check_text(what, value, limit)
        if not value:
            raise InvalidInput(what, "''", "must not be empty")
    return tuple(values) or None


def _moment(what: str, request: Any, field: str) -> float | None:
    if not request.HasField(field):
        return None
    value = float(getattr(request, field))
    if not math.isfinite(value) or not 0 <= value <= 2**40:
        raise InvalidInput(what, value, "must be a time in seconds since 1970")
    return value


def list_filters(request: Any) -> ListFilters:
    """ListJobsRequest's filters, checked: sizes, counts, control characters, patterns
    that compile. `user` and `users` together: any of them."""
    if len(request.states) > MAX_STATES:
        raise InvalidInput("--state", len(request.states), f"at most {MAX_STATES} states")
    check_text("user", request.user, MAX_USER)
    users = _texts("--user", request.users, MAX_USER)
    if users is not None and request.user:
        users = (request.user, *users)
    names = _texts("--name", request.names, MAX_PATTERN)
    try:
        name_re = compile_patterns(names or ())
    except re.error as error:  # e.g. a backwards range [z-a]
        raise InvalidInput(
            "--name", brief(",".join(names or ())), f"bad pattern: {error}"
        ) from None
    return ListFilters(
        users=users,
        names=names,
        nodes=_texts("--nodelist", request.nodes, 2 * MAX_NODE_NAME),
        since=_moment("--since", request, "since"),
        until=_moment("--until", request, "until"),
        name_re=name_re,
    )
