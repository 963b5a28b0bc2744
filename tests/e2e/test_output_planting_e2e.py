"""Output files another user cannot plant (issue 23).

In a project folder other users can write to, bob may create alice's next default output
file (gpuq-<id>.out) before her job starts: a symlink to one of her own files (the job would
overwrite it), a FIFO (he reads her output live and her job hangs until he opens it), or a
world-writable file of his (it captures her output). The supervisor opens output files as the
submitter without following a final symlink, without blocking on a FIFO, only as a regular
file (or /dev/null), and in such a folder only a file that is hers. Real Unix users, a real
root hub, fork server and supervisors (the pattern of test_run_as_user_e2e.py). Root only.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_run_as_user_e2e
import unix_users
from test_run_as_user_e2e import job_spec, launch_all, workdir_of
from unix_users import UnixUser, needs_root, run_as

pytestmark = pytest.mark.timeout(90)
user_homes = unix_users.user_homes  # fixtures: throwaway Unix users
two_users = unix_users.two_users
state = test_run_as_user_e2e.state  # a hub folder every user may pass through


@dataclasses.dataclass(frozen=True)
class Project:
    """A folder alice and bob may both write to; `bob` is bob as he acts there."""

    folder: Path
    alice: UnixUser
    bob: UnixUser


@pytest.fixture(params=["sticky-world", "group"])
def project(
    request: pytest.FixtureRequest, two_users: tuple[UnixUser, UnixUser]
) -> Iterator[Project]:
    """sticky-world: root's 1777 folder (as /tmp); group: root's 2775 folder of a group both
    are in (alice's extra group, which bob's processes here hold too)."""
    needs_root()
    alice, bob = two_users
    above = Path(tempfile.mkdtemp(prefix="gpuqt-project-"))
    above.chmod(0o755)
    folder = above / "proj"
    folder.mkdir()
    if request.param == "sticky-world":
        folder.chmod(0o1777)
    else:
        os.chown(folder, 0, alice.extra_gid)
        folder.chmod(0o2775)
        bob = dataclasses.replace(bob, extra_group=alice.extra_group, extra_gid=alice.extra_gid)
    try:
        yield Project(folder, alice, bob)
    finally:
        shutil.rmtree(above, ignore_errors=True)


def as_user(user: UnixUser, code: str) -> None:
    done = run_as(user, ["-c", "import os\n" + code])
    assert done.returncode == 0, done.stderr


def precious_of(alice: UnixUser) -> Path:
    """A file of alice's own, 0600, in her private home."""
    path = alice.home / "precious"
    as_user(
        alice, f"open({str(path)!r}, 'w').write(\"alice's\\n\"); os.chmod({str(path)!r}, 0o600)"
    )
    return path


def test_a_planted_symlink_to_her_own_file_fails_her_job(state: Path, project: Project) -> None:
    precious = precious_of(project.alice)
    out = project.folder / "gpuq-1.out"
    as_user(project.bob, f"os.symlink({str(precious)!r}, {str(out)!r})")
    end = launch_all(state, job_spec(project.alice, 1, "echo pwned\n", project.folder))[1]
    assert end.end_state == "failed"
    assert end.reason == (
        f"launch failed: output file {out} is a symbolic link; refusing to write through it"
    )
    assert precious.read_text() == "alice's\n"
    assert out.is_symlink()


def test_a_planted_fifo_fails_her_job_at_once(state: Path, project: Project) -> None:
    """No reader: the job neither hangs nor runs. A reader holding it open (bob listening):
    it fails all the same, and the reader gets nothing."""
    out = project.folder / "gpuq-1.out"
    listened = project.folder / "gpuq-2.out"
    as_user(
        project.bob,
        f"for p in ({str(out)!r}, {str(listened)!r}): os.mkfifo(p); os.chmod(p, 0o666)",
    )
    reader = os.open(listened, os.O_RDONLY | os.O_NONBLOCK)
    try:
        began = time.monotonic()
        specs = [job_spec(project.alice, n, "echo secret\n", project.folder) for n in (1, 2)]
        ends = launch_all(state, *specs)
        assert time.monotonic() - began < 10
        for n, path in ((1, out), (2, listened)):
            assert ends[n].end_state == "failed"
            assert ends[n].reason == (
                f"launch failed: output file {path} is a FIFO, not a regular file; "
                "refusing to write into it"
            )
        assert os.read(reader, 100) == b""
    finally:
        os.close(reader)


def test_a_planted_world_writable_file_fails_naming_its_owner(
    state: Path, project: Project
) -> None:
    out = project.folder / "gpuq-1.out"
    as_user(project.bob, f"open({str(out)!r}, 'w').write('bait\\n'); os.chmod({str(out)!r}, 0o666)")
    end = launch_all(state, job_spec(project.alice, 1, "echo secret\n", project.folder))[1]
    assert end.end_state == "failed"
    assert end.reason == (
        f"launch failed: output file {out} belongs to {project.bob.name}; "
        "refusing to write into a file another user planted"
    )
    assert out.read_text() == "bait\n"


def test_her_own_file_is_truncated_or_appended_to(state: Path, project: Project) -> None:
    """Her own 0600 file there: truncated by a first start, appended to after a requeue; one
    her umask made group-writable (002) is hers too."""
    out = project.folder / "gpuq-1.out"
    grouped = project.folder / "gpuq-2.out"
    as_user(
        project.alice,
        f"open({str(out)!r}, 'w').write('old\\n'); os.chmod({str(out)!r}, 0o600)\n"
        f"open({str(grouped)!r}, 'w').write('old\\n'); os.chmod({str(grouped)!r}, 0o664)",
    )
    first = job_spec(project.alice, 1, "echo new\n", project.folder)
    assert launch_all(state, first)[1].end_state == "completed"
    assert out.read_text() == "new\n"
    again = job_spec(project.alice, 3, "echo again\n", project.folder, output=str(out))
    again = dataclasses.replace(again, open_mode="append")  # as after a requeue
    assert launch_all(state, again)[3].end_state == "completed"
    assert out.read_text() == "new\nagain\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    loose = job_spec(project.alice, 2, "echo mine\n", project.folder, umask=0o002)
    end = launch_all(state, loose)[2]
    assert end.end_state == "completed", end.reason
    assert grouped.read_text() == "mine\n"


def test_her_files_writable_by_others_or_hard_linked_are_refused(
    state: Path, project: Project
) -> None:
    """Hers, but group/world-writable beyond her umask (bob could have swapped its content
    in), or a second name of another file of hers (a hard link): refused, untouched."""
    precious = precious_of(project.alice)
    loose, linked = project.folder / "gpuq-1.out", project.folder / "gpuq-2.out"
    as_user(
        project.alice,
        f"open({str(loose)!r}, 'w').write('old\\n'); os.chmod({str(loose)!r}, 0o666)\n"
        f"os.link({str(precious)!r}, {str(linked)!r})",
    )
    ends = launch_all(
        state,
        job_spec(project.alice, 1, "echo x\n", project.folder, umask=0o022),
        job_spec(project.alice, 2, "echo x\n", project.folder),
    )
    assert ends[1].reason == (
        f"launch failed: output file {loose} is writable by other users (mode 0666), in a "
        "folder other users can write to; refusing to write into it"
    )
    assert ends[2].reason == (
        f"launch failed: output file {linked} has another hard link, in a folder other users "
        "can write to; refusing to write into it"
    )
    assert loose.read_text() == "old\n"
    assert precious.read_text() == "alice's\n"


def test_dev_null_still_works(state: Path, project: Project) -> None:
    """--output /dev/null (and the agent's step workers, whose stdout_path is /dev/null)."""
    spec = job_spec(project.alice, 1, "echo gone\n", project.folder, output="/dev/null")
    assert spec.stdout_path == spec.stderr_path == "/dev/null"
    end = launch_all(state, spec)[1]
    assert end.end_state == "completed", end.reason
    assert not (project.folder / "gpuq-1.out").exists()


def test_a_private_folder_is_unchanged(state: Path, two_users: tuple[UnixUser, UnixUser]) -> None:
    """In her own 0755 folder (in her 0700 home) nobody else can plant: a new file is made as
    before, and an existing file of hers is written whatever its mode."""
    alice = two_users[0]
    work = workdir_of(alice)
    loose = work / "gpuq-2.out"
    as_user(alice, f"open({str(loose)!r}, 'w').write('old\\n'); os.chmod({str(loose)!r}, 0o666)")
    ends = launch_all(
        state,
        job_spec(alice, 1, "echo fresh\n", work, umask=0o022),
        job_spec(alice, 2, "echo over\n", work),
    )
    assert ends[1].end_state == ends[2].end_state == "completed"
    fresh = work / "gpuq-1.out"
    assert fresh.read_text() == "fresh\n"
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
    assert fresh.stat().st_uid == alice.uid
    assert loose.read_text() == "over\n"
    assert stat.S_IMODE(loose.stat().st_mode) == 0o666


def test_a_planted_fifo_as_the_error_file_is_refused(state: Path, project: Project) -> None:
    """--error naming a planted FIFO (stdout her own fresh file): refused on the stderr file."""
    err = project.folder / "err.txt"
    as_user(project.bob, f"os.mkfifo({str(err)!r}); os.chmod({str(err)!r}, 0o666)")
    spec = job_spec(project.alice, 1, "echo x\n", project.folder, error=str(err))
    end = launch_all(state, spec)[1]
    assert end.end_state == "failed"
    assert end.reason.startswith(f"launch failed: output file {err} is a FIFO")
