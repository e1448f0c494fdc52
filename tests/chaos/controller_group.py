"""A broker group in controller mode for the chaos tests (issue 14): controller peers, three
members with ``all_ack_in_sync_state_set``, a producer and a reader running throughout, and
what every scenario checks afterwards.

Each member reaches the controllers and the name servers through its own FaultProxies, so
one member can be cut off from them while the others are not. Its HA port cannot be proxied:
the address a member listens on for HA is the one it publishes, so slaves always connect to
it directly (a cut master therefore loses its slaves when they follow the new master, which
is the race the epoch fencing has to win)."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from faultproxy import FaultProxy

import hamq
from hamq import Message, SendStatus
from hamq.client.consumer import PullStatus
from hamq.client.controller import ControllerClient
from hamq.client.producer import UniqKeys
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, unpack_body
from hamq.protocol.message import decode_records, encode_batch
from hamq.store.epoch_file import EpochFile
from harness import Cluster
from helpers import free_port, wait_for

CLUSTER = "TestCluster"
GROUP = "ctl"
TOPIC = "Ctl"
QUEUES = 2
MEMBERS = ("m1", "m2", "m3")
HEARTBEAT_TIMEOUT_MS = 1500  # controller_heartbeat_timeout_ms (the default)
ELECTION_TIMEOUT_MS = 1000  # controller_election_timeout_ms (the default)
BODY_BYTES = 256
PULL_ANSWERS = (  # a pull's answers that are not errors
    ResponseCode.SUCCESS,
    ResponseCode.PULL_NOT_FOUND,
    ResponseCode.PULL_OFFSET_MOVED,
    ResponseCode.PULL_RETRY_IMMEDIATELY,
)

# Fast enough for a test, slow enough for a loaded 2-core machine.
CONTROLLER_SETTINGS = {
    "controller_heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS,
    "controller_election_timeout_ms": ELECTION_TIMEOUT_MS,
}
MEMBER_SETTINGS = {
    "broker_name": GROUP,
    "enable_controller_mode": True,
    "all_ack_in_sync_state_set": True,
    "controller_heartbeat_interval_ms": 300,
    "sync_broker_metadata_period_ms": 500,
    "check_sync_state_set_period_ms": 300,
    "ha_send_heartbeat_interval_ms": 200,
    "slave_sync_interval_ms": 500,
    "sync_broker_member_group_period_ms": 300,
    "broker_heartbeat_interval_ms": 500,
}


def body_of(n: int) -> bytes:
    """A distinct, checkable body per send attempt (a prefix to read, bytes to compare)."""
    head = b"send-%07d:" % n
    return head + hashlib.sha256(head).digest() * (BODY_BYTES // 32)


def commit_offset(msg_id: str) -> int:
    """Where an acknowledged message sits in the commit log (its offset message id)."""
    return int(msg_id[:16], 16)


@dataclass(frozen=True)
class Ack:
    """One acknowledged send: what was sent, where the broker said it is, when the send
    began and when its answer was read (``at``: an upper bound of when it was given)."""

    body: bytes
    queue_id: int
    queue_offset: int
    commit_offset: int
    began: float
    at: float


class ControllerGroup:
    """A name server and ``controllers`` standalone controller peers (or ``embedded``:
    that many name servers, each with a controller peer) and the members of one group."""

    def __init__(
        self,
        cluster_factory,
        controllers: int = 1,
        controller_settings: dict | None = None,
        embedded: bool = False,
        **member_settings,
    ) -> None:
        self.c = cluster_factory()
        liveness = {"scan_not_active_broker_interval_ms": 300, "broker_not_active_timeout_ms": 2000}
        if not embedded:
            self.c.start_namesrv(**liveness)
        self.controller_addrs = {
            f"c{i}": f"127.0.0.1:{free_port()}" for i in range(1, controllers + 1)
        }
        peers = [f"{name[1:]}@{addr}" for name, addr in self.controller_addrs.items()]
        for name, addr in self.controller_addrs.items():
            settings = {
                "controller_self_id": int(name[1:]),
                "controller_peers": peers if controllers > 1 else [],
                **CONTROLLER_SETTINGS,
                **(controller_settings or {}),
            }
            if embedded:
                self.c.start_embedded_controller(name, addr, **liveness, **settings)
            else:
                self.c.start_controller(name, addr, **settings)
        # each member's own proxies to every controller peer and to every name server
        self.controller_proxies: dict[str, list[FaultProxy]] = {}
        self.namesrv_proxies: dict[str, list[FaultProxy]] = {}
        for m in MEMBERS:
            to_controllers = [FaultProxy(a) for a in self.controller_addrs.values()]
            to_namesrvs = [FaultProxy(a) for a in self.c.namesrv_addrs]
            self.controller_proxies[m], self.namesrv_proxies[m] = to_controllers, to_namesrvs
            self.c.start_broker(
                m,
                controller_addr=[p.address for p in to_controllers],
                namesrv=[p.address for p in to_namesrvs],
                **{**MEMBER_SETTINGS, **member_settings},
            )
        self.admin = hamq.Admin(self.c.namesrv)
        self.master()
        wait_for(lambda: GROUP in self._routed_masters(), 20, "the master's route")
        self.admin.create_topic(TOPIC, QUEUES)
        for m in MEMBERS:
            wait_for(lambda m=m: TOPIC in self.topics(m), 20, f"{m} holding the topic")
        self.wait_full_sync_state_set()

    # -- what the controller says --------------------------------------------------------

    def controller_call(self, call, addrs: list[str] | None = None):
        """``call(client)`` against the controller peers (all, or ``addrs``), on the
        admin's event loop."""

        async def run():
            client = ControllerClient(addrs or list(self.controller_addrs.values()))
            try:
                return await call(client)
            finally:
                await client.close()

        return self.admin.submit(run()).result(30)

    def replica_info(self):
        return self.controller_call(lambda cc: cc.get_replica_info(CLUSTER, GROUP))

    def replica_info_or_none(self):
        try:
            return self.replica_info()
        except HamqError:
            return None

    def member_of(self, addr: str | None) -> str | None:
        return next((m for m in MEMBERS if self.c.broker_addr(m) == addr), None)

    def master(self, timeout_s: float = 20.0, other_than: str | None = None) -> str:
        """The member the controller made master, once that member serves as master at
        the controller's epoch (its role change has run)."""

        def find():
            info = self.replica_info_or_none()
            m = self.member_of(info.master_addr) if info else None
            if m is None or m == other_than or not self.c.procs[m].alive():
                return None
            role = self.role(m)
            return role and role["role"] == "master" and role["epoch"] == info.master_epoch and m

        return wait_for(find, timeout_s, "a master serving at the controller's epoch")

    def sync_state_set(self) -> set[str]:
        """The SyncStateSet as the controller holds it (empty while it does not answer)."""
        info = self.replica_info_or_none()
        if info is None:
            return set()
        ids = dict(info.members)
        return {self.member_of(ids[i]) for i in info.sync_state_set}

    def wait_full_sync_state_set(self, timeout_s: float = 30.0) -> None:
        """Every member back in the SyncStateSet (the next failover may pick any)."""
        wait_for(
            lambda: self.sync_state_set() == set(MEMBERS),
            timeout_s,
            "every member in the SyncStateSet",
        )

    def controller_leader(self) -> str:
        """The controller peer that is the Raft leader, asked of every live peer."""

        def find():
            for name, addr in self.controller_addrs.items():
                if not self.c.procs[name].alive():
                    continue
                try:
                    meta = self.controller_call(lambda cc: cc.metadata(), [addr])
                except HamqError:
                    continue
                if meta["is_leader"]:
                    return name
            return None

        return wait_for(find, 20, "a controller leader")

    # -- what the members say ------------------------------------------------------------

    def info(self, m: str) -> dict:
        return self.admin.broker_runtime_info(self.c.broker_addr(m))

    def role(self, m: str) -> dict | None:
        try:
            return self.info(m)["role"]
        except HamqError:
            return None

    def log_end(self, m: str) -> int:
        return self.info(m)["commitlog_max_offset"]

    def invoke(self, addr: str, code: int, ext: dict | None = None, **kwargs) -> Frame:
        """One request to one server, on the admin's event loop."""
        core = self.admin.async_client.core
        return self.admin.submit(core.invoke(addr, code, ext, **kwargs)).result(15)

    def topics(self, m: str) -> set[str]:
        try:
            frame = self.invoke(self.c.broker_addr(m), RequestCode.GET_ALL_TOPIC_CONFIG)
        except HamqError:
            return set()
        return set(unpack_body(frame.body) or {})

    def read_member(self, addr: str, start: dict[int, int]) -> dict[tuple[int, int], bytes]:
        """What one member serves a consumer from ``start`` (queue id -> offset), whatever
        the routes say: what a consumer whose route still names a deposed master reads."""
        got: dict[tuple[int, int], bytes] = {}
        for queue_id in range(QUEUES):
            offset = start.get(queue_id, 0)
            for _ in range(10_000):
                ext = {
                    "topic": TOPIC,
                    "queue_id": queue_id,
                    "queue_offset": offset,
                    "max_msgs": 256,
                    "suspend_timeout_ms": 0,
                    "group": "chaos-member-reader",
                }
                try:
                    frame = self.invoke(
                        addr, RequestCode.PULL_MESSAGE, ext, ok=PULL_ANSWERS, timeout_s=2.0
                    )
                except HamqError:
                    break
                if frame.code != ResponseCode.SUCCESS:
                    break
                found = decode_records(frame.body, offset, lambda _h, _i, off, _p, b: (off, b))
                if not found:
                    break
                got.update(((queue_id, off), body) for off, body in found)
                offset = frame.ext["next_begin_offset"]
        return got

    def epochs(self, m: str) -> dict[int, int]:
        """``m``'s epoch file, read from its store: epoch -> its start offset."""
        files = list(Path(self.c.root / m).rglob("*epoch*"))
        assert len(files) == 1, f"one epoch file expected in {m}'s store: {files}"
        return {e.epoch: e.start_offset for e in EpochFile(files[0]).entries()}

    def wait_routed_everywhere(self) -> None:
        """Every name server routes the topic: one that restarted learns it at the members'
        next heartbeat, and until then a client asking it first is told the topic does not
        exist (it asks the next one only when the first does not answer)."""

        def routed(addr: str) -> bool:
            try:
                self.invoke(addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
            except HamqError:
                return False
            return True

        for addr in self.c.namesrv_addrs:
            wait_for(lambda a=addr: routed(a), 20, f"name server {addr} routing {TOPIC}")

    def _routed_masters(self) -> dict[str, str]:
        try:
            return self.admin.master_addrs()
        except HamqError:
            return {}

    # -- faults ----------------------------------------------------------------------------

    def isolate(self, m: str, namesrv: bool = True) -> None:
        """Cut ``m`` off from every controller peer, and from the name server unless
        ``namesrv`` is false (a controller-only split)."""
        for proxy in self._proxies_of(m) if namesrv else self.controller_proxies[m]:
            proxy.block()

    def heal(self) -> None:
        for m in MEMBERS:
            for proxy in self._proxies_of(m):
                proxy.unblock()

    def _proxies_of(self, m: str) -> list[FaultProxy]:
        return [*self.controller_proxies[m], *self.namesrv_proxies[m]]

    def freeze(self, name: str) -> None:
        os.kill(self.c.procs[name].pid, signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        os.kill(self.c.procs[name].pid, signal.SIGCONT)

    def close(self) -> None:
        for name, proc in self.c.procs.items():
            if proc.alive():
                self.thaw(name)  # a stopped process cannot act on SIGTERM
        self.admin.close()
        for m in MEMBERS:
            for proxy in self._proxies_of(m):
                proxy.stop()

    # -- after the faults --------------------------------------------------------------------

    def assert_identical_logs(self, members: tuple[str, ...] = MEMBERS) -> None:
        """Caught up, the members' commit logs are equal byte for byte (stopped first)."""
        wait_for(
            lambda: len({self.log_end(m) for m in members}) == 1,
            30,
            "every member at the same log end",
        )
        self.c.stop_all()
        logs = {
            m: b"".join(
                p.read_bytes() for p in sorted(Path(self.c.root / m / "commitlog").iterdir())
            )
            for m in members
        }
        assert len(set(logs.values())) == 1, "the members' commit logs differ"


@contextmanager
def module_group(tmp_path_factory, name: str, **member_settings) -> Iterator[ControllerGroup]:
    """A ``ControllerGroup`` for a module-scoped fixture: every process it started is
    stopped afterwards, also when the group fails to come up (no ``cluster_factory`` there
    to stop them)."""
    cluster = Cluster(tmp_path_factory.mktemp(name))
    try:
        group = ControllerGroup(lambda: cluster, **member_settings)
        try:
            yield group
        finally:
            group.close()
    finally:
        cluster.stop_all()


class SteadyProducer(threading.Thread):
    """One send at a time through the name server's route, a fresh body per attempt."""

    def __init__(self, namesrv: str, start: int = 0) -> None:
        super().__init__(daemon=True)
        self.namesrv = namesrv
        self.next = start
        self.acks: list[Ack] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        with hamq.Producer(self.namesrv, send_timeout_s=2.0) as producer:
            while not self.stop_flag.is_set() and self.next < 1_000_000:
                body = body_of(self.next)
                self.next += 1
                began = time.monotonic()
                try:
                    r = producer.send(Message(TOPIC, body))
                except HamqError:
                    time.sleep(0.05)
                    continue
                if r.status is SendStatus.SEND_OK:
                    self.acks.append(
                        Ack(
                            body,
                            r.queue.queue_id,
                            r.queue_offset,
                            commit_offset(r.msg_id),
                            began,
                            time.monotonic(),
                        )
                    )

    def acked_since(self, t: float) -> list[Ack]:
        """Acknowledged sends begun after ``t``: one answered before ``t`` whose answer
        was read late is not among them."""
        return [a for a in self.acks if a.began > t]

    def finish(self) -> None:
        self.stop_flag.set()
        self.join(15)
        assert not self.is_alive(), "the producer did not stop"


class PinnedSender:
    """Sends straight to one broker address, whatever the routes say: what a producer
    with a stale route does to a master that was cut off."""

    def __init__(self, admin: hamq.Admin, addr: str, timeout_s: float = 1.0) -> None:
        self.admin = admin
        self.addr = addr
        self.timeout_s = timeout_s
        self.uniq_keys = UniqKeys()
        self.acks: list[Ack] = []
        self.refused: list[str] = []

    def send(self, n: int) -> None:
        """One send, waited for."""
        self.send_all([n])

    def send_all(self, ns: list[int], timeout_s: float | None = None) -> None:
        """Sends ``ns`` at once (each waits up to ``timeout_s``), then takes the answers."""
        timeout_s = timeout_s or self.timeout_s
        began = time.monotonic()
        futures = {n: self.admin.submit(self._send(n, timeout_s)) for n in ns}
        for n, future in futures.items():
            try:
                frame = future.result(timeout_s + 5)
            except HamqError as err:
                self.refused.append(type(err).__name__)
                continue
            x = frame.ext
            self.acks.append(
                Ack(
                    body_of(n),
                    n % QUEUES,
                    x["queue_offset"],
                    commit_offset(x["msg_id"]),
                    began,
                    time.monotonic(),
                )
            )

    async def _send(self, n: int, timeout_s: float):
        encoded = Message(TOPIC, body_of(n)).encode(self.uniq_keys.next())
        payload, crc = encode_batch([encoded])
        ext = {"topic": TOPIC, "queue_id": n % QUEUES, "count": 1, "crc": crc, "born_ts": 0}
        return await self.admin.async_client.core.invoke(
            self.addr, RequestCode.SEND_MESSAGE, ext, payload, timeout_s=timeout_s
        )


class Reads:
    """What consumers read, by (queue id, queue offset): what a consumer saw at a queue
    offset must be what is there forever after."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], bytes] = {}
        self.conflicts: list[tuple[int, int, bytes, bytes]] = []

    def next_offsets(self) -> dict[int, int]:
        ends = dict.fromkeys(range(QUEUES), 0)
        for q, off in self.seen:
            ends[q] = max(ends[q], off + 1)
        return ends

    def record(self, got: dict[tuple[int, int], bytes]) -> None:
        for key, body in got.items():
            before = self.seen.setdefault(key, body)
            if before != body:
                self.conflicts.append((*key, before[:16], body[:16]))


class SteadyReader(threading.Thread):
    """Reads every queue to its end through the routes, again and again, while the faults
    happen."""

    def __init__(self, namesrv: str) -> None:
        super().__init__(daemon=True)
        self.namesrv = namesrv
        self.reads = Reads()
        self.stop_flag = threading.Event()

    def run(self) -> None:
        with hamq.PullConsumer("chaos-reader", self.namesrv) as consumer:
            while not self.stop_flag.is_set():
                try:
                    self.reads.record(read_queues(consumer, self.reads.next_offsets()))
                except HamqError:
                    pass
                self.stop_flag.wait(0.1)

    def finish(self) -> None:
        self.stop_flag.set()
        self.join(15)
        assert not self.is_alive(), "the reader did not stop"


def read_queues(consumer, start: dict[int, int] | None = None) -> dict[tuple[int, int], bytes]:
    """Every message from ``start`` (queue id -> offset; 0) to each queue's end, by
    (queue id, queue offset)."""
    got: dict[tuple[int, int], bytes] = {}
    for mq in consumer.fetch_message_queues(TOPIC):
        offset = (start or {}).get(mq.queue_id, 0)
        for _ in range(100_000):
            r = consumer.pull(mq, offset, 256)
            if r.status is not PullStatus.FOUND:
                break
            for m in r.messages:
                got[(mq.queue_id, m.queue_offset)] = m.body
            offset = r.next_begin_offset
    return got


def read_all(namesrv: str) -> dict[tuple[int, int], bytes]:
    with hamq.PullConsumer("chaos-check", namesrv) as consumer:
        return read_queues(consumer)


def assert_acked_readable(acks: list[Ack], stored: dict[tuple[int, int], bytes]) -> None:
    """Every acknowledged message is where its answer said, byte for byte."""
    missing = [a for a in acks if stored.get((a.queue_id, a.queue_offset)) != a.body]
    assert not missing, (
        f"{len(missing)} of {len(acks)} acknowledged messages are not where their answer "
        f"said, e.g. {[(a.body[:13], a.queue_id, a.queue_offset) for a in missing[:5]]}"
    )


def assert_reads_stable(reads: Reads, stored: dict[tuple[int, int], bytes]) -> None:
    """No queue offset was read with two bodies, during the run or against the end state."""
    assert reads.seen, "the reader read nothing"
    assert not reads.conflicts, f"a queue offset was read with two bodies: {reads.conflicts[:5]}"
    changed = [k for k, body in reads.seen.items() if stored.get(k) != body]
    assert not changed, f"messages a consumer read are gone or changed: {changed[:5]}"


def start_traffic(group: ControllerGroup) -> tuple[SteadyProducer, SteadyReader]:
    """The steady producer and reader every scenario runs throughout."""
    producer, reader = SteadyProducer(group.c.namesrv), SteadyReader(group.c.namesrv)
    producer.start()
    reader.start()
    return producer, reader


def assert_nothing_lost(
    group: ControllerGroup,
    producer: SteadyProducer,
    reader: SteadyReader,
    more_acks: list[Ack] | None = None,
    more_reads: Reads | None = None,
) -> None:
    """Stops the traffic; then every acknowledged message is where its answer said, byte
    for byte, no queue offset was read with two bodies, and the members' logs are equal."""
    producer.finish()
    reader.finish()
    stored = read_all(group.c.namesrv)
    assert_acked_readable(producer.acks + (more_acks or []), stored)
    assert_reads_stable(reader.reads, stored)
    if more_reads is not None:
        assert_reads_stable(more_reads, stored)
    group.assert_identical_logs()
