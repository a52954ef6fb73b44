"""Idempotency claims on the distributed engine.

Redis is the fast path: one Lua script checks the dispatch's fence against
the highest fence seen for its partition (rejecting a stale leader) and takes
a short claim with SET NX PX. A claim Redis already knows to be done or held
by a live worker is answered there. Otherwise the authoritative claim is a
Cassandra lightweight transaction, ``INSERT ... IF NOT EXISTS`` on the run's
idempotency key, with the three outcomes of the design: succeeded (replay the
result), running under a live lease (back off), running under a dead lease
(take over, by a conditional update that only one taker wins).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from cassandra.cluster import Session

from pysched.config import ClusterConfig
from pysched.protocols import Claim, ClaimOutcome
from pysched.records import DispatchRecord

# KEYS: fence key, claim key. ARGV: fence, holder, px, now_ms, expires_ms.
# The claim's value is "holder|expires_ms", judged by the caller's clock like
# the Cassandra lease; PX only cleans up. Returns {outcome, fence floor}.
_CLAIM = """
local floor = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence < floor then return {'fenced', floor} end
if fence > floor then redis.call('SET', KEYS[1], ARGV[1]); floor = fence end
local current = redis.call('GET', KEYS[2])
if current == '!done' then return {'done', floor} end
if current then
  local sep = string.find(current, '|', 1, true)
  if sep and string.sub(current, 1, sep - 1) ~= ARGV[2]
     and tonumber(string.sub(current, sep + 1)) > tonumber(ARGV[4]) then
    return {'held', floor}
  end
end
redis.call('SET', KEYS[2], ARGV[2] .. '|' .. ARGV[5], 'PX', ARGV[3])
return {'claimed', floor}
"""

# KEYS: fence key. ARGV: fence. Raise the floor, never lower it.
_RAISE = """
local floor = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > floor then redis.call('SET', KEYS[1], ARGV[1]) end
return floor
"""

DONE_TTL_S = 7 * 86_400


class RedisCassandraClaims:
    def __init__(self, redis_client: redis.Redis, session: Session, config: ClusterConfig) -> None:
        self.redis = redis_client
        self.session = session
        self.prefix = f"pysched:{config.keyspace}"
        self._claim_script = redis_client.register_script(_CLAIM)
        self._raise_script = redis_client.register_script(_RAISE)
        ks = config.keyspace
        p = session.prepare
        self._insert = p(
            f"INSERT INTO {ks}.claims (idem_key, run_id, state, holder, fence, lease_expires_ms, updated_at_ms)"
            " VALUES (?, ?, 'running', ?, ?, ?, ?) IF NOT EXISTS"
        )
        self._take_over = p(
            f"UPDATE {ks}.claims SET state = 'running', holder = ?, fence = ?, lease_expires_ms = ?,"
            " updated_at_ms = ? WHERE idem_key = ? IF state = ? AND holder = ? AND lease_expires_ms = ?"
        )
        self._extend = p(
            f"UPDATE {ks}.claims SET lease_expires_ms = ?, updated_at_ms = ? WHERE idem_key = ?"
            " IF holder = ? AND state = 'running'"
        )
        self._complete = p(
            f"UPDATE {ks}.claims SET state = ?, result = ?, updated_at_ms = ? WHERE idem_key = ?"
            " IF holder = ? AND state = 'running'"
        )
        self._read = p(f"SELECT state, holder, lease_expires_ms, result FROM {ks}.claims WHERE idem_key = ?")

    def _fence_key(self, partition: int) -> str:
        return f"{self.prefix}:fence:{partition}"

    def _claim_key(self, key: str) -> str:
        return f"{self.prefix}:claim:{key}"

    def claim(self, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int) -> Claim:
        key = record.idempotency_key
        fast, floor = self._claim_script(
            keys=[self._fence_key(record.partition), self._claim_key(key)],
            args=[record.fence, holder, 2 * lease_ms, now_ms, now_ms + lease_ms],
        )
        fast = fast.decode() if isinstance(fast, bytes) else fast
        floor = int(floor)
        if fast == "fenced":
            return Claim(ClaimOutcome.FENCED, fence_floor=floor)
        if fast == "held":
            return Claim(ClaimOutcome.BUSY, fence_floor=floor)
        if fast == "done":
            row = self.session.execute(self._read, (key,)).one()
            return Claim(ClaimOutcome.SUCCEEDED, result=row.result if row else None, fence_floor=floor)
        # Redis let us through; Cassandra decides.
        res = self.session.execute(self._insert, (key, record.run_id, holder, record.fence, now_ms + lease_ms, now_ms))
        if res.was_applied:
            return Claim(ClaimOutcome.CLAIMED, fence_floor=floor)
        return self._contend(res.one(), record, holder, now_ms, lease_ms, floor)

    def _contend(self, row: Any, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int, floor: int) -> Claim:
        key = record.idempotency_key
        if row.state == "succeeded":
            self.redis.set(self._claim_key(key), "!done", ex=DONE_TTL_S)
            return Claim(ClaimOutcome.SUCCEEDED, result=row.result, fence_floor=floor)
        if row.state == "running" and row.lease_expires_ms > now_ms and row.holder != holder:
            # Tell the fast path who really holds it.
            self.redis.set(self._claim_key(key), f"{row.holder}|{row.lease_expires_ms}", px=2 * lease_ms)
            return Claim(ClaimOutcome.BUSY, fence_floor=floor)
        # Dead lease or failed before: take over, if nobody beat us to it.
        res = self.session.execute(
            self._take_over,
            (holder, record.fence, now_ms + lease_ms, now_ms, key, row.state, row.holder, row.lease_expires_ms),
        )
        if res.was_applied:
            return Claim(ClaimOutcome.TAKEN_OVER, fence_floor=floor)
        return Claim(ClaimOutcome.BUSY, fence_floor=floor)

    def heartbeat(self, keys: Sequence[str], holders: Sequence[str], now_ms: int, lease_ms: int) -> int:
        extended = 0
        pipe = self.redis.pipeline(transaction=False)
        for key, holder in zip(keys, holders, strict=True):
            if self.session.execute(self._extend, (now_ms + lease_ms, now_ms, key, holder)).was_applied:
                pipe.set(self._claim_key(key), f"{holder}|{now_ms + lease_ms}", px=2 * lease_ms)
                extended += 1
        pipe.execute()
        return extended

    def complete(self, key: str, holder: str, succeeded: bool, result: str | None, now_ms: int) -> None:
        res = self.session.execute(
            self._complete, ("succeeded" if succeeded else "failed", result, now_ms, key, holder)
        )
        if not res.was_applied:
            return  # no longer ours: whoever took over decides
        if succeeded:
            self.redis.set(self._claim_key(key), "!done", ex=DONE_TTL_S)
        else:
            self.redis.delete(self._claim_key(key))

    def raise_fence(self, partition: int, fence: int) -> None:
        self._raise_script(keys=[self._fence_key(partition)], args=[fence])


def connect_redis(url: str) -> redis.Redis:
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10, health_check_interval=30)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ConnectionError(f"redis at {url} is unreachable: {exc}") from None
    return client
