"""Dead letters announced on a Kafka topic: one record per run that failed
for good, keyed by its idempotency key, its value the run and every failed
attempt as JSON. Produced after the store recorded the dead letter, with
the dispatch topic's guarantees (acks=all, idempotent producer); a run
redriven and failing again is announced again, with its new attempts."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Producer

from pysched.config import ClusterConfig
from pysched.dispatch.kafka import DispatchError, ensure_topic, producer_settings
from pysched.protocols import RunRecord

# A dead letter is rare and small: waiting for its acknowledgement costs a
# worker little, and an unacknowledged one is reported, not dropped.
_FLUSH_S = 10.0


def dead_letter_topic(config: ClusterConfig) -> str:
    return config.dead_letter_topic or f"{config.topic}-dead-letters"


def dead_letter_value(run: RunRecord, now_ms: int) -> dict[str, Any]:
    return {
        "idempotency_key": run.idempotency_key,
        "job_id": run.job_id,
        "run_at_ms": run.run_at_ms,
        "attempt_group": run.attempt_group,
        "attempts": run.attempt,
        "error": run.error,
        "failed_at_ms": run.ended_at_ms,
        "announced_at_ms": now_ms,
        "failures": [json.loads(f.to_json()) for f in run.failures],
    }


class KafkaDeadLetters:
    def __init__(self, config: ClusterConfig) -> None:
        self.topic = dead_letter_topic(config)
        ensure_topic(config, topic=self.topic)
        self._producer = Producer(producer_settings(config))

    def publish(self, run: RunRecord, now_ms: int) -> None:
        failed: list[str] = []

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        self._producer.produce(
            self.topic,
            key=run.idempotency_key.encode(),
            value=json.dumps(dead_letter_value(run, now_ms)).encode(),
            on_delivery=report,
        )
        left = self._producer.flush(_FLUSH_S)
        if left or failed:
            raise DispatchError(f"dead letter {run.idempotency_key} not acknowledged: {failed or 'timed out'}")

    def close(self) -> None:
        self._producer.flush(_FLUSH_S)
