"""The web dashboard's server side (issue 14), with real processes and real HTTP: a root
coordinator with [coordinator] web_listen, an agent with fake GPUs, throwaway Unix users who
sign in with `gpuq web`'s one-time link or a per-user token. No browser: the frontend's own
tests drive one.

Users see what `gpuq` shows them and act on their own jobs only; a job's output is read only
as a regular file of its own user; changes need the dashboard's header; live events arrive
over server-sent events. Off by default; a public address needs TLS.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import unix_users
from e2e_cluster import Cluster, free_port, wait_for
from unix_users import UnixUser, run_as

from gpuq.cli.certs import Made, make_certificates
from gpuq.errors import Unsatisfiable

pytestmark = pytest.mark.timeout(180)
user_homes = unix_users.user_homes
shared_root = unix_users.shared_root
users = unix_users.two_users
CSRF = {"X-Gpuq": "1"}


class Web:
    """A client of the dashboard: one connection per request, a cookie it keeps."""

    def __init__(self, address: str, context: ssl.SSLContext | None = None) -> None:
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.context = context
        self.cookie: str | None = None

    def connect(self, timeout: float = 10.0) -> http.client.HTTPConnection:
        if self.context is not None:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self.context
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        conn = self.connect()
        sent = dict(headers or {})
        if self.cookie is not None:
            sent["Cookie"] = f"gpuq_session={self.cookie}"
        data = json.dumps(body).encode() if body is not None else None
        if data is not None:
            sent["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=sent)
            response = conn.getresponse()
            raw = response.read()
            got = {k.lower(): v for k, v in response.getheaders()}
            cookies = [v for k, v in response.getheaders() if k.lower() == "set-cookie"]
        finally:
            conn.close()
        for cookie in cookies:
            found = re.match(r"gpuq_session=([^;]*)", cookie)
            if found:
                got["set-cookie"] = cookie
                self.cookie = found.group(1) or None
        if got.get("content-type", "").startswith("application/json"):
            return response.status, got, json.loads(raw)
        return response.status, got, raw

    def login(self, **body: str) -> dict[str, Any]:
        status, _, answer = self.call("POST", "/api/login", body, CSRF)
        assert status == 200, (status, answer)
        assert self.cookie
        return dict(answer)


def web_address(cluster: Cluster) -> str:
    return str(json.loads((cluster.home / "coordinator.json").read_text())["web"])


def ticket_of(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    assert parts.path == "/login" and not parts.query, url
    key, _, ticket = parts.fragment.partition("=")
    assert key == "ticket" and ticket, url
    return ticket


def gpuq_as(user: UnixUser, home: Path, *args: str) -> tuple[int, str, str]:
    result = run_as(user, ["-m", "gpuq.cli.main", "--home", str(home), *args])
    return result.returncode, result.stdout, result.stderr


def signed_in(cluster: Cluster, user: UnixUser) -> Web:
    code, out, err = gpuq_as(user, cluster.home, "web")
    assert code == 0, err
    web = Web(web_address(cluster))
    assert web.login(ticket=ticket_of(out.strip())) == {"user": user.name, "admin": False}
    return web


def submit_as(user: UnixUser, home: Path, *args: str) -> str:
    code, out, err = gpuq_as(user, home, "submit", "--parsable", *args)
    assert code == 0, err
    return out.strip()


def test_dashboard_for_two_users(shared_root: Path, users: tuple[UnixUser, UnixUser]) -> None:
    alice, bob = users
    cluster = Cluster(shared_root, 'web_listen = "127.0.0.1:0"\n')
    try:
        cluster.start_coordinator()
        cluster.start_agent("n1", "2xA100-80GB")
        address = web_address(cluster)
        anonymous = Web(address)

        # ---- signing in ------------------------------------------------------------------
        status, headers, answer = anonymous.call("GET", "/api/me")
        assert status == 401 and "error" in answer
        assert headers["cache-control"] == "no-store"
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        code, out, err = gpuq_as(alice, cluster.home, "web")
        assert code == 0, err
        url = out.strip()
        assert url.startswith(f"http://{address}/login#ticket="), url
        ticket = ticket_of(url)
        label, payload, mac = ticket.split(".")
        tampered = f"{label}.{payload}.{'0' * len(mac)}"
        status, _, answer = anonymous.call("POST", "/api/login", {"ticket": tampered}, CSRF)
        assert status == 401 and anonymous.cookie is None, answer
        # malformed bodies: one clear 400 each, nothing logged as an internal error
        host, _, port = address.rpartition(":")
        for raw in (b"[" * 30_000, b"\xff\xfe", b"null", b'{"ticket": 5}'):
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.request("POST", "/api/login", body=raw, headers=CSRF)
            reply = conn.getresponse()
            assert reply.status == 400, (raw[:10], reply.read())
            conn.close()
        # a sign-in is a change: it needs the dashboard's header
        status, _, answer = anonymous.call("POST", "/api/login", {"ticket": ticket})
        assert status == 403 and "X-Gpuq" in answer["error"]
        web_alice = Web(address)
        assert web_alice.login(ticket=ticket) == {"user": alice.name, "admin": False}
        cookie = web_alice.call("GET", "/api/me")[1]
        status, _, answer = Web(address).call("POST", "/api/login", {"ticket": ticket}, CSRF)
        assert status == 401 and "used already" in answer["error"]
        status, _, answer = web_alice.call("GET", "/api/me")
        assert (status, answer) == (200, {"user": alice.name, "admin": False}), cookie
        web_bob = signed_in(cluster, bob)

        # ---- pages and static files ------------------------------------------------------
        for page in ("/", "/jobs/12", "/users/x", "/login"):
            status, headers, _ = anonymous.call("GET", page)
            assert status == 200 and headers["content-type"].startswith("text/html"), page
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "no-referrer"
        names = os.listdir(Path(__file__).parents[2] / "gpuq" / "web" / "static")
        for name in names:
            status, headers, _ = anonymous.call("GET", f"/static/{name}")
            assert status == 200 and headers.get("etag"), name
            status, _, _ = anonymous.call(
                "GET", f"/static/{name}", headers={"If-None-Match": headers["etag"]}
            )
            assert status == 304
        for bad in (
            "/static/../server.py",
            "/static/%2e%2e/app.py",
            "/static/%2e%2e",
            "/static/..%2fapp.py",
            "/static/.",
            "/static/",
            "/nothing",
            "/api/nothing",
        ):
            status, _, _ = web_alice.call("GET", bad)
            assert status == 404, bad
        assert anonymous.call("POST", "/")[0] == 405

        # ---- the API: what gpuq shows ----------------------------------------------------
        status, _, nodes = web_alice.call("GET", "/api/nodes")
        assert status == 200 and [n["name"] for n in nodes["nodes"]] == ["n1"]
        secrets = ("--env", "TOKEN=s3cret", "--notify", "https://hooks.example.org/h0okkey")
        held = submit_as(
            alice,
            cluster.home,
            "--hold",
            *secrets,
            "--mail-user",
            "m4il@example.org",
            "--mail-type",
            "END",
            "--wrap",
            "echo hi",
        )
        status, _, jobs = web_bob.call("GET", "/api/jobs")
        assert status == 200 and [j["id"] for j in jobs["jobs"]] == [held]
        hidden = ("s3cret", "h0okkey", "m4il@")
        assert not any(secret in json.dumps(jobs) for secret in hidden)
        status, _, detail = web_bob.call("GET", f"/api/jobs/{held}")
        assert status == 200 and detail["job"]["user"] == alice.name
        assert not any(secret in json.dumps(detail) for secret in hidden)
        status, _, detail = web_alice.call("GET", f"/api/jobs/{held}")
        assert all(secret in json.dumps(detail) for secret in hidden) and detail["events"]
        assert web_alice.call("GET", "/api/jobs/999999")[0] == 404

        # ---- changes: own jobs only, with the header, from this site ---------------------
        status, _, answer = web_bob.call("POST", f"/api/jobs/{held}/cancel", None, CSRF)
        assert status == 403 and f"belongs to {alice.name}" in answer["error"], answer
        status, _, answer = web_alice.call("POST", f"/api/jobs/{held}/release")
        assert status == 403
        evil = {**CSRF, "Origin": "http://evil.example"}
        status, _, answer = web_alice.call("POST", f"/api/jobs/{held}/cancel", None, evil)
        assert status == 403 and "Origin" in answer["error"]
        assert cluster.job(int(held)).state.value == "held"
        same = {**CSRF, "Origin": f"http://{address}"}
        status, _, answer = web_alice.call("POST", f"/api/jobs/{held}/cancel", None, same)
        assert status == 200 and answer["outcomes"][0]["done"], answer
        assert cluster.job(int(held)).state.value == "cancelled"

        # ---- output files: the owner's own regular files only ----------------------------
        done = submit_as(alice, cluster.home, "--wrap", "echo hello-from-alice; echo oops >&2")
        cluster.wait_state(int(done), "completed")
        status, _, answer = web_alice.call("GET", f"/api/jobs/{done}/log")
        assert status == 200, answer
        # stderr goes to the stdout file unless --error says otherwise (as sbatch)
        assert answer["text"] == "hello-from-alice\noops\n" and answer["size"] == 22
        assert not answer["truncated"] and answer["path"].startswith(str(alice.home))
        status, _, answer = web_alice.call("GET", f"/api/jobs/{done}/log?stream=stderr")
        assert status == 200 and "oops" in answer["text"]
        status, _, answer = web_bob.call("GET", f"/api/jobs/{done}/log")
        assert status == 403, answer
        link = alice.home / "shadow.out"
        os.symlink("/etc/shadow", link)  # as alice could: her home, her link
        os.lchown(link, alice.uid, alice.gid)
        linked = submit_as(alice, cluster.home, "--hold", "-o", str(link), "--wrap", "true")
        status, _, answer = web_alice.call("GET", f"/api/jobs/{linked}/log")
        assert status == 403 and "not readable from the coordinator" in answer["error"]
        rooted = submit_as(alice, cluster.home, "--hold", "-o", "/etc/shadow", "--wrap", "true")
        status, _, answer = web_alice.call("GET", f"/api/jobs/{rooted}/log")
        assert status == 403 and "root:" not in json.dumps(answer)
        fifo = alice.home / "fifo.out"
        os.mkfifo(fifo)
        os.chown(fifo, alice.uid, alice.gid)
        piped = submit_as(alice, cluster.home, "--hold", "-o", str(fifo), "--wrap", "true")
        status, _, answer = web_alice.call("GET", f"/api/jobs/{piped}/log")
        assert status == 403  # not a regular file: refused at once, never a hang

        # ---- series and users ------------------------------------------------------------
        status, _, answer = web_bob.call("GET", f"/api/jobs/{done}/series")
        assert status == 200 and isinstance(answer["points"], list)
        status, _, answer = web_bob.call("GET", f"/api/users/{alice.name}")
        assert status == 200 and answer["user"] == alice.name
        assert int(answer["report"]["jobs"]) >= 1 and answer["fairshare"]["factor"] > 0
        assert {j["id"] for j in answer["jobs"]} == {linked, rooted, piped}
        status, _, answer = web_bob.call("GET", "/api/jobs?finished=1&limit=1")
        assert status == 200 and [j["id"] for j in answer["jobs"]] == [done]

        # ---- live events ---------------------------------------------------------------
        conn = web_alice.connect(timeout=20)
        conn.request("GET", "/api/events", headers={"Cookie": f"gpuq_session={web_alice.cookie}"})
        stream = conn.getresponse()
        assert stream.status == 200
        assert stream.getheader("content-type", "").startswith("text/event-stream")
        assert stream.readline() == b"retry: 2000\n"
        running = submit_as(alice, cluster.home, "--wrap", "sleep 1")
        deadline = time.monotonic() + 30
        states: list[str] = []
        event = ""
        while "completed" not in states:
            assert time.monotonic() < deadline, states
            line = stream.readline().decode()
            if line.startswith("event: "):
                event = line[7:].strip()
            elif line.startswith("data: ") and event == "jobs":
                for item in json.loads(line[6:])["events"]:
                    if item["job_id"] == running:
                        states.append(item.get("to_state", ""))
        conn.close()
        status, _, answer = web_alice.call("GET", f"/api/jobs/{running}/series")
        assert status == 200

        # a running job's chart has points seconds after it starts (not yet stored)
        busy = submit_as(alice, cluster.home, "--gpus", "1", "--wrap", "sleep 60")
        cluster.wait_state(int(busy), "running")

        def points() -> list[Any]:
            status, _, answer = web_bob.call("GET", f"/api/jobs/{busy}/series")
            assert status == 200, answer
            return list(answer["points"])

        first = wait_for(points, 15, "a running job's series points")
        assert {"at", "gpu_mem"} <= set(first[0]), first
        status, _, answer = web_alice.call("POST", f"/api/jobs/{busy}/cancel", None, CSRF)
        assert status == 200 and answer["outcomes"][0]["done"], answer

        # ---- tokens; sign-out -----------------------------------------------------------
        token = cluster.client().issue_token(bob.name)
        by_token = Web(address)
        assert by_token.login(token=token) == {"user": bob.name, "admin": False}
        assert by_token.call("GET", "/api/me")[0] == 200
        cluster.client().revoke_tokens(bob.name)
        status, _, answer = by_token.call("GET", "/api/me")
        assert status == 401 and "revoked" in answer["error"]
        assert web_bob.call("GET", "/api/me")[0] == 200  # the ticket's session stands
        kept = web_bob.cookie
        status, headers, _ = web_bob.call("POST", "/api/logout", None, CSRF)
        assert status == 200 and "Max-Age=0" in headers["set-cookie"]
        web_bob.cookie = kept  # a copy of the cookie is refused too
        assert web_bob.call("GET", "/api/me")[0] == 401
    finally:
        cluster.close()


def test_dashboard_is_off_by_default(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_coordinator()
        assert "web" not in json.loads((cluster.home / "coordinator.json").read_text())
        with pytest.raises(Unsatisfiable, match="web_listen"):
            cluster.client().web_login()
        result = cluster.gpuq("web")
        assert result.returncode == 2 and "web_listen" in result.stderr, result.stderr
    finally:
        cluster.close()


def test_the_log_says_where_the_dashboard_is_and_how_to_sign_in(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 'web_listen = "127.0.0.1:0"\n')
    try:
        cluster.start_coordinator()
        url = f"http://{web_address(cluster)}"
        said = f"web dashboard at {url}: users sign in with the one-time link `gpuq web`"
        wait_for(lambda: said in (tmp_path / "coordinator.log").read_text(), what="the line")
        assert cluster.gpuq("web").stdout.startswith(f"{url}/login#ticket=")
    finally:
        cluster.close()


def test_public_dashboard_needs_tls(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, f'web_listen = "0.0.0.0:{free_port()}"\n')
    try:
        result = cluster.gpuq("coordinator", timeout=60)
        assert result.returncode == 2, (result.returncode, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "refusing to listen on 0.0.0.0:" in lines[0], lines
        assert not (cluster.home / "coordinator.json").exists()
    finally:
        cluster.close()


def test_dashboard_over_https(tmp_path: Path) -> None:
    made: Made = make_certificates(tmp_path / "tls", ["127.0.0.1", "localhost"], [])
    assert made.coordinator is not None
    cert, key = made.coordinator
    config = f'tls_cert = "{cert}"\ntls_key = "{key}"\nweb_listen = "127.0.0.1:0"\n'
    cluster = Cluster(tmp_path / "c", config)
    try:
        cluster.start_coordinator()
        reply = cluster.client().web_login()
        assert reply.url.startswith("https://127.0.0.1:") and reply.expires > time.time()
        context = ssl.create_default_context(cafile=str(made.ca_cert))
        web = Web(web_address(cluster), context)
        status, headers, answer = web.call(
            "POST", "/api/login", {"ticket": ticket_of(reply.url)}, CSRF
        )
        assert status == 200 and answer["admin"], answer
        assert "Secure" in headers["set-cookie"].split("; ")
        assert web.call("GET", "/api/nodes")[0] == 200
        # plaintext on the TLS port is no way in
        plain = Web(web_address(cluster))
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.call("GET", "/api/me")
    finally:
        cluster.close()


@pytest.mark.parametrize("stop", ["terminate", "kill"])
def test_sign_outs_and_used_tickets_outlive_a_coordinator_restart(
    tmp_path: Path, stop: str
) -> None:
    """The job store keeps used tickets and ended sessions: a restarted coordinator (the same
    auth.key) refuses a signed-out cookie and a used ticket within its 60 s, and takes a
    session that still stands."""
    cluster = Cluster(tmp_path, f'web_listen = "127.0.0.1:{free_port()}"\n')
    try:
        cluster.start_coordinator()
        used = ticket_of(cluster.client().web_login().url)
        web = Web(web_address(cluster))
        web.login(ticket=used)
        signed_out = web.cookie
        assert web.call("POST", "/api/logout", None, CSRF)[0] == 200
        standing = Web(web_address(cluster))
        standing.login(ticket=ticket_of(cluster.client().web_login().url))
        assert cluster.coordinator is not None
        if stop == "kill":
            cluster.kill(cluster.coordinator)
        else:
            cluster.coordinator.terminate()
            cluster.coordinator.wait(10)
        cluster.start_coordinator()
        address = web_address(cluster)
        stale = Web(address)
        stale.cookie = signed_out
        status, _, answer = stale.call("GET", "/api/me")
        assert status == 401 and "signed out" in answer["error"], answer
        status, _, answer = Web(address).call("POST", "/api/login", {"ticket": used}, CSRF)
        assert status == 401 and "used already" in answer["error"], answer
        again = Web(address)
        again.cookie = standing.cookie
        assert again.call("GET", "/api/me")[0] == 200
    finally:
        cluster.close()
