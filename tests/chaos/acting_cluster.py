"""Two master–slave groups with slave acting master on (issue 15, seed 004) for the chaos
tests: group A is a master and two slaves (the one whose master is killed), group B a
master and a slave (where A's acting master escapes delay, transaction and pop messages,
over the network as every member is its own process). Built on tests/harness.py: every
process is stopped by its PID.

Timings are short so a test sees a lock lapse, a half message checked and a member declared
dead within seconds; everything else is each config key's default."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import hamq
from hamq import Message, MessageQueue, TransactionState
from hamq.client.consumer import PullStatus
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, unpack_body
from helpers import wait_for

GROUP_A, GROUP_B = "broker-a", "broker-b"
MEMBERS = {GROUP_A: ("a0", "a1", "a2"), GROUP_B: ("b0", "b1")}  # index = broker id
ACTING = "a1"  # A's slave with the smallest id: the one that acts once a0 is gone
LOCK_LEASE_MS = 3000  # rebalance_lock_max_live_time_ms (60 s by default)
NOT_ACTIVE_MS = 2000  # the name server's broker_not_active_timeout_ms
PERM_READ = 4  # what the name server publishes for an acting master

NAMESRV_SETTINGS = {
    "support_acting_master": True,
    "scan_not_active_broker_interval_ms": 300,
    "broker_not_active_timeout_ms": NOT_ACTIVE_MS,
}
BROKER_SETTINGS = {
    "enable_slave_acting_master": True,
    "enable_remote_escape": True,
    "rebalance_lock_max_live_time_ms": LOCK_LEASE_MS,
    "transaction_check_interval_ms": 500,
    "transaction_timeout_ms": 1000,
    "broker_heartbeat_interval_ms": 300,
    "sync_broker_member_group_period_ms": 300,
    "slave_sync_interval_ms": 500,
    "ha_send_heartbeat_interval_ms": 200,
    "flush_delay_offset_interval_ms": 500,
    "revive_interval_ms": 500,
}


class ActingCluster:
    """The name server and both groups, ``topics`` (name: queues per group) created on both
    masters and copied to every slave."""

    def __init__(self, cluster_factory, topics: dict[str, int], **broker_settings) -> None:
        self.c = cluster_factory()
        self.c.start_namesrv(**NAMESRV_SETTINGS)
        settings = {**BROKER_SETTINGS, **broker_settings}
        for group, members in MEMBERS.items():
            for broker_id, name in enumerate(members):
                self.c.start_broker(
                    name,
                    broker_name=group,
                    broker_id=broker_id,
                    broker_role="slave" if broker_id else "async_master",
                    total_replicas=len(members),
                    **settings,
                )
        self.admin = hamq.Admin(self.c.namesrv)
        wait_for(  # a topic is created on the masters registered by then
            lambda: set(MEMBERS) <= set(self.admin.master_addrs()), 20, "both masters registered"
        )
        for group, members in MEMBERS.items():
            wait_for(lambda m=members: self._slaves_transferring(m), 30, f"{group}'s slaves")
        for topic, queues in topics.items():
            self.admin.create_topic(topic, queues)
        for name in (*MEMBERS[GROUP_A][1:], *MEMBERS[GROUP_B][1:]):
            wait_for(lambda n=name: set(topics) <= self.topics_of(n), 20, f"{name}'s topics")
        for topic in topics:
            wait_for(lambda t=topic: self.routed_master(t, GROUP_A), 20, f"{topic}'s route")
        self.killed_at = 0.0
        self.acting_log_end = 0

    # -- what the servers say ------------------------------------------------------------

    def addr(self, name: str) -> str:
        return self.c.broker_addr(name)

    def invoke(self, addr: str, code: int, ext: dict | None = None, **kwargs) -> Frame:
        """One request to one server, on the admin's event loop."""
        core = self.admin.async_client.core
        return self.admin.submit(core.invoke(addr, code, ext, **kwargs)).result(15)

    def runtime(self, name: str) -> dict:
        return self.admin.broker_runtime_info(self.addr(name))

    def log_end(self, name: str) -> int:
        return self.runtime(name)["commitlog_max_offset"]

    def _slaves_transferring(self, members: tuple[str, ...]) -> bool:
        slaves = self.runtime(members[0])["ha"].get("slaves", [])
        return len(slaves) == len(members) - 1 and all(s["state"] == "TRANSFER" for s in slaves)

    def topics_of(self, name: str) -> set[str]:
        try:
            frame = self.invoke(self.addr(name), RequestCode.GET_ALL_TOPIC_CONFIG)
        except HamqError:
            return set()
        return set(unpack_body(frame.body) or {})

    def route(self, topic: str) -> dict:
        """The name server's route: {"brokers": {group: {id: addr}}, "perm": {group: perm}}
        (empty while it has none)."""
        try:
            frame = self.invoke(
                self.c.namesrv_addrs[0], RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}
            )
        except HamqError:
            return {"brokers": {}, "perm": {}}
        raw = unpack_body(frame.body)
        return {
            "brokers": {
                b["broker_name"]: {int(i): a for i, a in b["broker_addrs"].items()}
                for b in raw["broker_datas"]
            },
            "perm": {q["broker_name"]: q["perm"] for q in raw["queue_datas"]},
        }

    def routed_master(self, topic: str, group: str) -> str | None:
        """The address the route names brokerId 0 of ``group``."""
        return self.route(topic)["brokers"].get(group, {}).get(0)

    def consumer_offset(self, name: str, group: str, mq: MessageQueue) -> int | None:
        ext = {"group": group, "topic": mq.topic, "queue_id": mq.queue_id}
        try:
            return self.invoke(self.addr(name), RequestCode.QUERY_CONSUMER_OFFSET, ext).ext[
                "offset"
            ]
        except HamqError:
            return None

    def delay_offsets(self, name: str) -> dict[str, int]:
        """A member's delay progress: delay level -> the level queue's next offset."""
        frame = self.invoke(self.addr(name), RequestCode.GET_ALL_DELAY_OFFSET)
        return (unpack_body(frame.body) or {}).get("delay_offsets", {})

    # -- the outage ------------------------------------------------------------------------

    def wait_replicated(self) -> None:
        """A's slaves hold the master's whole log (what a kill must not lose for a test)."""
        end = self.log_end("a0")
        for name in MEMBERS[GROUP_A][1:]:
            wait_for(lambda n=name: self.log_end(n) >= end, 20, f"{name} caught up")

    def kill_master(self, topic: str) -> None:
        """kill -9 A's master once its slaves are caught up; returns once the route of
        ``topic`` names A's acting master (a1, read-only) as brokerId 0 and a1 acts, and
        notes a1's log end: the acting master never appends to its own log."""
        self.wait_replicated()
        self.c.procs["a0"].kill9()
        self.killed_at = time.monotonic()
        acting = self.addr(ACTING)
        wait_for(
            lambda: self.routed_master(topic, GROUP_A) == acting,
            20,
            "a1 routed as A's (acting) master",
        )
        assert self.route(topic)["perm"][GROUP_A] == PERM_READ, "the acting master is writable"
        # The name server routes a1 as brokerId 0 before a1 has heard (by its next
        # registration) that it acts: until then it refuses master-only requests.
        wait_for(lambda: self.runtime(ACTING)["acting_master"]["acting"], 20, "a1 knows it acts")
        self.acting_log_end = self.log_end(ACTING)

    def assert_acting_log_unchanged(self) -> None:
        """Nothing but HA replication grows a slave's log, and A has no master to replicate
        from: the acting master's own writes went elsewhere (escaped)."""
        assert self.log_end(ACTING) == self.acting_log_end, (
            f"the acting master appended {self.log_end(ACTING) - self.acting_log_end} bytes "
            "to its own commit log"
        )

    def restart_master(self, topic: str) -> None:
        """A's master back (pre-online first, unless skipped); returns once the route names
        it brokerId 0 again."""
        self.c.procs["a0"].start()
        master = self.addr("a0")
        wait_for(lambda: self.routed_master(topic, GROUP_A) == master, 40, "a0 routed again")

    @contextlib.contextmanager
    def frozen(self, name: str) -> Iterator[None]:
        """``name``'s process stopped (SIGSTOP) in the block and resumed (SIGCONT) after it,
        whatever happens there."""
        pid = self.c.procs[name].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    # -- clients ---------------------------------------------------------------------------

    def send_to(self, group: str, messages: list[Message], queue_id: int = 0) -> None:
        """Each message into ``group``'s queue ``queue_id`` of its topic."""
        with hamq.Producer(self.c.namesrv) as producer:
            for m in messages:
                producer.send(m, MessageQueue(m.topic, group, queue_id))

    def fill_queues(self, topic: str, queues: int, per_queue: int) -> list[MessageQueue]:
        """``per_queue`` messages ``b"<queue id>-<nnn>"`` into each of A's first ``queues``
        queues of ``topic``; returns those queues."""
        mqs = [MessageQueue(topic, GROUP_A, q) for q in range(queues)]
        for mq in mqs:
            self.send_to(
                GROUP_A,
                [Message(topic, b"%d-%03d" % (mq.queue_id, i)) for i in range(per_queue)],
                queue_id=mq.queue_id,
            )
        return mqs

    def commit_offsets(self, group: str, mqs: list[MessageQueue], offset: int) -> None:
        """``group`` commits ``offset`` for each queue through the routes (A's master), and
        the acting member holds it (slave sync) before this returns."""
        with hamq.PullConsumer(group, self.c.namesrv) as consumer:
            for mq in mqs:
                consumer.commit_offset(mq, offset)
        for mq in mqs:
            wait_for(
                lambda mq=mq: self.consumer_offset(ACTING, group, mq) == offset,
                20,
                f"{ACTING} synced {group}'s offset of {mq}",
            )

    def read_queue(self, mq: MessageQueue) -> list[hamq.MessageExt]:
        return read_queue(self.c.namesrv, mq)

    def read_topic(self, topic: str) -> dict[str, list[hamq.MessageExt]]:
        return read_topic(self.c.namesrv, topic)

    def commit_half(self, addr: str, producer_group: str, half_offset: int) -> None:
        """END_TRANSACTION COMMIT of A's half message at ``half_offset`` to ``addr``, as a
        producer sends it."""
        self.invoke(
            addr,
            RequestCode.END_TRANSACTION,
            {
                "group": producer_group,
                "tran_state_table_offset": half_offset,
                "commit_or_rollback": TransactionState.COMMIT_MESSAGE.value,
            },
        )

    def close(self) -> None:
        self.admin.close()


class CheckBack:
    """A transaction producer's check-back listener: COMMIT for the keys in ``committed``
    (their local transaction committed), UNKNOW for the others; each call is noted."""

    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.checks: list[tuple[str, float]] = []  # (key, time.monotonic() of the call)

    def __call__(self, message: Message) -> TransactionState:
        self.checks.append((message.keys, time.monotonic()))
        if message.keys in self.committed:
            return TransactionState.COMMIT_MESSAGE
        return TransactionState.UNKNOW

    def asked_since(self, key: str, since: float) -> bool:
        return any(k == key and at > since for k, at in self.checks)


def halves_on_a(producer: hamq.TransactionProducer, topic: str) -> dict[str, int]:
    """Six undecided half messages of ``topic`` (the producer alternates groups): key ->
    half offset of those that went to A, at least two of them."""
    halves = {}
    for i in range(6):
        key = f"tx-{i}"
        r = producer.send_message_in_transaction(Message(topic, key.encode(), keys=key))
        if r.send_result.queue.broker_name == GROUP_A:
            halves[key] = r.send_result.queue_offset
    assert len(halves) >= 2, f"want two half messages on group A: {halves}"
    return halves


def read_queue(namesrv: str, mq: MessageQueue) -> list[hamq.MessageExt]:
    """Every message of one queue of one group, from its minimum to its end."""
    got: list[hamq.MessageExt] = []
    with hamq.PullConsumer("acting-reader", namesrv) as consumer:
        offset = consumer.min_offset(mq)
        for _ in range(10_000):
            result = consumer.pull(mq, offset, 256)
            if result.status is not PullStatus.FOUND:
                break
            got += result.messages
            offset = result.next_begin_offset
    return got


def read_topic(namesrv: str, topic: str) -> dict[str, list[hamq.MessageExt]]:
    """Every message of ``topic`` in each group that holds it, by group."""
    out: dict[str, list[hamq.MessageExt]] = {}
    with hamq.PullConsumer("acting-reader", namesrv) as consumer:
        queues = consumer.fetch_message_queues(topic)
    for mq in queues:
        out.setdefault(mq.broker_name, []).extend(read_queue(namesrv, mq))
    return out


def receive_until(
    consumer: hamq.SimpleConsumer,
    want: set[bytes],
    timeout_s: float,
    invisible_s: float,
    tolerated: tuple[type[HamqError], ...] = (),
) -> list:
    """Pops until every body of ``want`` came (others may come too), or the time is up.
    A receive that raises one of ``tolerated`` (a group the test froze does not answer:
    receive asks each group in turn) is tried again."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while not want <= {m.body for m in got} and time.monotonic() < deadline:
        try:
            got += consumer.receive(32, invisible_s)
        except tolerated:
            continue
    return got


def keys_by_group(messages: dict[str, list[hamq.MessageExt]]) -> dict[str, list[str]]:
    return {group: [m.keys for m in ms] for group, ms in messages.items()}
