"""Notifications end to end: a real coordinator and agent (fake GPUs), a fake MTA (a script
that records its arguments and the message) and real HTTP receivers on loopback."""

from __future__ import annotations

import email
import email.policy
import json
import sqlite3
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import Cluster, wait_for

MTA = """#!{python}
import json, sys
data = sys.stdin.buffer.read().decode("utf-8", "replace")
with open({log!r}, "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:], "message": data}}) + "\\n")
"""

# an MTA that fails (exit 75, EX_TEMPFAIL) until the file `gate` exists; every try is logged
FLAKY_MTA = """#!{python}
import json, os, sys
data = sys.stdin.buffer.read().decode("utf-8", "replace")
ok = os.path.exists({gate!r})
with open({log!r}, "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:], "message": data, "ok": ok}}) + "\\n")
if not ok:
    print("mail queue unavailable", file=sys.stderr)
    sys.exit(75)
"""


class Receiver:
    """An HTTP server on `host`:0 that records POSTs; `answers` are the statuses to give, in
    order, then 200."""

    def __init__(self, host: str) -> None:
        self.posts: list[tuple[str, dict[str, str], Any]] = []
        self.answers: list[int] = []
        self.failing = False  # answer 500 to everything while set
        self.statuses: list[int] = []  # given to each of `posts`
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                with owner.lock:
                    owner.posts.append((self.path, dict(self.headers), body))
                    status = owner.answers.pop(0) if owner.answers else 200
                    status = 500 if owner.failing else status
                    owner.statuses.append(status)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def received(self, path: str) -> list[Any]:
        with self.lock:
            return [body for p, _, body in self.posts if p.split("?")[0] == path]

    def delivered(self, path: str) -> list[Any]:
        """The bodies of POSTs to `path` that were answered 2xx."""
        with self.lock:
            return [
                body
                for (p, _, body), status in zip(self.posts, self.statuses, strict=True)
                if p.split("?")[0] == path and 200 <= status < 300
            ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Receiver, Path]]:
    root = tmp_path_factory.mktemp("notify")
    receiver = Receiver("127.0.0.1")
    mail_log = root / "mail.jsonl"
    mta = root / "fake-sendmail"
    mta.write_text(MTA.format(python=sys.executable, log=str(mail_log)))
    mta.chmod(0o755)
    cluster = Cluster(
        root / "cluster",
        f'mail_program = "{mta}"\n'
        'mail_from = "gpuq@cluster.example.org"\n'
        'notify_allow = ["127.0.0.1/32"]\n'
        "notify_retries = 3\n"
        f'admin_webhooks = ["{receiver.url}/admin"]\n',
    )
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "2xH100-80GB")
        yield cluster, receiver, mail_log
    finally:
        cluster.close()
        receiver.close()


def mails(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_a_failed_job_mails_once_and_its_webhook_is_retried(
    setup: tuple[Cluster, Receiver, Path],
) -> None:
    cluster, receiver, mail_log = setup
    receiver.answers = [500]  # the first POST fails: it must come again
    job = cluster.submit(
        "exit 3",
        name="train:bad",
        mail_type="END,FAIL",
        mail_user="ada@example.org",
        notify=f"{receiver.url}/job?token=s3cret",
    )
    cluster.wait_state(job, "failed")
    [mail] = wait_for(lambda: mails(mail_log), 20, "the mail")
    assert mail["argv"] == ["-oi", "--", "ada@example.org"]
    message = email.message_from_string(mail["message"], policy=email.policy.default)
    assert str(message["To"]) == "ada@example.org"
    assert str(message["From"]) == "gpuq@cluster.example.org"
    assert message.get_all("Subject") is not None and len(message.get_all("Subject")) == 1
    text = str(message["Subject"])
    assert text.startswith(f"gpuq Job_id={job} Name=train:bad Failed")
    assert "FAILED, ExitCode 3" in text

    def ended() -> list[Any]:
        return [b for b in receiver.received("/job") if b["state"] == "failed"]

    final = wait_for(ended, 20, "the failed state's webhook")
    assert final[-1]["exit_code"] == 3 and final[-1]["job_id"] == job
    # three state changes, and one POST answered 500 that came again (about 1 s later)
    wait_for(lambda: len(receiver.received("/job")) == 4, 20, "the retried POST")
    states = sorted(b["state"] for b in receiver.received("/job"))
    assert set(states) == {"pending", "running", "failed"} and len(states) == 4
    headers = [h for p, h, _ in receiver.posts if p.startswith("/job")]
    assert all(h["Content-Type"] == "application/json" for h in headers)
    assert all(h["User-Agent"].startswith("gpuq/") for h in headers)
    assert len(mails(mail_log)) == 1  # BEGIN was not asked for
    log = (cluster.root / "coordinator.log").read_text()
    assert "s3cret" not in log


def test_a_webhook_to_a_loopback_address_not_allowed_is_refused(
    setup: tuple[Cluster, Receiver, Path],
) -> None:
    cluster, _, _ = setup
    other = Receiver("127.0.0.2")  # loopback, but not in notify_allow
    try:
        job = cluster.submit("true", notify=f"{other.url}/hook")
        cluster.wait_state(job, "completed")
        log = cluster.root / "coordinator.log"
        wait_for(
            lambda: (
                "refused" in log.read_text() and f"127.0.0.2:{other.port}/hook" in log.read_text()
            ),
            20,
            "the refusal to be logged",
        )
        assert other.posts == []
    finally:
        other.close()


def test_an_admin_webhook_hears_of_a_lost_gpu(setup: tuple[Cluster, Receiver, Path]) -> None:
    cluster, receiver, _ = setup
    (node,) = [n for n in cluster.client().nodes() if n.name == "a"]
    uuid = sorted(node.gpus, key=lambda g: g.index)[1].uuid
    fake = cluster.home / "agent" / "a" / "fake-gpus" / uuid
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "lost").touch()

    def told() -> list[Any]:
        return [
            b
            for b in receiver.received("/admin")
            if b["kind"] == "gpu" and b["gpu"] == uuid and b["to"] == "unhealthy"
        ]

    [body] = wait_for(told, 30, "the admin webhook of the lost GPU")
    assert body["node"] == "a" and body["from"] == "ok" and body["index"] == 1
    assert body["reason"]


def test_bad_notify_options_exit_2_and_queue_nothing(
    setup: tuple[Cluster, Receiver, Path],
) -> None:
    cluster, receiver, _ = setup
    before = len(cluster.client().list())
    for flags in (["--mail-type", "bogus"], ["--notify", "ftp://x"]):
        done = cluster.gpuq("submit", *flags, "--wrap", "true")
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("gpuq: error: invalid " + flags[0])
    assert len(cluster.client().list()) == before
    # the owner sees the settings in gpuq show
    job = cluster.submit("true", mail_type="END", notify=f"{receiver.url}/show")
    shown = cluster.gpuq("show", str(job))
    assert "END to " in shown.stdout and f"{receiver.url}/show" in shown.stdout


def test_a_users_own_defaults_come_from_the_environment(
    setup: tuple[Cluster, Receiver, Path],
) -> None:
    cluster, receiver, _ = setup
    cluster.env["GPUQ_NOTIFY"] = f"{receiver.url}/mine"
    cluster.env["GPUQ_MAIL_TYPE"] = "fail"
    try:
        done = cluster.gpuq("submit", "--parsable", "--hold", "--wrap", "true")
        assert done.returncode == 0, done.stderr
        spec = cluster.client().get(int(done.stdout.strip())).spec
        assert (spec.notify_url, spec.mail_types) == (f"{receiver.url}/mine", ("FAIL",))
        # the command line wins over the environment
        done = cluster.gpuq(
            "submit", "--parsable", "--hold", "--mail-type", "END", "--wrap", "true"
        )
        spec = cluster.client().get(int(done.stdout.strip())).spec
        assert spec.mail_types == ("END",)
        cluster.env["GPUQ_NOTIFY"] = "ftp://nope"
        done = cluster.gpuq("submit", "--hold", "--wrap", "true")
        assert done.returncode == 2 and "--notify" in done.stderr
    finally:
        del cluster.env["GPUQ_NOTIFY"], cluster.env["GPUQ_MAIL_TYPE"]


def outbox(cluster: Cluster) -> int:
    """Rows in the coordinator's notifications outbox."""
    with sqlite3.connect(cluster.home / "gpuq.db") as db:
        return int(db.execute("SELECT count(*) FROM notifications").fetchone()[0])


def test_a_webhook_and_a_mail_retrying_survive_a_killed_coordinator(tmp_path: Path) -> None:
    receiver = Receiver("127.0.0.1")
    receiver.failing = True
    gate = tmp_path / "mta-works"
    mail_log = tmp_path / "mail.jsonl"
    mta = tmp_path / "flaky-sendmail"
    mta.write_text(FLAKY_MTA.format(python=sys.executable, log=str(mail_log), gate=str(gate)))
    mta.chmod(0o755)
    cluster = Cluster(
        tmp_path / "cluster",
        f'mail_program = "{mta}"\n'
        'notify_allow = ["127.0.0.1/32"]\n'
        "notify_retries = 20\n",  # backing off 1, 2, 4... s: still retrying when killed
    )
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "1xH100-80GB")
        job = cluster.submit(
            "true", mail_type="END", mail_user="ada@example.org", notify=f"{receiver.url}/crash"
        )
        cluster.wait_state(job, "completed")

        def tried(state: str) -> int:
            return sum(1 for b in receiver.received("/crash") if b["state"] == state)

        # every delivery failed at least twice (so the outbox holds attempts) before the kill
        wait_for(lambda: tried("completed") >= 2, 30, "the end's webhook to fail twice")
        wait_for(lambda: len(mails(mail_log)) >= 2, 30, "the mail to fail twice")
        assert outbox(cluster) == 4  # three state changes' webhooks and the END mail
        cluster.kill(cluster.coordinator)
        assert receiver.delivered("/crash") == [] and not any(m["ok"] for m in mails(mail_log))
        receiver.failing = False
        gate.touch()
        cluster.start_coordinator()

        def delivered() -> bool:
            states = sorted(b["state"] for b in receiver.delivered("/crash"))
            mailed = [m for m in mails(mail_log) if m["ok"]]
            return states == ["completed", "pending", "running"] and len(mailed) == 1

        wait_for(delivered, 60, "the webhooks and the mail after the restart")
        # nothing left to send: no second copy can come
        wait_for(lambda: outbox(cluster) == 0, 30, "the outbox to be emptied")
        states = sorted(b["state"] for b in receiver.delivered("/crash"))
        assert states == ["completed", "pending", "running"]
        [mail] = [m for m in mails(mail_log) if m["ok"]]
        assert mail["argv"] == ["-oi", "--", "ada@example.org"]
        message = email.message_from_string(mail["message"], policy=email.policy.default)
        assert str(message["Subject"]).startswith(f"gpuq Job_id={job} ")
        assert all(b["job_id"] == job for b in receiver.delivered("/crash"))
        log = (cluster.root / "coordinator.log").read_text()
        assert "resumed from the outbox" in log
    finally:
        cluster.close()
        receiver.close()
