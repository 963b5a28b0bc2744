"""Notifications' pure parts: which events mail, subjects and headers (hostile names), the
SSRF address check, URL redaction, the backoff schedule, health changes, and submit options."""

from __future__ import annotations

import email
import email.policy
import json
from pathlib import Path

import pytest

from gpuq.config.value_checks import check_setting
from gpuq.directives import Header
from gpuq.domain.notices import (
    Change,
    address_allowed,
    backoff,
    due_warnings,
    health_changes,
    mail_kinds,
    mail_message,
    passed_warnings,
    redact,
    retryable,
    subject,
    triggered,
)
from gpuq.domain.states import JobState as S
from gpuq.errors import ConfigError, InvalidInput
from gpuq.submission import build_spec


def change(**kw: object) -> Change:
    base: dict[str, object] = dict(
        job_id=12,
        array_job_id=None,
        array_task_id=None,
        name="train",
        user="ada",
        from_state="running",
        state="completed",
        reason="exit 0",
        at=100.0,
        exit_code=0,
        submit_time=10.0,
        start_time=20.0,
        end_time=82.0,
    )
    base.update(kw)
    return Change(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("before", "after", "reason", "requeued", "kinds"),
    [
        (S.PENDING, S.RUNNING, "", False, {"BEGIN"}),
        (S.RUNNING, S.COMPLETED, "", False, {"END"}),
        (S.RUNNING, S.FAILED, "", False, {"END", "FAIL"}),
        (S.RUNNING, S.OUT_OF_MEMORY, "", False, {"END", "FAIL"}),
        (S.RUNNING, S.NODE_FAIL, "", False, {"END", "FAIL"}),
        (S.RUNNING, S.NODE_FAIL, "", True, set()),  # requeued: REQUEUE comes next
        (S.NODE_FAIL, S.PENDING, "requeued", False, {"REQUEUE"}),
        (S.PREEMPTED, S.PENDING, "requeued", False, {"REQUEUE"}),
        (S.RUNNING, S.PENDING, "never received", False, set()),
        (S.RUNNING, S.TIMEOUT, "", False, {"END", "FAIL", "TIME_LIMIT"}),
        (S.PENDING, S.CANCELLED, "by ada", False, {"END"}),
        (
            S.PENDING,
            S.CANCELLED,
            "dependency can never be met: job 3 failed (afterok)",
            False,
            {"END", "INVALID_DEPEND"},
        ),
        (None, S.PENDING, "submitted", False, set()),
        (S.PENDING, S.HELD, "", False, set()),
        (S.RUNNING, S.RUNNING, "updated", False, set()),
    ],
)
def test_which_events_mail(
    before: S | None, after: S, reason: str, requeued: bool, kinds: set[str]
) -> None:
    assert triggered(before, after, reason, requeued) == kinds


def test_end_and_fail_asked_for_make_one_mail_of_both() -> None:
    kinds = mail_kinds(("END", "FAIL"), triggered(S.RUNNING, S.FAILED, "", False))
    assert kinds == {"END", "FAIL"}
    assert mail_kinds(("BEGIN",), triggered(S.RUNNING, S.FAILED, "", False)) == set()


def test_subjects_as_slurm() -> None:
    assert (
        subject(change(), frozenset({"END"}))
        == "gpuq Job_id=12 Name=train Ended, Run time 00:01:02, COMPLETED, ExitCode 0"
    )
    failed = change(state="failed", exit_code=3)
    assert subject(failed, frozenset({"END", "FAIL"})).endswith(
        "Failed, Run time 00:01:02, FAILED, ExitCode 3"
    )
    began = change(from_state="pending", state="running", end_time=None)
    assert (
        subject(began, frozenset({"BEGIN"}))
        == "gpuq Job_id=12 Name=train Began, Queued time 00:00:10"
    )
    task = change(job_id=15, array_job_id=12, array_task_id=3)
    assert "Job_id=12_3 (15)" in subject(task, frozenset({"END"}))
    whole = subject(task, frozenset({"END", "FAIL"}), {"completed": 3, "failed": 1})
    assert whole.startswith("gpuq Job_id=12_* Name=train Failed, Mixed")
    assert "Reached 80% of time limit" in subject(change(), frozenset({"TIME_LIMIT_80"}))


@pytest.mark.parametrize(
    "name",
    [
        "evil\r\nBcc: victim@example.org",
        "x\nSubject: owned",
        "naïve-模型-🚀",
        "a" * 5000,
        "\x00\x1b[31mred\u2028next",
    ],
)
def test_hostile_names_stay_inside_the_subject(name: str) -> None:
    message = mail_message(change(name=name), frozenset({"END"}), "gpuq@host", "ada")
    raw = message.as_bytes()
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert parsed["Bcc"] is None
    assert parsed.get_all("Subject") is not None and len(parsed.get_all("Subject")) == 1
    assert str(parsed["To"]) == "ada"
    text = str(parsed["Subject"])
    assert "\n" not in text and "\r" not in text
    assert text.startswith("gpuq Job_id=12 Name=")
    assert len(text) < 250
    # every header line of the raw message is a header or a continuation (no injected one)
    head = raw.split(b"\n\n", 1)[0].decode("ascii")
    names = {line.split(":", 1)[0] for line in head.splitlines() if not line[:1].isspace()}
    assert names <= {
        "From",
        "To",
        "Subject",
        "Auto-Submitted",
        "Content-Type",
        "Content-Transfer-Encoding",
        "MIME-Version",
    }


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff(i) for i in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff(10_000) == 60


def test_which_answers_are_retried() -> None:
    assert all(retryable(s) for s in (500, 502, 503, 408, 429))
    assert not any(retryable(s) for s in (400, 401, 403, 404, 301, 302))


@pytest.mark.parametrize(
    ("address", "allow", "ok"),
    [
        ("93.184.216.34", (), True),
        ("2606:2800:220:1:248:1893:25c8:1946", (), True),
        ("127.0.0.1", (), False),
        ("127.0.0.1", ("127.0.0.0/8",), True),
        ("10.1.2.3", (), False),
        ("10.1.2.3", ("10.0.0.0/8",), True),
        ("192.168.0.1", ("10.0.0.0/8",), False),
        ("169.254.169.254", (), False),  # the cloud metadata service
        ("::1", (), False),
        ("::ffff:127.0.0.1", (), False),  # IPv4 in IPv6 clothing
        ("::ffff:127.0.0.1", ("127.0.0.0/8",), True),
        ("fe80::1%eth0", (), False),
        ("224.0.0.1", (), False),
        ("0.0.0.0", (), False),
        ("240.0.0.1", (), False),
        ("100.64.0.1", (), False),  # shared (CGNAT) space
        ("not an address", (), False),
    ],
)
def test_addresses_a_users_webhook_may_reach(
    address: str, allow: tuple[str, ...], ok: bool
) -> None:
    assert address_allowed(address, allow) is ok


def test_urls_are_logged_without_credentials() -> None:
    assert redact("https://u:secret@h.example.org:8443/hook?token=abc#x") == (
        "https://h.example.org:8443/hook"
    )
    assert "secret" not in redact("http://u:secret@[::1]/p")
    assert redact("http://[::1]:99/p") == "http://[::1]:99/p"


def test_time_limit_warnings_only_the_highest_passed_once() -> None:
    wanted = ("TIME_LIMIT_50", "TIME_LIMIT_80", "TIME_LIMIT_90")
    assert due_warnings(wanted, 40, 100, ()) == []
    assert due_warnings(wanted, 55, 100, ()) == ["TIME_LIMIT_50"]
    sent = passed_warnings(85, 100)
    assert due_warnings(wanted, 85, 100, ["TIME_LIMIT_50"]) == ["TIME_LIMIT_80"]
    assert due_warnings(wanted, 86, 100, sent) == []
    assert due_warnings(("TIME_LIMIT_50",), 95, 100, ()) == []  # 90 % passed: 50 is stale


def test_health_changes_compare_two_looks() -> None:
    before = {("a", ""): ("up", "", None), ("a", "GPU-1"): ("ok", "", 0)}
    after = {
        ("a", ""): ("up", "", None),
        ("a", "GPU-1"): ("unhealthy", "unhealthy: lost", 0),
        ("b", ""): ("up", "", None),
    }
    changes = health_changes(before, after, 5.0)
    assert [(c.kind, c.node, c.gpu, c.from_state, c.to_state) for c in changes] == [
        ("gpu", "a", "GPU-1", "ok", "unhealthy"),
        ("node", "b", None, None, "up"),
    ]
    body = json.loads(changes[0].body())
    assert body == {
        "kind": "gpu",
        "node": "a",
        "gpu": "GPU-1",
        "index": 0,
        "from": "ok",
        "to": "unhealthy",
        "reason": "unhealthy: lost",
        "at": 5.0,
    }


def test_webhook_body_fields() -> None:
    body = json.loads(change(array_job_id=12, array_task_id=0).body())
    for key in ("job_id", "array_job_id", "array_task_id", "name", "user", "from_state"):
        assert key in body
    assert body["state"] == "completed" and body["exit_code"] == 0 and body["at"] == 100.0


# ---- submit side ---------------------------------------------------------------------------


def test_submit_options_and_directives(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH --mail-type=END,FAIL\n#SBATCH --mail-user ada@example.org\ntrue\n"
    )
    spec = build_spec(str(script))
    assert spec.mail_types == ("END", "FAIL") and spec.mail_user == "ada@example.org"
    spec = build_spec(str(script), mail_type="all", notify="https://h.example.org/x")
    assert spec.mail_types == ("BEGIN", "END", "FAIL", "REQUEUE", "INVALID_DEPEND", "TIME_LIMIT")
    assert spec.notify_url == "https://h.example.org/x"
    script.write_text("#!/bin/sh\n#GPUQ --notify https://a.example.org/ --mail-type BEGIN\ntrue\n")
    defaults = {"notify": "https://default.example.org/", "mail_type": "END"}
    spec = build_spec(str(script), defaults=defaults)
    assert spec.notify_url == "https://a.example.org/" and spec.mail_types == ("BEGIN",)
    spec = build_spec(wrap="true", defaults=defaults)
    assert spec.notify_url == "https://default.example.org/" and spec.mail_types == ("END",)
    assert build_spec(wrap="true", mail_user="bob").mail_types == ()  # SLURM: nothing mailed


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"mail_type": "bogus"}, "--mail-type"),
        ({"mail_type": ""}, None),
        ({"mail_user": "-oQ/tmp/x"}, "--mail-user"),
        ({"mail_user": "a b@c"}, "--mail-user"),
        ({"notify": "ftp://x"}, "--notify"),
        ({"notify": "http://h/\nx"}, "--notify"),
        ({"notify": "file:///etc/passwd"}, "--notify"),
    ],
)
def test_bad_submit_options(options: dict[str, str], field: str | None) -> None:
    if field is None:
        build_spec(wrap="true", **options)  # empty: not given
        return
    with pytest.raises(InvalidInput) as caught:
        build_spec(wrap="true", **options)
    assert caught.value.field.startswith(field)


def test_a_bad_directive_names_its_line(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --mail-type=sometimes\ntrue\n")
    with pytest.raises(InvalidInput) as caught:
        build_spec(str(script))
    assert "line 2" in caught.value.field


def test_sbatch_mail_directives_are_not_warned() -> None:
    notes: list[str] = []
    Header("#!/bin/sh\n#SBATCH --mail-type=END --mail-user=ada\n", notes)
    assert notes == []


def test_client_defaults_are_checked() -> None:
    assert check_setting("client", "mail_type", "END,FAIL", "test") == "END,FAIL"
    with pytest.raises(ConfigError):
        check_setting("client", "mail_type", "SOMETIMES", "test")
    with pytest.raises(ConfigError):
        check_setting("client", "notify_url", "gopher://x", "test")


def test_one_users_notifications_cannot_crowd_out_everyone_elses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user with thousands of jobs and a dead webhook fills their own share of the
    notifier's room, not everyone's."""
    from types import SimpleNamespace

    from gpuq.coordinator import notifications as notifier_module

    monkeypatch.setattr(notifier_module, "MAX_PENDING", 10)
    monkeypatch.setattr(notifier_module, "MAX_PENDING_PER_USER", 3)
    unused = SimpleNamespace()
    notifier = notifier_module.Notifier(unused, unused, unused, unused, unused, unused)  # type: ignore[arg-type]
    assert [notifier._room(["webhook"], "mallory") for _ in range(5)] == [True] * 3 + [False] * 2
    assert notifier.sent[("webhook", "dropped")] == 2
    assert all(notifier._room(["mail"], "ada") for _ in range(3))
    assert notifier._room(["webhook"])  # an admin's webhook: only the total counts
    notifier._release("mallory")
    assert notifier._room(["webhook"], "mallory")  # room again once one is done
    assert notifier.pending == 7
