"""What the admin decides about scheduling: QOS tiers and the multifactor priority policy.

Plain values, read from `[qos.NAME]` and `[scheduler]` in the config file (gpuq.config.loading
checks them and builds these) and used by the scheduler and the coordinator, which need not
know where they came from.
"""

from __future__ import annotations

from dataclasses import dataclass

DAY = 86400
# Fencing (gpuq.agent.fencing): a supervisor stops its job once its lease runs out, fence_time
# after the coordinator last confirmed hearing from the node, and kills what is left after the
# kill grace. The coordinator gives a silent node's jobs up no sooner than its last sign of
# life plus fence_wait(); FENCE_MARGIN covers a timer's lateness and the last SIGKILL.
FENCE_MARGIN = 1.0
MAX_FENCE_TIME = float(DAY)  # the most an agent's fence_time can be ([agent] fence_time)


def fence_wait(fence_time: float, kill_grace: float) -> float:
    """Seconds after a node's last sign of life by which every job of it has certainly been
    stopped by its own supervisor: the shortest safe heartbeat_timeout."""
    return fence_time + kill_grace + FENCE_MARGIN


def silence_allowed(heartbeat_timeout: float, fence_time: float, kill_grace: float) -> float:
    """How long a node may be silent before its jobs are given up: heartbeat_timeout, or
    longer where its agent's fence_time (0: not said) needs it."""
    if not fence_time:
        return heartbeat_timeout
    return max(heartbeat_timeout, fence_wait(fence_time, kill_grace))


@dataclass(frozen=True, slots=True)
class QosTier:
    name: str
    priority: int = 0  # weight added to every job's priority
    preemptible: bool = False  # may jobs of higher tiers preempt these
    max_running_gpus: int | None = None  # per user
    max_running_jobs: int | None = None  # per user
    max_submitted_jobs: int | None = None  # per user, pending + running
    default_time: int | None = None  # seconds; for jobs without --time
    max_time: int | None = None  # seconds; longer requests are refused at submit
    # how many times a job lost with its node (node_fail) goes back to the queue; 0: never
    requeue_on_node_fail: int = 1
    # a running job whose GPUs all stay below idle_threshold percent busy for idle_window
    # seconds is flagged idle ("unknown" utilisation never counts as idle); idle_action "cancel"
    # then cancels it with that reason
    idle_threshold: float = 5.0
    idle_window: int = 1800
    idle_action: str = "flag"  # flag | cancel
    # a job on 2+ GPUs whose GPUs all keep one utilisation and one memory figure, and that
    # writes no output, for hung_window seconds is flagged "possibly hung (NCCL?)"; 0: never
    hung_window: int = 1800
    # the most bytes a job's output files (stdout and stderr) may hold; over it the agent ends
    # the job failed, "output limit: ..."; None: the node's [agent] max_output (if any)
    max_output: int | None = None


def default_qos_tiers() -> dict[str, QosTier]:
    """Without a config file: jobs without --time get a day (backfill needs every job to
    have an end), nobody asks for more than a week, and low can be preempted by the others."""
    return {
        "high": QosTier("high", priority=2000, default_time=DAY, max_time=7 * DAY),
        "normal": QosTier("normal", priority=1000, default_time=DAY, max_time=7 * DAY),
        "low": QosTier("low", priority=0, preemptible=True, default_time=DAY, max_time=7 * DAY),
    }


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Multifactor priority (as SLURM's priority/multifactor) and what the scheduler does with
    jobs that can never run."""

    weight_age: float = 500.0  # reached after max_age in the queue
    max_age: float = 7 * DAY
    weight_fairshare: float = 2000.0  # a user with no recent usage gets all of it
    fairshare_half_life: float = 7 * DAY  # how fast past GPU-seconds are forgiven
    priority_interval: float = 30.0  # seconds between full priority recalculations
    cancel_unsatisfiable: bool = True  # cancel jobs whose dependency can never be met
    explain_limit: int = 1000  # pending jobs that get an estimated start time
