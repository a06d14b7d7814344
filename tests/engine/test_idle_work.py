"""The engine thread's idle work: only after a quiet time, then a step at a time while no job is
queued, never ahead of one."""

from __future__ import annotations

import queue
import threading

from server.engine.job import Job
from server.engine.llama import IdleWork, wait_for_job


class Steps:
    """Idle work of `n` steps that queues `job` at step `queue_at` (0: never)."""

    def __init__(self, n: int, jobs: queue.SimpleQueue[Job | None], queue_at: int = 0) -> None:
        self.n, self.jobs, self.queue_at = n, jobs, queue_at
        self.done = 0

    def advance(self) -> bool:
        self.done += 1
        if self.done == self.queue_at:
            self.jobs.put(None)
        return self.done >= self.n


def test_a_queued_job_comes_before_any_step() -> None:
    jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
    work = Steps(5, jobs)
    jobs.put(None)
    idle: list[IdleWork] = [work]
    assert wait_for_job(jobs, idle) is None
    assert work.done == 0
    assert idle == [work]


def test_no_step_while_a_job_comes_within_the_quiet_time() -> None:
    """A job put 10 ms after the engine began to wait (a client's next request) is taken
    without any step of the idle work."""
    jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
    work = Steps(5, jobs)
    threading.Timer(0.01, jobs.put, (None,)).start()
    assert wait_for_job(jobs, [work], quiet_s=30.0) is None
    assert work.done == 0


def test_steps_go_on_until_a_job_comes_and_resume_after_it() -> None:
    jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
    first, second = Steps(5, jobs, queue_at=3), Steps(2, jobs, queue_at=2)
    idle: list[IdleWork] = [first, second]
    assert wait_for_job(jobs, idle, quiet_s=0.0) is None  # the job the third step queued
    assert (first.done, second.done) == (3, 0)
    assert idle == [first, second]
    # the next wait finishes the first work, then the second (which queues the job at its last
    # step); with nothing left, it takes the job by a blocking get
    assert wait_for_job(jobs, idle, quiet_s=0.0) is None
    assert (first.done, second.done) == (5, 2)
    assert idle == []
