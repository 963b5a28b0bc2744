"""A job's diagnosis through the assembled coordinator's front door, in process on a real store
(SQLite and PostgreSQL): the evidence an agent sends with an end is kept and read on demand,
the owner and admins get the verdicts read from the output, another user only those of the
structured evidence (never output text), signatures an admin adds apply to jobs that ended
before, and a bad signatures file stops the coordinator at start with one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import FakeAgent, InProcessClient, run

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.domain.states import JobState
from gpuq.errors import ConfigError
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import queue_pb2
from gpuq.v1 import types_pb2 as pb

LOGS = Path(__file__).resolve().parents[1] / "unit" / "diagnosis_logs"
OOM = (LOGS / "torch_oom_fragmented.log").read_bytes()


def ended_with_output(agent: FakeAgent, job_id: int, output: bytes, peak: int = 0) -> None:
    """The job's processes are gone (exit code 1), reported with its output's tail."""
    launch = agent.running.pop(job_id)
    report = apb.JobReport(
        job_id=job_id,
        kind=apb.JobReport.ENDED,
        end_state=JobState.FAILED.value,
        result=pb.JobResult(exit_code=1, reason="exit code 1"),
        at=agent.co.clock(),
        attempt=launch.attempt,
        peak_mem=peak,
        output_tail=output,
    )
    agent.co.link.reports(agent.node, [report])


async def diagnosis(
    co: Coordinator, job_id: int, name: str, admin: bool = False
) -> queue_pb2.Diagnosis:
    caller = InProcessClient(co, name, admin=admin).caller
    request = queue_pb2.GetJobRequest(job_id=job_id, diagnose=True)
    return (await co.queries.get_job(caller, request)).diagnosis


async def failed_job(co: Coordinator, output: bytes) -> int:
    agent = await FakeAgent(co, "a", "2xA100-80GB").connect()
    alice = InProcessClient(co, "alice")
    job_id = await alice.submit("python train.py", gpus=1)
    await agent.started(job_id)
    ended_with_output(agent, job_id, output)
    await alice.wait_state(job_id, "failed")
    return job_id


def test_the_owner_and_admins_get_the_output_verdicts_and_others_the_structured_only(
    store: Store,
) -> None:
    async def body(co: Coordinator) -> None:
        job_id = await failed_job(co, OOM)
        owner = await diagnosis(co, job_id, "alice")
        assert [v.name for v in owner.verdicts] == ["cuda-oom", "python-traceback", "exit-code"]
        assert "expandable_segments:True" in owner.verdicts[0].advice
        assert owner.note == ""
        admin = await diagnosis(co, job_id, "root", admin=True)
        assert admin.verdicts[0].name == "cuda-oom"
        other = await diagnosis(co, job_id, "mallory")
        assert [v.name for v in other.verdicts] == ["exit-code"]
        assert "private" in other.note
        assert "CUDA" not in str(other) and "train.py" not in str(other)
        # asked without diagnose, GetJob carries none (listings and polls pay nothing)
        plain = await co.queries.get_job(
            InProcessClient(co, "alice").caller, queue_pb2.GetJobRequest(job_id=job_id)
        )
        assert not plain.HasField("diagnosis")

    run(store, body)


def test_a_failed_job_without_output_says_none_was_kept(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        job_id = await failed_job(co, b"")
        found = await diagnosis(co, job_id, "alice")
        assert [v.name for v in found.verdicts] == ["exit-code"]
        assert "no output was kept" in found.note

    run(store, body)


def test_signatures_an_admin_adds_apply_to_jobs_that_ended_before(
    store: Store, tmp_path: Path
) -> None:
    output = b"step 10\nLustreError: scratch: client was evicted by the MDS\n"

    ended: list[int] = []

    async def first(co: Coordinator) -> None:
        ended.append(await failed_job(co, output))
        assert (await diagnosis(co, ended[0], "alice")).verdicts[0].name == "exit-code"

    run(store, first)
    site = tmp_path / "site.toml"
    site.write_text(
        '[[signature]]\nname = "lustre-evicted"\npattern = "client was evicted"\n'
        'meaning = "its scratch mount evicted the node"\nadvice = "submit it again"\n'
        "weight = 92\n"
    )

    async def later(co: Coordinator) -> None:
        found = await diagnosis(co, ended[0], "alice")
        assert found.verdicts[0].name == "lustre-evicted"
        assert found.verdicts[0].evidence[0] == (
            "output: LustreError: scratch: client was evicted by the MDS"
        )

    run(store, later, CoordinatorSettings(diagnosis_signatures=str(site)))


def test_a_bad_signatures_file_stops_the_coordinator_at_start(store: Store, tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text(
        '[[signature]]\nname = "x"\npattern = "[unclosed"\nmeaning = "m"\nadvice = "a"\n'
    )
    with pytest.raises(ConfigError, match=r"site\.toml: signature 1: pattern"):
        assemble(store, CoordinatorSettings(diagnosis_signatures=str(site)))


def test_a_host_oom_shows_the_peak_its_node_measured_against_the_limit(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "2xA100-80GB").connect()
        alice = InProcessClient(co, "alice")
        job_id = await alice.submit("python load.py", mem="1G")
        launch = await agent.started(job_id)
        del agent.running[job_id]
        report = apb.JobReport(
            job_id=job_id,
            kind=apb.JobReport.ENDED,
            end_state=JobState.OUT_OF_MEMORY.value,
            result=pb.JobResult(signal=9, reason="exceeded --mem 1G"),
            at=co.clock(),
            attempt=launch.attempt,
            peak_mem=1023 << 20,
        )
        co.link.reports("a", [report])
        await alice.wait_state(job_id, "out_of_memory")
        [verdict, *_] = (await diagnosis(co, job_id, "mallory")).verdicts
        assert verdict.name == "host-oom"
        assert "peak host memory 1023M of --mem 1G on a" in verdict.evidence
        assert "--mem 2G" in verdict.advice

    run(store, body)
