"""The leader's sweep's tables in memory, modelled on the cluster's
(stores/cassandra_sweep.py): the runs handed on, each to be looked at once
its look comes due, by (partition, bucket of that look); and each
partition's last bucket read."""

from __future__ import annotations

from pysched.protocols import SweepLook, look_bucket

RunKey = tuple[str, int, int]  # job id, run_at, attempt group


class SweepTables:
    """The sweep's rows, shared by every node's store (under its lock)."""

    def __init__(self) -> None:
        self.looks: dict[tuple[int, int], dict[RunKey, SweepLook]] = {}
        self.swept_through: dict[int, int] = {}  # partition -> last bucket read

    def add(self, look: SweepLook, at_ms: int) -> None:
        key = (look.job_id, look.run_at_ms, look.attempt_group)
        self.looks.setdefault((look.partition, look_bucket(at_ms)), {})[key] = look

    def bucket(self, partition: int, bucket: int) -> list[SweepLook]:
        return list(self.looks.get((partition, bucket), {}).values())

    def drop(self, partition: int, bucket: int) -> None:
        self.looks.pop((partition, bucket), None)
