"""`gpuq admin doctor`'s framework and its own checks, on fake machines: a check that raises
is one fail line and the rest still run; the exit status follows the fails; the text's columns
and fix lines; the JSON's shape; and what the configuration, clock, certificate and key file
checks find (gpuq.admin.doctor, doctor_node, doctor_trust). The real command against real
coordinators: tests/e2e/test_admin_doctor_e2e.py."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from doctor_certs import reissue, site

from gpuq.admin.checks import Check, DoctorContext
from gpuq.admin.doctor import (
    CHECKS,
    doctor_context,
    exit_status,
    machine_roles,
    render_json,
    render_text,
    run_checks,
)
from gpuq.admin.doctor_node import clock_check, configuration_checks, kernel_clock_synchronised
from gpuq.admin.doctor_trust import certificate_checks, key_file_checks
from gpuq.config.settings import AgentSettings, ClientSettings, Settings
from gpuq.identity import KEY_NOT_OWNED, KEY_NOT_PRIVATE, key_file_problem


def context(tmp_path: Path, roles: set[str] | None = None, **agent: object) -> DoctorContext:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    settings = Settings(home=home, agent=AgentSettings(node_name="n1", **agent))  # type: ignore[arg-type]
    return DoctorContext(
        settings, run=tmp_path / "run", roles=frozenset(roles or {"coordinator", "agent"})
    )


def fine(_: DoctorContext) -> list[Check]:
    return [Check("fine", "ok", "all good")]


def boom(_: DoctorContext) -> list[Check]:
    raise RuntimeError("the sensor fell off")


def shaky(_: DoctorContext) -> list[Check]:
    return [Check("shaky", "warn", "so-so", "tighten it")]


# ---- the framework ----------------------------------------------------------------------------


def test_a_check_that_raises_is_one_fail_and_the_others_still_run(tmp_path: Path) -> None:
    checks = run_checks(context(tmp_path), [fine, boom, shaky])
    assert [(c.name, c.status) for c in checks] == [
        ("fine", "ok"),
        ("boom", "fail"),
        ("shaky", "warn"),
    ]
    assert "RuntimeError: the sensor fell off" in checks[1].detail
    assert exit_status(checks) == 1
    lines = render_text(checks).splitlines()
    assert [line.split()[0] for line in lines if not line.startswith(" ")] == ["ok", "FAIL", "warn"]


def test_a_check_module_that_cannot_be_loaded_is_one_fail(tmp_path: Path) -> None:
    checks = run_checks(context(tmp_path), ["gpuq.admin.no_such_module:gpu_checks", fine])
    assert [(c.name, c.status) for c in checks] == [("gpu", "fail"), ("fine", "ok")]
    assert "ModuleNotFoundError" in checks[0].detail


def test_every_listed_check_loads() -> None:
    checks = run_checks(DoctorContext(Settings()), [])
    assert checks == []
    for entry in CHECKS:
        module, _, name = entry.partition(":")
        assert callable(getattr(__import__(module, fromlist=[name]), name)), entry


def test_warnings_and_skips_exit_0_a_fail_exits_1() -> None:
    assert exit_status([Check("a", "ok", ""), Check("b", "warn", "", "x")]) == 0
    assert exit_status([Check("a", "skip", "n/a")]) == 0
    assert exit_status([Check("a", "ok", ""), Check("b", "fail", "", "x")]) == 1


def test_text_has_aligned_columns_and_a_fix_line_only_for_problems() -> None:
    checks = [
        Check("clock", "ok", "synchronised", "never shown"),
        Check("coordinator", "fail", "no answer", "start it"),
        Check("certificates", "skip", "none configured"),
    ]
    lines = render_text(checks).splitlines()
    assert lines == [
        "ok    clock         synchronised",
        "FAIL  coordinator   no answer",
        "                    fix: start it",
        "skip  certificates  none configured",
    ]


def test_text_escapes_what_a_file_name_could_smuggle_in() -> None:
    text = render_text([Check("key file", "fail", "/tmp/a\x1b[2Jb must be private", "chmod")])
    assert "\x1b" not in text and "\\x1b" in text


def test_json_has_every_check_and_whether_any_failed() -> None:
    checks = [Check("clock", "warn", "unknown \u202e", "run chrony"), Check("x", "ok", "fine")]
    text = render_json(checks)
    assert text.isascii()
    assert json.loads(text) == {
        "ok": True,
        "checks": [
            {"name": "clock", "status": "warn", "detail": "unknown \u202e", "fix": "run chrony"},
            {"name": "x", "status": "ok", "detail": "fine", "fix": ""},
        ],
    }
    assert json.loads(render_json([Check("x", "fail", "bad", "fix")]))["ok"] is False


# ---- configuration and roles ------------------------------------------------------------------


def test_a_config_error_fails_naming_the_file_and_key_and_the_rest_skip(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[agent]\nfence_time = "soon"\n')
    ctx = doctor_context(config, tmp_path / "home")
    assert ctx.config_file == config
    checks = run_checks(ctx)
    first = checks[0]
    assert (first.name, first.status) == ("configuration", "fail")
    assert str(config) in first.detail and "[agent] fence_time" in first.detail
    assert str(config) in first.fix
    skipped = {c.name for c in checks if c.status == "skip"}
    assert {"coordinator", "certificates", "key files", "run folder"} <= skipped


def test_a_loaded_config_names_the_file_and_the_roles(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[agent]\nnode_name = "gpu7"\nfake_gpus = "2"\n')
    ctx = doctor_context(config, tmp_path / "home")
    assert ctx.roles == {"agent"}
    checks = configuration_checks(ctx)
    assert [(c.name, c.status) for c in checks] == [("configuration", "ok"), ("role", "ok")]
    assert str(config) in checks[0].detail
    assert "agent of node gpu7 (fake GPUs 2)" in checks[1].detail


def test_roles_come_from_the_config_sections_and_the_home(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    assert machine_roles(settings, frozenset()) == set()
    assert machine_roles(settings, frozenset({"coordinator", "client"})) == {"coordinator"}
    (tmp_path / "auth.key").write_text("k")
    (tmp_path / "agent").mkdir()
    assert machine_roles(settings, frozenset()) == {"coordinator", "agent"}


# ---- the clock --------------------------------------------------------------------------------


def test_clock_synchronised_is_ok_unsynchronised_or_unknown_a_warning(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert clock_check(True, run).status == "ok"
    unsynced = clock_check(False, run)
    assert unsynced.status == "warn" and "not synchronised" in unsynced.detail
    assert "timesyncd" in unsynced.fix or "chrony" in unsynced.fix
    unknown = clock_check(None, run)
    assert unknown.status == "warn" and "unknown" in unknown.detail
    marker = run / "systemd" / "timesync" / "synchronized"
    marker.parent.mkdir(parents=True)
    marker.touch()
    assert clock_check(None, run).status == "ok"


def test_the_kernel_is_asked_without_raising() -> None:
    assert kernel_clock_synchronised() in (True, False, None)


# ---- key files --------------------------------------------------------------------------------


def test_the_key_rule_is_the_daemons_one(tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_text("x")
    key.chmod(0o600)
    me = os.geteuid()
    assert key_file_problem(key.lstat(), me) is None
    key.chmod(0o640)
    assert key_file_problem(key.lstat(), me) == KEY_NOT_PRIVATE
    key.chmod(0o600)
    if me == 0:
        os.chown(key, 4321, -1)
        assert key_file_problem(key.lstat(), 1234) == KEY_NOT_OWNED
        assert key_file_problem(key.lstat(), 4321) is None


def test_a_readable_key_fails_with_its_chmod(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    auth = ctx.settings.key_path
    auth.write_text("secret\n")
    auth.chmod(0o644)
    nodes = ctx.settings.nodes_dir
    nodes.mkdir()
    (nodes / "n1.key").write_text("secret\n")
    (nodes / "n1.key").chmod(0o600)
    checks = key_file_checks(ctx)
    bad = [c for c in checks if c.status == "fail"]
    assert len(bad) == 1
    assert str(auth) in bad[0].detail and "0644" in bad[0].detail
    assert bad[0].fix == f"chmod 600 {auth}"
    good = [c for c in checks if c.status == "ok"]
    assert len(good) == 1 and str(nodes / "n1.key") in good[0].detail


def test_a_configured_node_key_that_is_missing_fails(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"agent"}, node_key=str(tmp_path / "node.key"))
    checks = key_file_checks(ctx)
    assert [(c.status, c.name) for c in checks] == [("fail", "key file")]
    assert "cannot start" in checks[0].detail and "node-key" in checks[0].fix


def test_a_default_node_key_not_made_yet_is_fine(tmp_path: Path) -> None:
    checks = key_file_checks(context(tmp_path, {"agent"}))
    assert [c.status for c in checks] == ["skip"]


# ---- certificates -----------------------------------------------------------------------------


def tls_context(tmp_path: Path, files: dict[str, Path]) -> DoctorContext:
    ctx = context(
        tmp_path,
        {"agent"},
        tls_ca=str(files["ca"]),
        tls_cert=str(files["cert"]),
        tls_key=str(files["key"]),
    )
    return ctx


def test_a_good_pair_is_ok_with_its_end_date(tmp_path: Path) -> None:
    files = site(tmp_path / "tls")
    [check] = certificate_checks(tls_context(tmp_path, files))
    assert (check.name, check.status) == ("TLS [agent]", "ok")
    assert "valid until" in check.detail and f"signed by {files['ca']}" in check.detail


@pytest.mark.parametrize(
    ("days", "status", "words"),
    [(-3, "fail", "expired on"), (10, "warn", "expires on"), (40, "ok", "valid until")],
)
def test_a_certificate_near_or_past_its_end(
    tmp_path: Path, days: float, status: str, words: str
) -> None:
    files = site(tmp_path / "tls")
    reissue(files, days)
    [check] = certificate_checks(tls_context(tmp_path, files))
    assert check.status == status and words in check.detail, check
    if status != "ok":
        assert "gpuq admin certs" in check.fix


def test_a_key_of_another_certificate_fails(tmp_path: Path) -> None:
    files = site(tmp_path / "tls")
    other = site(tmp_path / "tls", node="n2")
    files["key"] = other["key"]
    [check] = certificate_checks(tls_context(tmp_path, files))
    assert check.status == "fail" and "does not belong to the certificate" in check.detail


def test_a_certificate_of_another_ca_fails(tmp_path: Path) -> None:
    files = site(tmp_path / "tls")
    files["ca"] = site(tmp_path / "elsewhere")["ca"]
    [check] = certificate_checks(tls_context(tmp_path, files))
    assert check.status == "fail" and "is not signed by the CA" in check.detail


def test_a_missing_file_fails_naming_the_setting(tmp_path: Path) -> None:
    files = site(tmp_path / "tls")
    files["cert"] = tmp_path / "gone.pem"
    [check] = certificate_checks(tls_context(tmp_path, files))
    assert check.status == "fail" and "[agent] tls_cert" in check.detail


def test_no_tls_files_is_a_skip(tmp_path: Path) -> None:
    assert [c.status for c in certificate_checks(context(tmp_path))] == ["skip"]
    ctx = context(tmp_path)
    client = replace(ctx, settings=replace(ctx.settings, client=ClientSettings(tls_ca="/x.pem")))
    [check] = certificate_checks(client)
    assert check.name == "TLS [client]" and check.status == "fail"
