"""Idempotency claims on the distributed engine.

Redis is the fast path: one Lua script checks the dispatch's fence against
the highest fence seen for its partition (rejecting a stale leader) and takes
a short claim with SET NX PX. A claim Redis already knows to be done or held
by a live worker is answered there. Otherwise the authoritative claim is a
Cassandra lightweight transaction, ``INSERT ... IF NOT EXISTS`` on the run's
idempotency key, with the three outcomes of the design: succeeded (replay the
result), running under a live lease (back off), running under a dead lease
(take over, by a conditional update that only one taker wins); and a fourth:
failed, for the delivery the claim was taken for or an earlier one (not run
again: the failure is kept on the claim, and its retry is a later delivery).

A running run's lease: the claim row carries the one it began with
(``lease_expires_ms``); a run still going at its worker's heartbeat moves
into etcd (coord/run_leases.py: a key per run under the worker process's
lease), so a long run costs one keep-alive per process per heartbeat, not a
lightweight transaction per run. A taker must create the run's etcd key
before its conditional update: a live holder's key stops it.

Fence floors, durably. A new leader's ``raise_fence`` writes its fence to
Cassandra first (``claim_fences``: the fences raised per partition, a set
whose highest member is the floor, so no write can lower it), then to Redis.
Redis can lose what it holds (a restart without persistence, a FLUSHALL),
so its copy of a floor is trusted only while it is *verified*: present
without interruption since a claim seeded it from a Cassandra read made
after the seeding began.

- A claim for a partition Redis holds no floor for leaves an unverified
  marker there carrying a fresh epoch, reads the durable floor, decides on
  it (Cassandra's claim LWT is the only claim taken), then verifies the
  marker with what it read, if the marker is still its epoch's.
- ``raise_fence`` raises a floor Redis holds, verified or not, and creates
  none: after a loss the durable floor already has the raise, and any claim
  reads it before the partition's floor is verified again.
- Why a verified floor is at least every fence whose ``raise_fence``
  returned: that raise's Redis step came either after the marker was left,
  while the key stood (the step raised it), or before, and then its
  Cassandra write came before the seeding read too. A loss in between
  deletes the marker, and the seeding that read too early is refused.

So a claim reads Cassandra for its fence only when Redis cannot vouch for
the floor: once per partition after a loss (per worker that meets it first),
not per run.

Redis down. Nothing Redis holds is needed to decide: a claim whose Redis
call fails decides as one Redis holds no floor for (the durable floor, then
the claim LWT), without a marker; a heartbeat whose Redis write fails has
still moved its runs into etcd, which is what keeps a taker out; a hint a
claim or an outcome leaves for the fast path is only a hint. So a Redis
outage makes claims slower (a Cassandra read and an LWT each) and stops no
run; a claim key it failed to write or delete is at worst a stale hint,
which the Cassandra row and the etcd key overrule (a stale "held" makes a
claim wait at most until the lease it names ends). ``raise_fence`` still
needs Redis (see the method).

Not covered: Redis coming back with an *older* copy of its data (a restore
of an old snapshot, a failover to a lagging replica) keeps floors that look
verified but are behind; the claim's idempotency key still holds the effect
to one, as it does for a dispatch in flight while a fence is raised.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from pysched.config import ClusterConfig
from pysched.coord.run_leases import Holding, RunLeases
from pysched.protocols import PRUNED_STATE, Claim, ClaimHolder, ClaimOutcome, FailedClaim, completed_state
from pysched.records import DispatchRecord
from pysched.stores.cassandra_rows import applied
from pysched.stores.cql_tables import CqlTables

# A floor key is a hash: ``floor``, and ``unverified`` (an epoch) while no
# claim has confirmed it against Cassandra since Redis last lost it. Fences
# are compared as numbers and stored as the caller's strings (a Lua number
# prints large values in exponent form).

# KEYS: floor key, claim key. ARGV: fence, holder, px, now_ms, expires_ms,
# epoch. The claim's value is "holder|expires_ms", judged by the caller's
# clock like the Cassandra lease; PX only cleans up. Returns {outcome, fence
# floor[, epoch, or the holder's lease end when 'held']}; 'unknown' takes no
# claim and leaves the floor unraised.
_CLAIM = """
local floor = redis.call('HGET', KEYS[1], 'floor')
if not floor then
  redis.call('HSET', KEYS[1], 'floor', '0', 'unverified', ARGV[6])
  return {'unknown', 0, ARGV[6]}
end
local fence = tonumber(ARGV[1])
if fence < tonumber(floor) then return {'fenced', floor} end
local unverified = redis.call('HGET', KEYS[1], 'unverified')
if unverified then return {'unknown', floor, unverified} end
if fence > tonumber(floor) then redis.call('HSET', KEYS[1], 'floor', ARGV[1]); floor = ARGV[1] end
local current = redis.call('GET', KEYS[2])
if current == '!done' then return {'done', floor} end
if current then
  local sep = string.find(current, '|', 1, true)
  if sep and string.sub(current, 1, sep - 1) ~= ARGV[2]
     and tonumber(string.sub(current, sep + 1)) > tonumber(ARGV[4]) then
    return {'held', floor, string.sub(current, sep + 1)}
  end
end
redis.call('SET', KEYS[2], ARGV[2] .. '|' .. ARGV[5], 'PX', ARGV[3])
return {'claimed', floor}
"""

# KEYS: floor key. ARGV: fence. Raise a floor Redis holds; never lower it,
# never create it (see the module's docstring).
_RAISE = """
local floor = redis.call('HGET', KEYS[1], 'floor')
if floor and tonumber(ARGV[1]) > tonumber(floor) then redis.call('HSET', KEYS[1], 'floor', ARGV[1]) end
return 0
"""

# KEYS: floor key. ARGV: durable floor (read after the marker was left),
# epoch. Verifies the floor if the marker is still that epoch's, or merges
# the durable floor into one already verified. Returns 1 if the floor is
# verified now.
_VERIFY = """
local floor = redis.call('HGET', KEYS[1], 'floor')
if not floor then return 0 end
local unverified = redis.call('HGET', KEYS[1], 'unverified')
if unverified and unverified ~= ARGV[2] then return 0 end
if tonumber(ARGV[1]) > tonumber(floor) then redis.call('HSET', KEYS[1], 'floor', ARGV[1]) end
redis.call('HDEL', KEYS[1], 'unverified')
return 1
"""

FENCES_TABLE = (
    "CREATE TABLE IF NOT EXISTS {ks}.claim_fences (partition int, fence bigint,"
    " PRIMARY KEY (partition, fence)) WITH CLUSTERING ORDER BY (fence DESC)"
)


def ensure_fence_table(tables: CqlTables, keyspace: str) -> None:
    tables.execute(FENCES_TABLE.format(ks=keyspace), timeout=60)
    tables.agree_on_schema()


DONE_TTL_S = 7 * 86_400
log = logging.getLogger("pysched.claims")

_Reply = TypeVar("_Reply")


class RedisCassandraClaims:
    def __init__(
        self, redis_client: redis.Redis, tables: CqlTables, config: ClusterConfig, run_leases: RunLeases
    ) -> None:
        self.redis = redis_client
        self.tables = tables
        self.run_leases = run_leases
        self.prefix = f"pysched:{config.keyspace}"
        self._claim_script = redis_client.register_script(_CLAIM)
        self._raise_script = redis_client.register_script(_RAISE)
        self._verify_script = redis_client.register_script(_VERIFY)
        # Epochs unique across clients and Redis's lifetimes: a random
        # prefix, then a counter (cheaper than a random value per claim).
        self._epoch_prefix = secrets.token_hex(8)
        self._epochs = itertools.count()
        ks = config.keyspace
        ensure_fence_table(tables, ks)
        p = tables.prepare
        # Plain QUORUM writes and reads: a set only grows, so there is no
        # condition to check, and a quorum read sees every acknowledged raise.
        self._record_fence = p(f"INSERT INTO {ks}.claim_fences (partition, fence) VALUES (?, ?)")
        self._read_floor = p(f"SELECT fence FROM {ks}.claim_fences WHERE partition = ? LIMIT 1")
        self._insert = p(
            f"INSERT INTO {ks}.claims (idem_key, run_id, state, holder, fence, lease_expires_ms, updated_at_ms,"
            " delivery) VALUES (?, ?, 'running', ?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self._take_over = p(
            f"UPDATE {ks}.claims SET state = 'running', holder = ?, fence = ?, lease_expires_ms = ?,"
            " updated_at_ms = ?, delivery = ? WHERE idem_key = ? IF state = ? AND holder = ? AND lease_expires_ms = ?"
        )
        self._extend = p(
            f"UPDATE {ks}.claims SET lease_expires_ms = ?, updated_at_ms = ? WHERE idem_key = ?"
            " IF holder = ? AND state = 'running'"
        )
        self._complete = p(
            f"UPDATE {ks}.claims SET state = ?, result = ?, updated_at_ms = ? WHERE idem_key = ?"
            " IF holder = ? AND state = 'running'"
        )
        self._read = p(
            f"SELECT state, holder, fence, lease_expires_ms, result, delivery FROM {ks}.claims WHERE idem_key = ?"
        )
        self._save_checkpoint = p(
            f"UPDATE {ks}.claims SET checkpoint = ?, updated_at_ms = ? WHERE idem_key = ?"
            " IF holder = ? AND state = 'running'"
        )
        self._read_checkpoint = p(f"SELECT checkpoint FROM {ks}.claims WHERE idem_key = ?")

    def _floor_key(self, partition: int) -> str:
        # Not the ":fence:" string of earlier versions: a new key starts
        # unverified, as after a loss.
        return f"{self.prefix}:floor:{partition}"

    def _claim_key(self, key: str) -> str:
        return f"{self.prefix}:claim:{key}"

    def _fast_path(self, what: str, call: Callable[[], _Reply]) -> _Reply | None:
        """``call``'s reply, or None when Redis failed: the caller goes on
        without the fast path (see the module's docstring)."""
        try:
            return call()
        except redis.RedisError as exc:
            log.warning("redis failed to %s, going on without it: %s", what, exc)
            return None

    def claim(self, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int) -> Claim:
        key = record.idempotency_key
        reply = self._fast_path(
            f"claim {key}",
            lambda: self._claim_script(
                keys=[self._floor_key(record.partition), self._claim_key(key)],
                args=[record.fence, holder, 2 * lease_ms, now_ms, now_ms + lease_ms, self._new_epoch()],
            ),
        )
        if reply is None:
            # As if Redis held no floor, with no marker to verify: every
            # raise that returned is in the durable floor already.
            return self._claim_on_durable_floor(record, holder, now_ms, lease_ms, 0, None)
        fast = _text(reply[0])
        floor = int(reply[1])
        if fast == "unknown":
            return self._claim_on_durable_floor(record, holder, now_ms, lease_ms, floor, _text(reply[2]))
        if fast == "fenced":
            return Claim(ClaimOutcome.FENCED, fence_floor=floor)
        if fast == "held":
            return Claim(ClaimOutcome.BUSY, fence_floor=floor, busy_until_ms=int(reply[2]))
        if fast == "done":
            row = self.tables.execute(self._read, (key,)).one()
            if row is not None and row.state == PRUNED_STATE:
                # Redis's marker outlived the history (retention.py).
                return Claim(ClaimOutcome.PRUNED, fence_floor=floor)
            return Claim(ClaimOutcome.SUCCEEDED, result=row.result if row else None, fence_floor=floor)
        # Redis let us through; Cassandra decides.
        res = self.tables.execute(
            self._insert, (key, record.run_id, holder, record.fence, now_ms + lease_ms, now_ms, record.attempt)
        )
        if applied(res):
            return Claim(ClaimOutcome.CLAIMED, fence_floor=floor)
        return self._contend(res.one(), record, holder, now_ms, lease_ms, floor)

    def _claim_on_durable_floor(
        self, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int, fast_floor: int, epoch: str | None
    ) -> Claim:
        """Redis cannot vouch for the partition's floor: Cassandra's decides,
        read after Redis's marker was left (what makes it fit to verify the
        marker with; ``epoch`` None: no marker, Redis failed). ``fast_floor``
        holds only raised fences, so it counts too. No Redis claim is taken:
        Cassandra's LWT decides alone."""
        row = self.tables.execute(self._read_floor, (record.partition,)).one()
        durable = 0 if row is None else int(row.fence)
        if epoch is not None:
            marker = self._floor_key(record.partition)
            self._fast_path(
                f"verify the floor of partition {record.partition}",
                lambda: self._verify_script(keys=[marker], args=[durable, epoch]),
            )
        floor = max(fast_floor, durable)
        if record.fence < floor:
            return Claim(ClaimOutcome.FENCED, fence_floor=floor)
        floor = record.fence
        key = record.idempotency_key
        res = self.tables.execute(
            self._insert, (key, record.run_id, holder, record.fence, now_ms + lease_ms, now_ms, record.attempt)
        )
        if applied(res):
            return Claim(ClaimOutcome.CLAIMED, fence_floor=floor)
        return self._contend(res.one(), record, holder, now_ms, lease_ms, floor)

    def _new_epoch(self) -> str:
        return f"{self._epoch_prefix}.{next(self._epochs)}"

    def _contend(self, row: Any, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int, floor: int) -> Claim:
        key = record.idempotency_key
        if row.state == "succeeded":
            self._fast_path(f"mark {key} done", lambda: self.redis.set(self._claim_key(key), "!done", ex=DONE_TTL_S))
            return Claim(ClaimOutcome.SUCCEEDED, result=row.result, fence_floor=floor)
        if row.state == "running" and row.holder != holder and row.lease_expires_ms > now_ms:
            # Within the lease its claim began with: its worker has not
            # needed etcd yet (see heartbeat). Tell the fast path who holds it.
            hint = f"{row.holder}|{row.lease_expires_ms}"
            self._fast_path(f"mark {key} held", lambda: self.redis.set(self._claim_key(key), hint, px=2 * lease_ms))
            return Claim(ClaimOutcome.BUSY, fence_floor=floor, busy_until_ms=int(row.lease_expires_ms))
        if row.state == PRUNED_STATE:
            # Its run's history was pruned: a stale record (retention.py).
            # The fast path let it through and holds it under this holder.
            self._fast_path(f"let go of {key}", lambda: self.redis.delete(self._claim_key(key)))
            return Claim(ClaimOutcome.PRUNED, fence_floor=floor)
        delivery = int(row.delivery or 0)
        if row.state == "failed" and record.attempt <= delivery:
            # This delivery, or a later one, failed: its retry (if any) is a
            # delivery of its own. The fast path let this claim through and
            # holds it under this holder: not so, or the retry would wait.
            self.redis.delete(self._claim_key(key))
            return Claim(ClaimOutcome.FAILED, fence_floor=floor, failure=row.result)
        # Its first lease is over, or it was let go of, or this is a later
        # delivery of a failed run: its key in etcd says
        # whether a live worker still runs it. Taking that key is the gate
        # only one taker passes; the claim row is then written for it.
        if not self.run_leases.take(key, holder, _ttl_s(lease_ms)):
            left_ms = self.run_leases.held_for_ms(key)
            until_ms = None if left_ms is None else now_ms + left_ms
            return Claim(ClaimOutcome.BUSY, fence_floor=floor, busy_until_ms=until_ms)
        res = self.tables.execute(
            self._take_over,
            (
                holder,
                record.fence,
                now_ms + lease_ms,
                now_ms,
                max(delivery, record.attempt),
                key,
                row.state,
                row.holder,
                row.lease_expires_ms,
            ),
        )
        if applied(res):
            # Read once the claim is ours: the former holder can no longer
            # write one, so this is its last.
            saved = self.tables.execute(self._read_checkpoint, (key,)).one()
            checkpoint = None if saved is None else saved.checkpoint
            failure = row.result if row.state == "failed" else None
            return Claim(ClaimOutcome.TAKEN_OVER, fence_floor=floor, checkpoint=checkpoint, failure=failure)
        self.run_leases.let_go([key])
        return Claim(ClaimOutcome.BUSY, fence_floor=floor)

    def heartbeat(self, keys: Sequence[str], holders: Sequence[str], now_ms: int, lease_ms: int) -> list[int]:
        """One etcd keep-alive for every run of this process. A run's claim
        row carries the lease it began with; a run still going at a
        heartbeat moves into etcd (its key taken, then the row checked to be
        still its holder's, once), and its row is not written again: a
        six-hour run costs one key, not a conditional write every 10 s.
        Redis's copy of each claim is only a hint: a failure to write it
        extends nothing less."""
        self.run_leases.renew(_ttl_s(lease_ms))
        not_extended: list[int] = []
        pipe = self.redis.pipeline(transaction=False)
        for i, (key, holder) in enumerate(zip(keys, holders, strict=True)):
            holding = self.run_leases.holding(key, holder)
            if holding is Holding.NOT_YET and self.run_leases.take(key, holder, _ttl_s(lease_ms)):
                # Taken while the row is still this holder's: from now on no
                # taker passes the key. If the row is not, it was taken over
                # before (this worker stalled past its first lease).
                if applied(self.tables.execute(self._extend, (now_ms + lease_ms, now_ms, key, holder))):
                    holding = Holding.HELD
                else:
                    self.run_leases.let_go([key])
            if holding is Holding.HELD:
                pipe.set(self._claim_key(key), f"{holder}|{now_ms + lease_ms}", px=2 * lease_ms)
            else:
                not_extended.append(i)
        self._fast_path(f"renew {len(keys) - len(not_extended)} claims", pipe.execute)
        lost = set(not_extended)
        self.run_leases.let_go_all_but({key for i, key in enumerate(keys) if i not in lost})
        return not_extended

    def complete(self, key: str, holder: str, succeeded: bool, result: str | None, now_ms: int) -> bool:
        res = self.tables.execute(self._complete, (completed_state(succeeded, result), result, now_ms, key, holder))
        try:
            self.run_leases.let_go([key])
        except Exception as exc:
            # The outcome is written; the key goes at the next heartbeat.
            log.warning("could not delete the etcd key of %s, will retry: %s", key, exc)
        if not applied(res):
            # Ended by this holder already (a repeated call), or no longer
            # ours: whoever took over decides.
            # The refusal carries the row's holder, or only [applied] when
            # there is no row.
            return getattr(res.one(), "holder", None) == holder
        if succeeded:
            self._fast_path(f"mark {key} done", lambda: self.redis.set(self._claim_key(key), "!done", ex=DONE_TTL_S))
        else:
            self._fast_path(f"let go of {key}", lambda: self.redis.delete(self._claim_key(key)))
        return True

    def failed_claim(self, key: str) -> FailedClaim | None:
        row = self.tables.execute(self._read, (key,)).one()
        if row is None or row.state != "failed" or row.result is None:
            return None
        return FailedClaim(int(row.delivery or 0), str(row.result))

    def unfinished_claim(self, key: str, now_ms: int) -> ClaimHolder | None:
        row = self.tables.execute(self._read, (key,)).one()
        if row is None or row.state != "running":
            return None
        holder, fence = str(row.holder), int(row.fence or 0)
        if row.lease_expires_ms > now_ms:
            return ClaimHolder(holder, fence, int(row.lease_expires_ms))
        # Past the lease its claim began with, its etcd key says whether a
        # live worker still runs it (see _contend).
        left_ms = self.run_leases.held_for_ms(key)
        if left_ms is None:
            raise ConnectionError(f"etcd could not say whether {key} is still held")
        return ClaimHolder(holder, fence, now_ms + left_ms if left_ms > 0 else None)

    def save_checkpoint(self, key: str, holder: str, state: str, now_ms: int) -> bool:
        # A lightweight transaction on the claim's row: a take-over and this
        # write are ordered by Paxos, and only the holder's is applied.
        return applied(self.tables.execute(self._save_checkpoint, (state, now_ms, key, holder)))

    def raise_fence(self, partition: int, fence: int) -> None:
        # Cassandra first: a verified Redis floor relies on every raise that
        # reached Redis being durable already (see the module's docstring).
        # A failed Redis step still raises: a Redis this process cannot
        # reach may be up for others, its floor verified and now behind.
        self.tables.execute(self._record_fence, (partition, fence))
        self._raise_script(keys=[self._floor_key(partition)], args=[fence])


def _ttl_s(lease_ms: int) -> int:
    # etcd counts whole seconds (and raises a TTL below its own minimum).
    return max(1, -(-lease_ms // 1_000))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def connect_redis(url: str) -> redis.Redis:
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10, health_check_interval=30)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ConnectionError(f"redis at {url} is unreachable: {exc}") from None
    return client
