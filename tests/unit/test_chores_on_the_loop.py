"""The coordinator's chores run on its event loop, never on a worker thread: its memory and
asyncio objects belong to the loop. APScheduler's AsyncIOExecutor runs a plain function on a
thread pool, where a rerank raced listings ("dictionary changed size during iteration", a job
gone mid-page) and a periodic wake raced asyncio.Event ("deque mutated during iteration")."""

from __future__ import annotations

import asyncio
import inspect
import threading
from pathlib import Path

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gpuq.config.loading import load_settings
from gpuq.coordinator.serving import on_the_loop, start_coordinator


def threads_of(function_for_scheduler: object) -> set[int]:
    """The threads a chore ran on when APScheduler ran it, three times."""
    seen: list[int] = []

    async def main() -> None:
        scheduler = AsyncIOScheduler()
        job = function_for_scheduler(lambda: seen.append(threading.get_ident()))  # type: ignore[operator]
        scheduler.add_job(job, "interval", seconds=0.02)
        scheduler.start()
        try:
            while len(seen) < 3:
                await asyncio.sleep(0.01)
        finally:
            scheduler.shutdown(wait=False)

    asyncio.run(main())
    return set(seen)


def test_a_plain_function_would_run_on_a_worker_thread_and_on_the_loop_runs_there() -> None:
    loop_thread = threading.get_ident()  # asyncio.run runs its loop on this thread
    assert threads_of(lambda f: f) != {loop_thread}  # the trap
    assert threads_of(on_the_loop) == {loop_thread}


def test_every_chore_the_coordinator_registers_is_a_coroutine(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text('[coordinator]\nlisten = ""\n')

    async def main() -> None:
        running = await start_coordinator(load_settings(home=home))
        try:
            chores = running.coordinator.chores.get_jobs()
            assert len(chores) >= 3  # the clock chores (one timer), rerank, history prune
            plain = [j.name for j in chores if not inspect.iscoroutinefunction(j.func)]
            assert plain == []
        finally:
            await running.stop()

    asyncio.run(main())
