"""A CLI helper never runs old code, and checks it cheaply (gpuq.cli.fast.code_check): a change
to any module of the package is seen on the next call, whether or not the watch saw it; an
event that changed no module (a new __pycache__) costs the fingerprint until the helper renews
the watch; where inotify could miss a change (a network file system), every call takes the
fingerprint."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuq.cli.fast import code_check
from gpuq.cli.fast.code_check import CodeCheck, CodeWatch

PACKAGE = Path(code_check.__file__).resolve().parents[2]


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of the gpuq package (only its .py files matter here)."""
    copy = tmp_path / "gpuq"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return copy


def fingerprints_taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the fingerprints taken from now on."""
    taken: list[int] = []
    real = code_check.code_fingerprint

    def counted(package: Path | None = None) -> code_check.Fingerprint:
        taken.append(1)
        return real(package)

    monkeypatch.setattr(code_check, "code_fingerprint", counted)
    return taken


def test_a_quiet_watch_spares_the_fingerprint(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = CodeCheck.taken(package=package)
    assert check.watch.fd >= 0, "tmp_path is on a local file system here"
    taken = fingerprints_taken(monkeypatch)
    assert check.unchanged()
    assert check.renewed() is check
    assert taken == []
    check.watch.close()


@pytest.mark.parametrize(
    "change",
    [
        "utime",  # only the mtime (what the e2e test of a stale helper does)
        "rewrite",  # new content, same size
        "new module",
        "removed module",
        "renamed over",  # pip and editors write a new file and rename it over the old
        "new subpackage",
    ],
)
def test_a_change_to_the_code_is_seen_on_the_next_call(package: Path, change: str) -> None:
    check = CodeCheck.taken(package=package)
    module = package / "cli" / "render.py"
    if change == "utime":
        os.utime(module, ns=(1, 1))
    elif change == "rewrite":
        text = module.read_text()
        module.write_text(text[::-1])
    elif change == "new module":
        (package / "cli" / "extra.py").write_text("x = 1\n")
    elif change == "removed module":
        module.unlink()
    elif change == "renamed over":
        fresh = package / "cli" / ".render.py.new"
        fresh.write_text(module.read_text() + "# changed\n")
        fresh.rename(module)
    else:
        (package / "cli" / "plugins").mkdir()
        (package / "cli" / "plugins" / "__init__.py").write_text("")
    assert not check.watch.quiet()
    assert not check.unchanged()
    assert check.renewed() is None  # the helper leaves
    check.watch.close()


def test_an_event_that_changed_no_module_costs_a_fingerprint_until_renewed(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = CodeCheck.taken(package=package)
    (package / "cli" / "__pycache__").mkdir()  # Python writing bytecode
    (package / "cli" / "notes.txt").write_text("not code")
    taken = fingerprints_taken(monkeypatch)
    assert check.unchanged()
    assert taken == [1]
    fresh = check.renewed()
    assert fresh is not None and fresh is not check
    assert fresh.watch.quiet() and fresh.known == check.known
    taken.clear()
    assert fresh.unchanged() and taken == []
    os.utime(package / "cli" / "render.py", ns=(1, 1))  # and the fresh watch sees changes
    assert not fresh.unchanged()
    check.watch.close()
    fresh.watch.close()


def test_a_change_while_loading_never_passes(package: Path) -> None:
    before = code_check.code_fingerprint(package)
    os.utime(package / "cli" / "render.py", ns=(1, 1))  # between the two fingerprints
    check = CodeCheck.taken(loaded_before=before, package=package)
    assert not check.unchanged()
    check.watch.close()


def test_no_watch_where_inotify_could_miss_a_change(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder that is not on a local file system (here /proc, standing for NFS), or a
    machine out of inotify watches: never quiet, so every call takes the fingerprint."""
    assert CodeWatch(["/proc"]).fd == -1
    monkeypatch.setattr(code_check, "_on_local_disk", lambda folder: False)
    check = CodeCheck.taken(package=package)
    assert check.watch.fd == -1 and not check.watch.quiet()
    taken = fingerprints_taken(monkeypatch)
    assert check.unchanged() and taken == [1]
    os.utime(package / "cli" / "render.py", ns=(1, 1))
    assert not check.unchanged()
