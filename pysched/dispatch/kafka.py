"""The distributed dispatcher: Kafka.

Leaders produce each due run to the topic, to the Kafka partition of its
schedule partition, and wait until the broker acknowledged every record
(acks=all, idempotent producer) before the store's watermark moves. The topic
records ``LogAppendTime``: the broker's clock says when each run was handed
on, which is what fire lag is measured against.

Workers form one consumer group. A record is committed only after its run is
done, so a worker that dies mid-run leaves it to be delivered again; the
session timeout (10 s, not the default 45 s) lets its partitions move on well
within the 30 s a dead worker's run may wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pysched.config import ClusterConfig
from pysched.dispatch.offsets import OffsetTracker
from pysched.protocols import Delivery, DispatchConsumer
from pysched.retention import DISPATCH_RETENTION_MS, DISPATCH_SEGMENT_MS

log = logging.getLogger("pysched.kafka")

SESSION_TIMEOUT_MS = 10_000
# A long run blocks its consumer thread; it must not be taken for dead while
# its heartbeats (sent by librdkafka's own thread) keep coming.
MAX_POLL_INTERVAL_MS = 7 * 3_600_000
_POLL_SLICE_S = 0.1
# How long every worker thread of a process may be busy before the keeper
# polls in their stead (see _keep_polling). Not at once: pausing and
# resuming the partitions drops what was fetched ahead, and between two
# short runs each thread is back for a record within milliseconds.
_KEEPER_AFTER_S = 2.0


class DispatchError(RuntimeError):
    """Some records were not acknowledged by the broker."""


def ensure_topic(
    config: ClusterConfig, timeout_s: float = 30, connect_timeout_s: float = 10, topic: str | None = None
) -> None:
    """Create the dispatch topic (or ``topic``, with as many partitions) if
    missing."""
    name = topic or config.topic
    admin = AdminClient({"bootstrap.servers": config.kafka, "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=connect_timeout_s)
    except KafkaException as exc:
        raise ConnectionError(f"kafka at {config.kafka} is unreachable: {exc}") from None
    if name in metadata.topics:
        return
    futures = admin.create_topics(
        [
            NewTopic(
                name,
                num_partitions=config.kafka_partitions,
                replication_factor=config.replication_factor,
                config=_topic_config(name == config.topic),
            )
        ],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def _topic_config(dispatch: bool) -> dict[str, str]:
    """A topic's settings. The dispatch topic's retention and segment span
    bound how long a record can be delivered again, which is how long a
    pruned run's claim is kept (retention.py): the broker's defaults (7
    days, and a segment of 7 days more) would outlive it."""
    settings = {"message.timestamp.type": "LogAppendTime"}
    if dispatch:
        settings["retention.ms"] = str(DISPATCH_RETENTION_MS)
        settings["segment.ms"] = str(DISPATCH_SEGMENT_MS)
    return settings


def producer_settings(config: ClusterConfig) -> dict[str, Any]:
    """Every record acknowledged by all in-sync replicas, never duplicated by
    a producer retry; batches fill for at most 1 ms. Only failed deliveries
    are reported: a flush that leaves nothing queued and reports nothing
    means every record was acknowledged, and a burst of 50,000 makes no
    Python call per record on the way back."""
    return {
        "bootstrap.servers": config.kafka,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 1,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 1_000_000,
        "delivery.report.only.error": True,
        "log_level": 3,
    }


class SharedKafkaConsumer:
    """One group member for all the worker threads of a process: each takes
    the next record of any partition, and records finish in any order, so
    a six-hour run holds one thread, never the records behind it on its
    partition. What is committed is each partition's prefix of finished
    records (OffsetTracker): a process that dies has every record it did not
    finish delivered again."""

    def __init__(self, config: ClusterConfig, group: str) -> None:
        self.topic = config.topic
        # poll and commit are not to interleave, and rebalance callbacks
        # run inside poll, on the thread that holds this.
        self._lock = threading.RLock()
        self._offsets = OffsetTracker()
        self._users = 0
        self.closed = False
        self._consumer = Consumer(
            {
                "bootstrap.servers": config.kafka,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": 2_000,
                "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
                "log_level": 3,
            }
        )
        self._consumer.subscribe(
            [config.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked
        )
        # Threads inside next(), and whether partitions may be paused
        # because none was: see _keep_polling.
        self._waiting = 0
        self._all_busy_since = time.monotonic()
        self._paused = False
        self._keeper = threading.Thread(target=self._keep_polling, name="pysched-kafka-keeper", daemon=True)
        self._keeper.start()

    def _keep_polling(self) -> None:
        """Poll while no worker thread has for a while, with every
        partition paused.

        A rebalance completes only once each member has polled: a process
        whose threads all run long jobs would otherwise hold up the whole
        group (a new worker got no partition, a dead one's were not handed
        on) for up to max.poll.interval.ms. Paused, a poll serves the
        rebalance and fetches nothing; a record fetched before the pause
        took effect is put back (seek), for whoever reads that partition
        next."""
        while not self.closed:
            time.sleep(_POLL_SLICE_S)
            with self._lock:
                if self.closed or self._waiting or time.monotonic() - self._all_busy_since < _KEEPER_AFTER_S:
                    continue
                # Again each time: a rebalance may have assigned partitions
                # that are not paused.
                self._consumer.pause(self._consumer.assignment())
                self._paused = True
                msg: Message | None = self._consumer.poll(0)
                if msg is not None and not msg.error():
                    partition, offset = _where(msg)
                    try:
                        self._consumer.seek(TopicPartition(self.topic, partition, offset))
                    except KafkaException as exc:
                        # Taken away meanwhile: its new owner reads it from
                        # the last commit, which is below this record.
                        log.debug("kafka consumer: could not put back %d@%d: %s", partition, offset, exc)

    def _assigned(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        # Inside a poll, under the lock. A partition paused, taken away and
        # given back can come back paused: its state is set here, for
        # whether a thread waits for a record now.
        consumer.assign(partitions)
        if self._waiting:
            consumer.resume(partitions)
        else:
            consumer.pause(partitions)
            self._paused = True

    def _resume_if_paused(self) -> None:
        """Under the lock, by a thread about to read."""
        if self._paused and not self.closed:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False

    def _revoked(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._offsets.forget([tp.partition for tp in partitions])

    def handle(self) -> _ConsumerHandle:
        with self._lock:
            self._users += 1
        return _ConsumerHandle(self)

    def next(self, timeout_s: float) -> Delivery | None:
        with self._lock:
            self._waiting += 1
            self._resume_if_paused()
        try:
            return self._next(timeout_s)
        finally:
            with self._lock:
                self._waiting -= 1
                if not self._waiting:
                    self._all_busy_since = time.monotonic()

    def _next(self, timeout_s: float) -> Delivery | None:
        deadline = time.monotonic() + timeout_s
        while True:
            # Short polls: an ack waits for the lock at most this long.
            wait_s = min(max(deadline - time.monotonic(), 0.0), _POLL_SLICE_S)
            with self._lock:
                if self.closed:
                    return None
                msg: Message | None = self._consumer.poll(wait_s)
                if msg is not None and not msg.error():
                    self._offsets.taken(*_where(msg))
                    _, appended_at = msg.timestamp()
                    return Delivery(msg.value() or b"", int(appended_at), msg)
            if msg is not None:
                log.warning("kafka consumer: %s", msg.error())
            if time.monotonic() >= deadline:
                return None

    def ack(self, delivery: Delivery) -> None:
        # Asynchronous: a lost commit only means one more delivery, which the
        # idempotency claim absorbs.
        assert isinstance(delivery.token, Message)
        partition, offset = _where(delivery.token)
        with self._lock:
            commit = self._offsets.done(partition, offset)
            if commit is not None and not self.closed:
                self._consumer.commit(offsets=[TopicPartition(self.topic, partition, commit)], asynchronous=True)

    def lag(self) -> dict[int, int]:
        """Records behind in each partition this member is assigned: the
        partition's end as last fetched (librdkafka's cached high
        watermark, no broker call) less this member's position. Empty when
        nothing is assigned or the member is closed."""
        with self._lock:
            if self.closed:
                return {}
            assigned = self._consumer.assignment()
            if not assigned:
                return {}
            behind: dict[int, int] = {}
            for tp in self._consumer.position(assigned):
                _, high = self._consumer.get_watermark_offsets(tp, cached=True)
                # A position or end not known yet (nothing fetched): no figure.
                if tp.offset >= 0 and high >= 0:
                    behind[tp.partition] = max(high - tp.offset, 0)
            return behind

    def release(self) -> None:
        """One thread done with it; the last closes the group member."""
        with self._lock:
            self._users -= 1
            if self._users > 0 or self.closed:
                return
            self.closed = True
            self._consumer.close()


def _where(msg: Message) -> tuple[int, int]:
    """A consumed record's partition and offset (never None for one)."""
    partition, offset = msg.partition(), msg.offset()
    assert partition is not None and offset is not None
    return partition, offset


class _ConsumerHandle:
    """A worker thread's view of its process's shared consumer."""

    def __init__(self, shared: SharedKafkaConsumer) -> None:
        self._shared = shared
        self._closed = False

    def next(self, timeout_s: float) -> Delivery | None:
        return self._shared.next(timeout_s)

    def ack(self, delivery: Delivery) -> None:
        self._shared.ack(delivery)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._shared.release()


class KafkaDispatcher:
    def __init__(self, config: ClusterConfig, group: str | None = None) -> None:
        self.config = config
        self.group = group or config.consumer_group
        self._producer: Producer | None = None
        self._failed: list[str] = []
        self._consumer_lock = threading.Lock()
        self._shared: SharedKafkaConsumer | None = None

    def _get_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(producer_settings(self.config))
        return self._producer

    def warm_up(self, timeout_s: float = 10) -> None:
        """Connect and take the idempotent producer's id now, not on the first
        fire: the first produce of a cold producer costs half a second."""
        self._get_producer().list_topics(self.config.topic, timeout=timeout_s)

    def _on_delivery(self, err: Any, msg: Message) -> None:
        if err is not None:
            self._failed.append(str(err))

    def publish(self, partitions: Sequence[int], payloads: Sequence[bytes]) -> None:
        producer = self._get_producer()
        self._failed = []
        parts = self.config.kafka_partitions
        produce, topic, report = producer.produce, self.config.topic, self._on_delivery
        for partition, payload in zip(partitions, payloads, strict=True):
            while True:
                try:
                    produce(topic, payload, partition=partition % parts, on_delivery=report)
                    break
                except BufferError:
                    producer.poll(0.05)
        remaining = producer.flush(30)
        if remaining or self._failed:
            raise DispatchError(
                f"kafka at {self.config.kafka}: {remaining} records unacknowledged, "
                f"{len(self._failed)} failed ({'; '.join(sorted(set(self._failed))[:3])})"
            )

    def consumer(self) -> DispatchConsumer:
        """A worker thread's consumer: every thread of the process shares
        one group member (SharedKafkaConsumer), made again once all have
        closed theirs."""
        with self._consumer_lock:
            if self._shared is None or self._shared.closed:
                self._shared = SharedKafkaConsumer(self.config, self.group)
            return self._shared.handle()

    def consumer_lag(self) -> dict[int, int]:
        """This process's group member's lag by partition (SharedKafkaConsumer.lag)."""
        shared = self._shared
        return {} if shared is None else shared.lag()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
