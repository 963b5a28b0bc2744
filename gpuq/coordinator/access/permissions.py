"""Who may do what, as named checks (SLURM's validate_operator and friends): every decision
about a caller's rights is made here, and nowhere else.

README "Security": everyone sees every job in listings (who holds each GPU, and what the job is
named), less what `[coordinator] private_data` hides from other users (`sees`, the one privacy
rule); a job's script, arguments, environment, webhook and mail address only its owner and
admins; cancel, hold, release, requeue and update: the owner or an admin (what an admin does to
another's job is logged; an owner's update may only lower what admins limit); attaching to an
interactive job's terminal: its owner only; drain, resume and tokens: admins; submitting as
root: only where the admin allows root's jobs. Admins are root, the coordinator's own user and
members of the admin group (gpuq.coordinator.access.authority decides who a caller is and
whether they are an admin).
"""

from __future__ import annotations

from gpuq.domain.limits import brief
from gpuq.errors import PermissionDenied
from gpuq.identity import Caller

# the coordinator itself, acting on its own rules (an idle job's QOS cancels it)
SYSTEM = Caller("gpuq", None, admin=True, how="coordinator")


def is_owner_or_admin(caller: Caller, owner: str) -> bool:
    """May see a job's private parts, and act on it."""
    return caller.admin or owner == caller.user


def check_may_submit(caller: Caller, allow_root_jobs: bool) -> None:
    """Root's jobs would run as root: only where the admin allows it. The refusal names both
    settings: the coordinator's lets root submit, each node's lets its agent launch as root
    (one alone ends in a launch failure)."""
    if (caller.uid == 0 or caller.user == "root") and not allow_root_jobs:
        raise PermissionDenied(
            "root may not submit jobs here (they would run as root); submit as an ordinary "
            "user, or an admin sets allow_root_jobs = true under both [coordinator] and "
            "[agent] (each node's)"
        )


def check_sets_nice(admin: bool, nice: int) -> None:
    """Negative nice raises a job above others': for admins only, at submit (flags, script
    headers, arrays, cron entries) as at update (check_lowers_nice)."""
    if nice < 0 and not admin:
        raise PermissionDenied(
            f"only admins may give a negative nice ({nice}); use 0 or more (a lower priority)"
        )


def check_admin(caller: Caller, what: str, admin_group: str) -> None:
    """Admins only: draining and resuming nodes, issuing and revoking tokens."""
    if not caller.admin:
        raise PermissionDenied(
            f"only admins may {what} (members of the group {admin_group}, or root)"
        )


def check_selects_for(caller: Caller, user: str | None) -> None:
    """A bulk selection may name another user's jobs (`-u bob`) only for an admin."""
    if user and user != caller.user and not caller.admin:
        raise PermissionDenied(f"only admins may act on another user's jobs ({user})")


def check_acts_on(caller: Caller, owner: str, named: str) -> None:
    """The owner or an admin may act on a job; `named`: the job as the caller named it, read
    before anything changes, so a request naming another's job changes nothing."""
    if not is_owner_or_admin(caller, owner):
        raise PermissionDenied(f"job {brief(named)} belongs to {owner}, not to {caller.user}")


def check_selected(caller: Caller, owner: str, display_id: str) -> None:
    """The same, for a job a selection found (an array's task, a job a filter matched)."""
    if not is_owner_or_admin(caller, owner):
        raise PermissionDenied(f"job {display_id} belongs to {owner}")


def check_splits(user: str, owner: str, display_id: str) -> None:
    """A task is split off its array's record only for its owner (or an admin acting as
    the owner): `user` is who acts."""
    if owner != user:
        raise PermissionDenied(f"job {display_id} belongs to {owner}")


def check_attaches(caller_user: str, owner: str, job_id: int) -> None:
    """An interactive job's terminal is its owner's only (not even an admin's: keystrokes
    would run as the owner)."""
    if owner != caller_user:
        raise PermissionDenied(f"job {job_id} belongs to {owner}, not to {caller_user}")


def check_reads_log(caller: Caller, owner: str, job_id: int) -> None:
    """A job's output (the dashboard's log view) is its owner's and admins'."""
    if not is_owner_or_admin(caller, owner):
        raise PermissionDenied(f"job {job_id} is {owner}'s: only its owner or an admin")


def check_removes_cron(caller: Caller, owner: str, entry_id: int) -> None:
    if not is_owner_or_admin(caller, owner):
        raise PermissionDenied(f"cron entry {entry_id} belongs to {owner}")


def check_raises_time_limit(admin: bool, display_id: str, current: str, wanted: str) -> None:
    """An owner may shorten a time limit, not lengthen it (SLURM's scontrol update)."""
    if not admin:
        raise PermissionDenied(
            f"job {display_id}: only admins may raise a time limit "
            f"({current} -> {wanted}); you may lower it"
        )


def check_lowers_nice(admin: bool, display_id: str, old: int, new: int) -> None:
    """An owner may raise nice, not lower it (negative nice is for admins)."""
    if not admin:
        raise PermissionDenied(
            f"job {display_id}: only admins may lower nice ({old} -> {new}); you may raise it"
        )


def sees(caller: Caller | None, owner: str, what: str, private_data: tuple[str, ...]) -> bool:
    """The one privacy rule: may `caller` see `what` ("names", "usage") of `owner`'s jobs?
    Always unless the admin made it private; then only the owner and admins. `caller` None:
    an anonymous reader (a Prometheus scrape), who sees nothing private."""
    if what not in private_data:
        return True
    return caller is not None and is_owner_or_admin(caller, owner)


def hides_name(caller: Caller, owner: str, private_data: tuple[str, ...]) -> bool:
    """Another user's job name shows as `(hidden)` (private_data holds "names")."""
    return not sees(caller, owner, "names", private_data)
