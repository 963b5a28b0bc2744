"""The Python client, as README shows it."""

from __future__ import annotations

import gc
import threading

import pytest
from e2e_cluster import Cluster, wait_for

import gpuq
from gpuq.domain.states import JobState


def test_python_client_round_trip(cluster: Cluster) -> None:
    client = cluster.client()
    job_id = client.submit(
        wrap="echo $GPUQ_GPUS gpus",
        gpus=2,
        mem="1G",
        time="5",
        environ=cluster.env,
        chdir=str(cluster.root),
    )
    job = client.wait(job_id, timeout=30)
    assert job.state is JobState.COMPLETED
    assert job.result is not None and job.result.exit_code == 0
    assert client.logs(job_id) == "2 gpus\n"
    assert [j.id for j in client.list(finished=True)] == [job_id]
    assert client.get(job_id).spec.resources.mem == 1 << 30
    with pytest.raises(gpuq.NotFound):
        client.get(987654)
    with pytest.raises(gpuq.InvalidInput, match="--mem"):
        client.submit(wrap="true", mem="lots")
    with pytest.raises(gpuq.Unsatisfiable, match="can never run"):
        client.submit(wrap="true", gpus=64, environ=cluster.env)


def test_array_submission_and_cancel(cluster: Cluster) -> None:
    client = cluster.client()
    array_id = client.submit(
        wrap="echo task $GPUQ_ARRAY_TASK_ID of $GPUQ_ARRAY_JOB_ID",
        array="0-3",
        output="arr-%A_%a.out",
        environ=cluster.env,
        chdir=str(cluster.root),
    )
    client.wait(array_id, timeout=30)
    tasks = client.list_raw(array_job_id=array_id)
    assert [t.array_task_id for t in tasks] == [0, 1, 2, 3]
    for index in range(4):
        text = (cluster.root / f"arr-{array_id}_{index}.out").read_text()
        assert text == f"task {index} of {array_id}\n"
    held = client.submit(wrap="true", array="0-2", hold=True, environ=cluster.env)
    outcomes = client.cancel(f"{held}_1")
    assert [o.job_id for o in outcomes] == [f"{held}_1"]
    assert client.array_states(held) == {"held": 2, "cancelled": 1}
    assert client.get(f"{held}_1").state is JobState.CANCELLED
    assert client.get(f"{held}_2").state is JobState.HELD
    client.cancel(held)
    assert client.array_states(held) == {"cancelled": 3}


def test_submissions_from_threads_sharing_a_client(cluster: Cluster) -> None:
    """Each thread submits over its own stream; an error ends that submission, not the stream."""
    client = cluster.client()
    with pytest.raises(gpuq.Unsatisfiable, match="can never run"):
        client.submit(wrap="true", gpus=64, environ=cluster.env)
    first = client.submit(wrap="true", hold=True, environ=cluster.env)
    ids: list[int] = []

    def submit_five() -> None:
        for _ in range(5):
            ids.append(client.submit(wrap="true", hold=True, environ=cluster.env))

    threads = [threading.Thread(target=submit_five) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 15 and first not in ids
    held = client.list(states=[JobState.HELD])
    assert {j.id for j in held} == {first, *ids}
    client.cancel(first, *ids)


def test_a_thread_that_ends_takes_its_submission_stream_along(cluster: Cluster) -> None:
    client = cluster.client()
    client.submit(wrap="true", hold=True, environ=cluster.env)  # the main thread's stream

    baseline = threading.active_count()  # gRPC runs a thread per open stream to feed it
    threads = [
        threading.Thread(target=client.submit, kwargs={"wrap": "true", "hold": True})
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gc.collect()
    wait_for(
        lambda: threading.active_count() <= baseline, what="the ended threads' streams to close"
    )
    client.cancel(*(str(j.id) for j in client.list(states=[JobState.HELD])))


def test_a_malformed_job_id_raises_invalid_input_and_no_job_is_acted_on(
    lone_coordinator: Cluster,
) -> None:
    """As the CLI refuses it before connecting: the coordinator alone would act on the others
    and answer the bad one with an outcome a caller may never look at."""
    client = lone_coordinator.client()
    held = lone_coordinator.submit("true", hold=True)
    for bad in ([held], "abc", -1, "0", " 1", None, True, 1.0):
        with pytest.raises(gpuq.InvalidInput, match=r"^invalid job id "):
            client.release(held, bad)  # type: ignore[arg-type]
    with pytest.raises(gpuq.InvalidInput, match=r"^invalid job id '4x'"):
        client.update(held, "4x", nice=7)
    job = client.get(held)
    assert job.state == JobState.HELD and job.spec.nice != 7


def test_every_verb_raises_not_found_for_a_job_that_does_not_exist(
    lone_coordinator: Cluster,
) -> None:
    client = lone_coordinator.client()
    verbs = {  # each verb, as a call about one job that does not exist
        "cancel": client.cancel,
        "hold": client.hold,
        "release": client.release,
        "requeue": client.requeue,
        "update": lambda *ids: client.update(*ids, nice=5),
    }
    for act in verbs.values():
        with pytest.raises(gpuq.NotFound, match=r"^no job 99999$"):
            act(99999)
    # the others named are acted on all the same; missing_ok: every outcome, none raised
    held = lone_coordinator.submit("true", hold=True)
    with pytest.raises(gpuq.NotFound, match=r"^no job 99999$"):
        client.update(held, 99999, nice=7)
    assert client.get(held).spec.nice == 7
    outcomes = client.cancel(held, 99999, missing_ok=True)
    assert [(o.job_id, o.done, o.error_kind) for o in outcomes] == [
        ("99999", False, "not_found"),
        (str(held), True, ""),
    ]
