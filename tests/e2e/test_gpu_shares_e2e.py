"""MPS shares end to end on the coordinator's side: a real coordinator and a raw agent stream
(a node's key) that registers one shared GPU and one that is not. Two 50% shares of one user
are dispatched to the shared unit together; a third waits with the reason; whole-GPU jobs
get the other unit only; the job record says which enforcement each has."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for
from raw_agent import RawAgent

from gpuq.errors import InvalidInput, Unsatisfiable


def test_two_shares_of_one_user_share_a_gpu_and_a_third_waits(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start_coordinator()
    agent = RawAgent(cluster, "raw", gpus=2, shared=(0,))
    try:
        cluster.wait_node("raw", "up")
        first = cluster.submit("sleep 600", gpu_share=50, gpu_mem="20G")
        second = cluster.submit("sleep 600", gpu_share="50%", gpu_mem="20G")
        for job in (first, second):
            cluster.wait_state(job, "running")
        wait_for(lambda: {first, second} <= agent.running.keys(), what="both shares' starts")
        assert list(agent.running[first].gpus) == list(agent.running[second].gpus) == ["GPU-raw-0"]
        detail, _ = cluster.client().detail(first)
        assert detail.gpu_enforcement == "MPS (limits)"
        assert detail.spec.resources.gpu_share == 50

        third = cluster.submit("sleep 600", gpu_share=50, gpu_mem="20G")
        reason = wait_for(
            lambda: [r for r in cluster.client().detail(third)[0].pending.reasons if "%" in r],
            15,
            "the third share's reason",
        )[0]
        assert reason.startswith("needs a 50% share of a shared GPU with 20G free: "), reason
        assert "node raw's shared GPU 0 has only 0% left" in reason, reason

        # whole GPUs: the unshared one only, while shares live on the shared one
        whole = cluster.submit("sleep 600", gpus=1)
        cluster.wait_state(whole, "running")
        wait_for(lambda: whole in agent.running, what="the whole job's start")
        assert list(agent.running[whole].gpus) == ["GPU-raw-1"]
        assert cluster.client().detail(whole)[0].gpu_enforcement == "exclusive"
        waiting = cluster.submit("sleep 600", gpus=1)
        # the scheduler says why it waits: the shared GPU is not given out whole
        why = wait_for(
            lambda: cluster.client().detail(waiting)[0].pending.reasons, 15, "its reason"
        )
        assert "largest free block is 0" in "; ".join(why), why
        assert cluster.job(waiting).state.value == "pending"

        # one share ends: the third takes its place beside the other
        cluster.client().cancel(first)
        cluster.wait_state(third, "running", timeout=15)
        wait_for(lambda: third in agent.running, what="the third share's start")
        assert list(agent.running[third].gpus) == ["GPU-raw-0"]
        assert cluster.job(waiting).state.value == "pending"
    finally:
        agent.close()
        cluster.close()


def test_a_share_no_shared_gpu_can_hold_is_refused_at_submit(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start_coordinator()
    agent = RawAgent(cluster, "raw", gpus=2, shared=(0,))
    try:
        cluster.wait_node("raw", "up")
        with pytest.raises(Unsatisfiable, match="no shared GPU has that much memory"):
            cluster.submit("true", gpu_share=50, gpu_mem="200G")
        with pytest.raises(InvalidInput, match="needs --gpu-mem"):
            cluster.submit("true", gpu_share=50)
        with pytest.raises(InvalidInput, match="a share is of one GPU"):
            cluster.submit("true", gpu_share=50, gpu_mem="20G", gpus=2)
    finally:
        agent.close()
        cluster.close()
