"""`gpuq cron`: entries survive restarts, and fires missed while the coordinator was down are
made up once."""

from __future__ import annotations

import json
import sqlite3
import time

from e2e_cluster import Cluster, wait_for


def test_cron_entries_persist_and_missed_fires_run_once(cluster: Cluster) -> None:
    marker = cluster.root / "cron.log"
    script = cluster.root / "nightly.sh"
    script.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
    added = cluster.gpuq(
        "cron", "add", "0 3 * * *", "--gpus", "1", "--name", "nightly", str(script)
    )
    assert added.returncode == 0, added.stderr
    entry_id = int(added.stdout.split()[3].rstrip(":"))
    listed = json.loads(cluster.gpuq("cron", "list", "--json").stdout)
    assert [(e["id"], e["schedule"], e["name"]) for e in listed] == [
        (entry_id, "0 3 * * *", "nightly")
    ]
    assert listed[0]["next_run"] > time.time()
    bad = cluster.gpuq("cron", "add", "0 25 * * *", "--wrap", "true")
    assert bad.returncode == 2 and "invalid schedule" in bad.stderr
    never = cluster.gpuq("cron", "add", "0 0 31 2 *", "--wrap", "true")  # February 31st
    assert never.returncode == 2 and "never fires" in never.stderr, never
    for entry in ("0", "99999999999999999999999"):
        gone = cluster.gpuq("cron", "remove", entry)
        assert gone.returncode == 2 and "Traceback" not in gone.stderr, gone

    # the coordinator is down for three days: three 03:00 fires are missed
    cluster.kill(cluster.coordinator)
    with sqlite3.connect(cluster.home / "gpuq.db") as db:
        db.execute("UPDATE cron_entries SET last_fire = ?", (time.time() - 3 * 86400,))
    cluster.start_coordinator()
    wait_for(lambda: marker.exists(), what="the make-up run's output")
    # start-up makes up every entry before it schedules anything: every make-up job exists by
    # now. Once none is live (two listings of a job that ends between them would see it in
    # neither), the finished ones are all of them.
    wait_for(
        lambda: not [j for j in cluster.client().list() if j.name == "nightly"],
        what="the make-up run to end",
    )
    jobs = [j for j in cluster.client().list(finished=True) if j.name == "nightly"]
    assert len(jobs) == 1, "missed fires are made up once, not three times"
    assert marker.read_text() == "ran\n"

    removed = cluster.gpuq("cron", "remove", str(entry_id))
    assert removed.returncode == 0
    assert json.loads(cluster.gpuq("cron", "list", "--json").stdout) == []
    gone = cluster.gpuq("cron", "remove", str(entry_id))
    assert gone.returncode == 2 and f"no cron entry {entry_id}" in gone.stderr
