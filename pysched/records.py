"""The record a leader hands to the dispatch path, shared by both codecs."""

from __future__ import annotations

import hashlib
from typing import NamedTuple


class RecordError(ValueError):
    """A dispatch payload that cannot be encoded or decoded."""


def idempotency_key(job_id: str, run_at_ms: int, attempt_group: int) -> str:
    """`{job_id}:{scheduled_run_at}:{attempt_group}`: the same for every
    delivery of a run, so a duplicate delivery is recognised."""
    return f"{job_id}:{run_at_ms}:{attempt_group}"


def run_id_for(job_id: str, run_at_ms: int, attempt_group: int) -> int:
    """A run's wheel handle on the cluster engine, derived from its identity
    so that planning the same run twice (after a failover, or a recording
    retried) yields the same handle and rows. (The embedded store numbers
    its runs itself.)"""
    digest = hashlib.sha256(idempotency_key(job_id, run_at_ms, attempt_group).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class DispatchRecord(NamedTuple):
    """One due run as it travels from a partition leader to a worker."""

    run_id: int
    job_id: str
    run_at_ms: int
    due_ms: int
    partition: int
    attempt: int
    attempt_group: int
    fence: int
    dispatched_at_ms: int

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.job_id, self.run_at_ms, self.attempt_group)
