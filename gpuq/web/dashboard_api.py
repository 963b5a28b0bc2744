"""The answers of the dashboard's JSON API, from what QueueAccess gives: the gRPC replies as
proto3 JSON (field names as in the .proto), so the page reads what `gpuq --json` would, and the
few views gRPC has no reply for (a job's chart and output tail, a user's page).

Query parameters are checked here, with the CLI's limits: a bad one is InvalidInput (400).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, TypeVar

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from gpuq.domain.gpu_history import RANGES
from gpuq.domain.limits import MAX_JOB_ID, check_text
from gpuq.errors import InvalidInput, NotFound, PermissionDenied
from gpuq.identity import Caller
from gpuq.output_tail import read_tail
from gpuq.v1 import queue_pb2
from gpuq.web.queue_access import QueueAccess

M = TypeVar("M", bound=Message)
FINISHED_LIMIT, FINISHED_MAX = 50, 500
QUEUE_LIMIT = 200  # entries of the Queue page (it says when more match)
JOB_ID = re.compile(r"([0-9]{1,19})(?:_([0-9]{1,9}))?")  # 12, or an array's task: 12_3


async def jobs(access: QueueAccess, caller: Caller, query: dict[str, str]) -> bytes:
    """The JSON body of a page of jobs (`next_page_token` when more follow) and, of live
    jobs, how many there are in each state (every one, not only this page's: the cluster
    view's summary). Its entries come as texts the coordinator keeps, joined here: printing
    them afresh took 50 ms of the event loop a page of 1,000."""
    request = listing_request(query)
    texts, token = await access.jobs_json(caller, request)
    extra: dict[str, Any] = {"next_page_token": token} if token else {}
    if not request.finished:
        extra["counts"] = access.job_counts()
    tail = "," + json.dumps(extra, separators=(",", ":"))[1:] if extra else "}"
    return ('{"jobs":[' + ",".join(texts) + "]" + tail).encode()


async def job(access: QueueAccess, caller: Caller, job_text: str) -> dict[str, Any]:
    """A job's page: the job, its history and its diagnosis (as `gpuq show` has them)."""
    request = job_request(job_text)
    request.diagnose = True
    detail = await access.job(caller, request)
    return proto_json(lean(detail, detail.job))


async def series(access: QueueAccess, caller: Caller, job_text: str) -> dict[str, Any]:
    points = await access.series(caller, job_request(job_text))
    return {"points": [{"at": p.at, "gpu_mem": p.gpu_mem, "util": p.util} for p in points]}


async def log(
    access: QueueAccess, caller: Caller, job_text: str, query: dict[str, str]
) -> dict[str, Any]:
    """The tail of a job's output file, for its owner or an admin (gpuq.output_tail)."""
    stream = query.get("stream", "stdout")
    if stream not in ("stdout", "stderr"):
        raise InvalidInput("stream", stream, "expected stdout or stderr")
    detail = await access.job(caller, job_request(job_text))
    job = detail.job
    access.check_reads_log(caller, job.user, job.id)
    path = job.stdout_path if stream == "stdout" else job.stderr_path
    if not path:
        raise NotFound(f"job {job.id} has no {stream} file")
    uid = access.user_uid(job.user)
    if uid is None:
        raise PermissionDenied(f"{job.user} has no uid on the coordinator's machine")
    try:
        return await asyncio.to_thread(read_tail, path, uid)
    except NotFound as exc:  # not yet written, or on a node's own disk: not an error
        return {"path": path, "text": "", "size": 0, "truncated": False, "missing": str(exc)}


async def user(access: QueueAccess, caller: Caller, name: str, now: float) -> dict[str, Any]:
    """A user's page: their usage report, fair share, GPUs in use and live jobs (usage null
    where [coordinator] private_data hides it from `caller`)."""
    check_text("user", name, 64)
    report = await access.report(caller, name)
    row = next((r for r in report.rows if r.user == name), None)
    shown = access.sees_usage(caller, name)
    usage, factor = access.fair_share(name, now)
    texts, token = await access.jobs_json(
        caller, queue_pb2.ListJobsRequest(user=name, with_pending_info=True)
    )
    return {
        "user": name,
        "report": proto_json(row) if row is not None else None,
        "fairshare": {"usage": usage, "factor": factor} if shown else None,
        "running_gpus": access.running_gpus(name) if shown else None,
        "jobs": [json.loads(text) for text in texts],
        "more": bool(token),  # a page: `gpuq queue -u NAME` lists them all
    }


def lean(reply: M, *jobs: Any) -> M:
    """`reply` without its jobs' lists of array indices (up to 100,000 each, 700 KB as JSON):
    a page shows an array by its tasks' summary (array_tasks) and counts."""
    for job in jobs:
        if job.spec.HasField("array"):
            job.spec.array.ClearField("indices")
    return reply


def proto_json(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def job_request(job_text: str) -> queue_pb2.GetJobRequest:
    """`12` or `12_3` (an array's task) as a GetJob request; NotFound for anything else."""
    found = JOB_ID.fullmatch(job_text)
    if found is None:
        raise NotFound(f"no job {job_text[:40]}")
    job_id = int(found.group(1))
    if not 1 <= job_id <= MAX_JOB_ID:
        raise NotFound(f"no job {job_id}")
    task = int(found.group(2)) if found.group(2) is not None else None
    return queue_pb2.GetJobRequest(job_id=job_id, task=task)


def listing_request(query: dict[str, str]) -> queue_pb2.ListJobsRequest:
    """`/api/jobs?finished=0|1&user=NAME&state=S&limit=N&page_size=N&page_token=T` as a
    ListJobs request: live jobs (with why each waits) by default, or the last `limit`
    finished ones (FINISHED_LIMIT, at most FINISHED_MAX); a page of them, as ListJobs pages
    (page_size: at most [coordinator] list_page_size; page_token: a reply's next one)."""
    finished = query.get("finished", "0")
    if finished not in ("0", "1", ""):
        raise InvalidInput("finished", finished, "expected 0 or 1")
    user = query.get("user", "")
    check_text("user", user, 64)
    states = [s for s in query.get("state", "").split(",") if s]
    check_text("state", query.get("state", ""), 64)
    request = queue_pb2.ListJobsRequest(
        user=user,
        states=states,
        page_size=_count(query, "page_size"),
        page_token=query.get("page_token", ""),
    )
    limit = _count(query, "limit")
    if finished == "1":
        request.finished = True
        request.limit = min(limit or FINISHED_LIMIT, FINISHED_MAX)
    else:
        request.limit = min(limit, 100_000)
        request.with_pending_info = True
    return request


def _count(query: dict[str, str], name: str) -> int:
    """A count parameter: absent is 0; huge ones are cut (a page at most the largest)."""
    text = query.get(name, "")
    if text and not (text.isascii() and text.isdigit() and len(text) <= 12):
        raise InvalidInput(name, text[:20], "expected a number of jobs")
    return min(int(text or 0), 2**32 - 1)


async def history(access: QueueAccess, caller: Caller, query: dict[str, str]) -> dict[str, Any]:
    """`/api/history?range=6h|24h|7d`: each GPU's heat map row, grouped by node, and each
    user's GPU time over the range (gpuq.coordinator.front.cluster_history). A row's `cells`
    are its held columns only, each `[column, util % (null: unknown), peak memory bytes,
    holder (an index into `holders`; -1: hidden), jobs that held it]`; other columns were free."""
    view = await access.cluster_history(caller, query.get("range", "24h"))
    mapped = view.map
    holders: dict[tuple[str, int], int] = {}
    nodes: dict[str, list[dict[str, Any]]] = {}
    for row in mapped.rows:
        cells = []
        for c in row.cells:
            holder = holders.setdefault((c.user, c.job_id), len(holders)) if c.user else -1
            util = None if c.util is None else round(c.util, 1)
            cells.append([c.column, util, c.peak_mem, holder, c.holders])
        unit = row.unit
        nodes.setdefault(unit.node, []).append(
            {
                "uuid": unit.uuid,
                "index": unit.index,
                "name": unit.name,
                "memory": unit.memory,
                "cells": cells,
            }
        )
    return {
        "range": view.range,
        "ranges": list(RANGES),
        "now": view.now,
        "start": mapped.frame.start,
        "width": mapped.frame.width,
        "columns": mapped.frame.columns,
        "cut": mapped.cut,
        "nodes": [{"name": name, "gpus": gpus} for name, gpus in nodes.items()],
        "holders": [{"user": u, "job_id": j} for u, j in holders],
        "users": [
            {
                "user": u.user,
                "gpu_hours": round(u.gpu_seconds / 3600, 2),
                "running_gpus": u.running_gpus,
                "running_jobs": u.running_jobs,
                "util_mean": None if u.util_mean is None else round(u.util_mean, 1),
            }
            for u in view.users
        ],
    }


async def queue(access: QueueAccess, caller: Caller, query: dict[str, str]) -> bytes:
    """`/api/queue?user=&state=&partition=&name=&limit=`: live jobs in the order the
    scheduler ranks them (gpuq.coordinator.front.ranked_queue), as listing entries, and
    `more` when more than `limit` (QUEUE_LIMIT; at most 1,000) match."""
    words = {key: query.get(key, "") for key in ("user", "state", "partition", "name")}
    limit = _count(query, "limit") or QUEUE_LIMIT
    texts, more = await access.ranked_queue_json(caller, words, limit)
    return ('{"jobs":[' + ",".join(texts) + '],"more":' + json.dumps(more) + "}").encode()
