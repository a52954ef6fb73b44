"""Where the distributed engine's servers are: a TOML file or environment.

    [cluster]
    etcd = "127.0.0.1:2379"
    cassandra = "127.0.0.1:9042"
    kafka = "127.0.0.1:9092"
    redis = "redis://127.0.0.1:6379/0"
    keyspace = "pysched"            # optional from here on
    topic = "pysched-dispatch"
    dead_letter_topic = "pysched-dispatch-dead-letters"  # runs that failed for good, announced
    partitions = 64                 # only when the keyspace is created; see below
    kafka_partitions = 16
    history_days = 7                # finished runs older than this are pruned (0: never)
    history_keep = 1000             # and those beyond a job's newest 1000 (0: no limit)
    grace_s = 30                    # after a stop, running jobs' time to finish (--grace wins)
    catch_up_rate = 500             # overdue runs a leader hands on a second (--catch-up-rate wins)
    temporal_address = "127.0.0.1:7233"  # the Temporal server of --temporal targets
    breaker_failures = 5            # a downstream's failures in a row that open its breaker
    breaker_open_s = 30             # how long it stays open before one probe
    retry_budget_ratio = 0.2        # retries a minute: this ratio of first attempts,
    retry_budget_floor = 600        # plus this many (--retry-budget RATIO:FLOOR wins)

Each key may also come from PYSCHED_<KEY> (PYSCHED_ETCD, ...), which wins.
PYSCHED_TEMPORAL_ADDRESS is also what the embedded engine's workers read,
which have no file.

``partitions`` belongs to the keyspace, not to this file: the count is
written once, when the keyspace is created (with the count named here, or
64), and every node and client reads it from there. Left out, the
keyspace's count is used; named, it must agree with the keyspace's, or the
client refuses to start. An operator who writes ``partitions = 16`` means
it: silently running with the keyspace's 64 would hide that the file
describes another cluster than the one it points at, and no client may
place jobs by a count of its own (a job outside the partitions the nodes
lead never fires).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# The longest grace period after a stop: a day is longer than any stop
# should wait (--grace and grace_s alike).
MAX_GRACE_S = 86_400
# Runs found long overdue that a leader hands on a second (LeaderConfig).
DEFAULT_CATCH_UP_RATE = 500
MAX_CATCH_UP_RATE = 100_000
# The retries a minute a downstream's retry budget always allows, at most.
MAX_BUDGET_FLOOR = 100_000


class ConfigError(ValueError):
    """A configuration that cannot be used, with the file and field named."""


# An HTTP API token shorter than this is refused (too easily guessed over
# the network), from the config file or PYSCHED_API_TOKEN.
MIN_API_TOKEN_CHARS = 16


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    etcd: str = Field(description="host:port of an etcd client URL")
    cassandra: str = Field(description="host:port of a CQL contact point")
    kafka: str = Field(description="Kafka bootstrap servers")
    redis: str = Field(description="redis:// URL")
    keyspace: str = Field(default="pysched", pattern=r"^[a-z][a-z0-9_]{0,47}$")
    topic: str = Field(default="pysched-dispatch", pattern=r"^[A-Za-z0-9._-]{1,200}$")
    # The workers' Kafka consumer group. Clusters sharing a broker each need
    # their own, or they share rebalances; an existing cluster's group holds
    # its committed offsets, so the default stays what it always was.
    consumer_group: str = Field(default="pysched-workers", pattern=r"^[A-Za-z0-9._-]{1,200}$")
    # Where runs that failed for good are announced; None: TOPIC-dead-letters.
    dead_letter_topic: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,200}$")
    partitions: int | None = Field(
        default=None, ge=1, le=4096, description="a new keyspace's count (default 64); must match an existing one"
    )
    kafka_partitions: int = Field(default=16, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1)
    lease_ttl_s: int = Field(default=10, ge=2, le=300)
    history_days: int = Field(default=7, ge=0, le=36_500, description="days finished runs are kept; 0: no limit")
    history_keep: int = Field(
        default=1_000, ge=0, le=10_000_000, description="finished runs kept per job at most; 0: no limit"
    )
    grace_s: float = Field(
        default=30.0,
        ge=0,
        le=MAX_GRACE_S,
        allow_inf_nan=False,
        description="seconds running jobs may take to finish after a stop signal, then they are interrupted",
    )
    catch_up_rate: int = Field(
        default=DEFAULT_CATCH_UP_RATE,
        ge=1,
        le=MAX_CATCH_UP_RATE,
        description="runs found long overdue that a leader hands on a second, after those due now",
    )
    temporal_address: str = Field(
        default="127.0.0.1:7233",
        pattern=r"^\S+:\d{1,5}$",
        description="host:port of the Temporal frontend that --temporal targets start workflows on",
    )
    # Per downstream, cluster-wide: give every node the same values.
    breaker_failures: int = Field(
        default=5,
        ge=1,
        le=1_000,
        description="failures in a row (timeout, connect, 5xx, exception) that open a breaker",
    )
    breaker_open_s: float = Field(
        default=30.0, gt=0, le=86_400, allow_inf_nan=False, description="seconds a breaker stays open before a probe"
    )
    retry_budget_ratio: float = Field(
        default=0.2,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="retries of a downstream allowed over a sliding minute, as a ratio of its first attempts",
    )
    retry_budget_floor: int = Field(
        default=600, ge=0, le=MAX_BUDGET_FLOOR, description="retries a minute a downstream's budget always allows"
    )
    api_token: str | None = Field(
        default=None,
        min_length=MIN_API_TOKEN_CHARS,
        pattern=r"^[\x21-\x7e]+$",
        description="the bearer token every HTTP API request must carry (or PYSCHED_API_TOKEN)",
    )


def load(path: str | Path | None) -> ClusterConfig:
    values: dict[str, object] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: {exc.strerror or exc}") from None
        section = raw.get("cluster")
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: no [cluster] table")
        values.update(section)
    for name in ClusterConfig.model_fields:
        env = os.environ.get(f"PYSCHED_{name.upper()}")
        if env is not None:
            values[name] = env
    try:
        return ClusterConfig.model_validate(values)
    except ValidationError as exc:
        where = f"{path}: " if path else ""
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}{fields}") from None


def host_port(value: str, default_port: int) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host:
        return value, default_port
    return host, int(port)
