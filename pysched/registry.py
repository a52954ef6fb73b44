"""Registering, rescheduling, pausing and cancelling jobs: admission, planning and one
store call, so a job is acknowledged only once its first run is committed and
a job that cannot run is refused before anything is stored.

A job goes to a partition of the store's count (ScheduleStore.partitions),
the one its nodes lead, whatever the registering client was configured with."""

from __future__ import annotations

from collections.abc import Sequence

from pysched import catchup
from pysched.admission import admit, check_schedule
from pysched.model import Job, Schedule
from pysched.planning import first_run, jitter_for, partition_for
from pysched.protocols import JobNotActive, JobRecord, Registration, ScheduleStore


def register(store: ScheduleStore, job: Job, now_ms: int) -> JobRecord:
    """Raises JobRejected (nothing stored) or JobExists."""
    admit(job, now_ms)
    jitter_ms = jitter_for(job)
    partition = partition_for(job.id, store.partitions)
    return store.add_job(job, partition, jitter_ms, first_run(job, jitter_ms, now_ms), now_ms)


def register_many(store: ScheduleStore, jobs: Sequence[Job], now_ms: int) -> list[str]:
    """Register jobs in bulk; returns the ids that already existed. A job that
    is refused raises JobRejected before any is stored."""
    for job in jobs:
        admit(job, now_ms)
    items: list[Registration] = []
    for job in jobs:
        jitter_ms = jitter_for(job)
        items.append((job, partition_for(job.id, store.partitions), jitter_ms, first_run(job, jitter_ms, now_ms)))
    return store.add_jobs(items, now_ms)


def reschedule(store: ScheduleStore, job_id: str, schedule: Schedule, now_ms: int) -> JobRecord:
    check_schedule(schedule, now_ms)
    current = store.get_job(job_id).job
    return replace(store, Job.model_validate({**current.model_dump(), "schedule": schedule.model_dump()}), now_ms)


def replace(store: ScheduleStore, job: Job, now_ms: int) -> JobRecord:
    """Give an active job ``job``'s definition, schedule and all; its
    pending runs are replaced by the new first run. Raises JobNotFound,
    JobNotActive (the caller has admitted ``job``)."""
    jitter_ms = jitter_for(job)
    return store.reschedule(job, jitter_ms, first_run(job, jitter_ms, now_ms), now_ms)


def resume(store: ScheduleStore, job_id: str, now_ms: int) -> JobRecord:
    """A paused job active again, its next run chosen by its catch-up
    policy. Raises JobNotFound, or JobNotActive for a job not paused."""
    current = store.get_job(job_id)
    if current.state != "paused":
        raise JobNotActive(f"job {job_id!r} is {current.state}, not paused")
    held = current.next_run
    if current.sent_before_pause_ms is not None:
        held = catchup.held_after_sent(current.job, current.jitter_ms, current.sent_before_pause_ms)
        if held is None:
            # Its last run was handed on before the pause: nothing follows.
            return store.resume_job(job_id, None, None, now_ms)
    planned, missed = catchup.on_resume(current.job, current.jitter_ms, held, now_ms)
    return store.resume_job(job_id, planned, missed, now_ms)
