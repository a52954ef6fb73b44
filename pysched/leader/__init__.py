"""The partition leader: store -> timing wheel -> dispatcher, under fences.

A node's leader polls its coordinator for the partitions it leads, each with
a fence. For those partitions it loads the next ``horizon`` of runs into the
native wheel every ``reload_every`` (and at once when jobs change), ticks
every 10 ms, and hands due runs on in batches:

1. ``dispatcher.publish``: returns once the records are handed on (Kafka:
   acknowledged by the broker; in process: queued);
2. ``store.finish_dispatch``: the runs are recorded as handed on with the
   next runs the core planned from ``store.planning_state`` (a re-send plans
   nothing: ``planning.is_resend``), and only then do the partitions'
   watermarks move past the batch, no further than the leader has read.

A crash anywhere in between makes the next leader send a run again, never
lose it; the workers' idempotency claim turns that into one effect.

Modules, one part each: ``leases`` (what may be led), ``loading`` (store
reads), ``cache`` (the wheel and what it holds), ``firing`` (the
dispatcher), ``recording`` (the store's record of what was sent);
``partition_leader`` joins them in a tick and runs them on threads;
``driver`` runs them on one thread instead, in an order of its choosing.
"""

from pysched.leader.config import BatchDispatched, LeaderConfig, RunDispatched
from pysched.leader.driver import SyncDriver
from pysched.leader.partition_leader import PartitionLeader

__all__ = ["BatchDispatched", "LeaderConfig", "PartitionLeader", "RunDispatched", "SyncDriver"]
