"""Who may do what (gpuq.coordinator.access.permissions): each named check allows whom it
should and refuses the rest with its one line."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuq.coordinator.access.permissions import (
    check_acts_on,
    check_admin,
    check_attaches,
    check_lowers_nice,
    check_may_submit,
    check_raises_time_limit,
    check_reads_log,
    check_removes_cron,
    check_selected,
    check_selects_for,
    check_splits,
    hides_name,
    is_owner_or_admin,
)
from gpuq.errors import PermissionDenied
from gpuq.identity import Caller

ALICE = Caller("alice", 1001)
BOB = Caller("bob", 1002)
ADMIN = Caller("carol", 1003, admin=True)
ROOT = Caller("root", 0, admin=True)


@pytest.mark.parametrize(
    ("check", "refusal"),
    [
        (lambda c: check_acts_on(c, "alice", "12"), "job 12 belongs to alice, not to bob"),
        (lambda c: check_selected(c, "alice", "40_3"), "job 40_3 belongs to alice"),
        (
            lambda c: check_reads_log(c, "alice", 12),
            "job 12 is alice's: only its owner or an admin",
        ),
        (lambda c: check_removes_cron(c, "alice", 3), "cron entry 3 belongs to alice"),
        (lambda c: check_selects_for(c, "alice"), "only admins may act on another user's jobs"),
    ],
)
def test_the_owner_and_admins_pass_others_are_refused(
    check: Callable[[Caller], None], refusal: str
) -> None:
    check(ALICE)
    check(ADMIN)
    with pytest.raises(PermissionDenied, match=refusal):
        check(BOB)


def test_a_terminal_is_its_owners_alone() -> None:
    check_attaches("alice", "alice", 7)
    for other in ("bob", "carol", "root"):  # not even an admin: keystrokes run as the owner
        with pytest.raises(PermissionDenied, match="job 7 belongs to alice, not to"):
            check_attaches(other, "alice", 7)


def test_a_task_is_split_off_for_whom_it_is_acted_on() -> None:
    check_splits("alice", "alice", "40_3")
    with pytest.raises(PermissionDenied, match="job 40_3 belongs to alice"):
        check_splits("bob", "alice", "40_3")


def test_admin_only_verbs_name_the_group() -> None:
    check_admin(ADMIN, "drain nodes", "gpuq-admins")
    with pytest.raises(
        PermissionDenied,
        match=r"only admins may drain nodes \(members of the group gpuq-admins, or root\)",
    ):
        check_admin(ALICE, "drain nodes", "gpuq-admins")


def test_root_submits_only_where_the_admin_allows_it() -> None:
    check_may_submit(ALICE, allow_root_jobs=False)
    for root in (ROOT, Caller("root", None, how="token"), Caller("x", 0)):
        with pytest.raises(PermissionDenied, match="root may not submit jobs here") as refused:
            check_may_submit(root, allow_root_jobs=False)
        # following the advice must work: it names both settings root's jobs need
        assert "under both [coordinator] and [agent]" in str(refused.value)
        check_may_submit(root, allow_root_jobs=True)


def test_owners_may_only_lower_what_admins_limit() -> None:
    check_raises_time_limit(True, "5", "1:00:00", "2:00:00")
    check_lowers_nice(True, "5", 0, -10)
    with pytest.raises(PermissionDenied, match="only admins may raise a time limit"):
        check_raises_time_limit(False, "5", "1:00:00", "2:00:00")
    with pytest.raises(PermissionDenied, match="only admins may lower nice"):
        check_lowers_nice(False, "5", 0, -10)


def test_names_are_hidden_from_others_only_where_the_admin_hides_them() -> None:
    names = ("names",)
    assert hides_name(BOB, "alice", names) and not hides_name(BOB, "alice", ())
    assert not hides_name(ALICE, "alice", names) and not hides_name(ADMIN, "alice", names)
    assert is_owner_or_admin(ALICE, "alice") and not is_owner_or_admin(BOB, "alice")
