"""Issue 13 item 1: a running member goes master -> slave -> master with no restart.

A DLedger member, under traffic (leadership transfer is the trigger): at each step every
member's role state (``role`` in its runtime info) reports its role and the role-dependent
services actually running, the epoch grows with each new master, no two members claim
mastership in one epoch, the name servers route the master as brokerId 0 and each slave
under its own id, slave metadata sync follows the new master, topic changes are taken by
the master only, and no acknowledged send is lost or repeated.

A master-slave member, whose delay delivery is the role-dependent service with the most
visible effect: a slave does not deliver a due message, its next master delivers it once.
Nothing switches a master-slave member at runtime before controller mode (issue 14), so
that test drives the role state of a broker running in the test's own process."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from hamq import Message
from hamq.broker.role import BrokerRole
from hamq.broker.server import Broker
from hamq.client.admin import AsyncAdmin
from hamq.client.producer import AsyncProducer
from hamq.config import BrokerConfig, load_config
from hamq.errors import HamqError, NotLeader
from hamq.protocol.codes import RequestCode
from hamq.store.metadata import PERM_READ_WRITE
from helpers import read_queue, topic_routed, wait_for

sys.path.insert(0, str(Path(__file__).parents[1] / "chaos"))  # the DLedger group helpers
from test_dledger import (
    Group,
    SteadyProducer,
    _invoke,
    _probe_offset,
    assert_identical_logs,
    consume_all,
)

# What a DLedger member runs in each role (broker/role.py): Raft replicates the log, so no
# HA master or client, and the broker-internal writers (delay delivery, transaction
# check-back, pop revive) would bypass Raft, so they run on no member.
MASTER_SERVICES: list[str] = []
SLAVE_SERVICES = ["slave_sync"]
SETTLE_S = 30.0  # a transfer and the re-registrations that follow, on a loaded machine
STABLE_SAMPLES = 5  # consecutive samples that must agree once a change has settled


class RoleWatch:
    """Samples every member's runtime info; remembers which members claimed mastership in
    which epoch over the whole test (two in one epoch is split brain)."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.masters_by_epoch: dict[int, set[int]] = defaultdict(set)

    def sample(self) -> dict[int, dict]:
        infos = {}
        for m in self.group.members:
            try:
                info = self.group.info(m)
            except HamqError:  # busy or mid-change: the next sample sees it
                continue
            if info["role"]["role"] == "master":
                self.masters_by_epoch[info["role"]["epoch"]].add(m)
            infos[m] = info
        return infos

    def settled(self, master: int) -> dict[int, dict] | None:
        """Every member's role state once ``master`` is the only master, each member runs
        exactly its role's services and is registered under the id of its role, and the
        name servers route the group that way; else None."""
        infos = self.sample()
        expected = {
            m: ("master", MASTER_SERVICES, 0) if m == master else ("slave", SLAVE_SERVICES, m)
            for m in self.group.members
        }
        seen = {
            m: (i["role"]["role"], i["role"]["services"], i["broker_id"]) for m, i in infos.items()
        }
        if seen != expected:
            return None
        addr = self.group.c.broker_addr
        routed = {0 if m == master else m: addr(f"m{m}") for m in self.group.members}
        if self.group.admin.topic_route("Raft").brokers.get("dl") != routed:
            return None
        return {m: i["role"] for m, i in infos.items()}

    def wait_settled(self, master: int) -> dict[int, dict]:
        wait_for(lambda: self.settled(master), SETTLE_S, f"member {master} as the only master")
        samples = [self.settled(master) for _ in range(STABLE_SAMPLES)]
        assert all(samples), f"roles did not stay settled with {master} as master: {samples}"
        assert all(r["broker_id"] == m for m, r in samples[-1].items()), samples[-1]
        return samples[-1]


def test_member_goes_master_slave_master_under_traffic(cluster_factory):
    group = Group(cluster_factory, slave_sync_interval_ms=300)
    try:
        producer = SteadyProducer(group.c.namesrv)
        producer.start()
        try:
            _switch_master_slave_master(group, producer)
        finally:
            producer.stop_flag.set()
            producer.join(10)
        bodies = Counter(consume_all(group.c.namesrv))
        assert set(producer.acked) <= set(bodies), "an acknowledged message was lost"
        repeated = sorted(b for b in producer.acked if bodies[b] > 1)
        assert not repeated, f"acknowledged messages repeat: {repeated[:5]}"
        assert set(bodies) <= producer.attempted, "a message appeared that was never sent"
        assert_identical_logs(group)
    finally:
        group.close()


def _switch_master_slave_master(group: Group, producer: SteadyProducer) -> None:
    """x: master -> slave -> master, each step under traffic and checked once settled."""
    watch = RoleWatch(group)
    x = group.leader()
    y = next(m for m in group.members if m != x)
    first = watch.wait_settled(x)
    _slaves_sync_from(group, x, 10)
    wait_for(lambda: len(producer.acked) > 50, 30, "steady sends to the first master")
    second = _move_leadership(group, watch, producer, first, x, y)
    _slaves_sync_from(group, y, 20)
    with pytest.raises(NotLeader):  # topic changes are the master's alone
        _create_topic_on(group, x, "OnSlave")
    _create_topic_on(group, y, "OnMaster")
    wait_for(lambda: topic_routed(group.admin, "OnMaster"), 15, "the new topic routed")
    _move_leadership(group, watch, producer, second, y, x)
    _slaves_sync_from(group, x, 30)
    split = {e: ms for e, ms in watch.masters_by_epoch.items() if len(ms) > 1}
    assert not split, f"two members were master in one epoch: {split}"


def _move_leadership(
    group: Group,
    watch: RoleWatch,
    producer: SteadyProducer,
    before: dict[int, dict],
    old: int,
    new: int,
) -> dict[int, dict]:
    """Transfer leadership from ``old`` to ``new``; once settled, both have changed role,
    the new master's epoch is past the old one's, and sends go through the new master."""
    moved_at = time.monotonic()
    group.admin.elect("dl", new)
    after = watch.wait_settled(new)
    assert after[new]["epoch"] > before[old]["epoch"], (before, after)
    assert after[old]["changes"] > before[old]["changes"], (before, after)
    assert after[new]["changes"] > before[new]["changes"], (before, after)
    wait_for(lambda: _acked_since(producer, moved_at) > 30, 30, f"sends through {new}")
    return after


def _slaves_sync_from(group: Group, master: int, offset: int) -> None:
    """Slave metadata sync follows the current master: a consumer offset committed there
    reaches every slave."""
    _invoke(
        group,
        master,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"group": "probe", "topic": "Raft", "queue_id": 0, "offset": offset},
    )
    for m in group.members:
        if m != master:
            wait_for(
                lambda m=m: _probe_offset(group, m) == offset,
                15,
                f"member {m} syncing offset {offset} from member {master}",
            )


def _acked_since(producer: SteadyProducer, since: float) -> int:
    return sum(t > since for t in list(producer.acked.values()))


def _create_topic_on(group: Group, m: int, topic: str) -> None:
    _invoke(
        group,
        m,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {"topic": topic, "read_queue_nums": 1, "write_queue_nums": 1, "perm": PERM_READ_WRITE},
    )


DELAY_LEVEL_1_S = 1.0  # RocketMQ's first delay level


def test_delay_delivery_follows_the_role_of_a_master_slave_member(cluster_factory):
    """A delay message sent to a master that becomes a slave before it is due is not
    delivered while the member is a slave (a slave's log is its master's copy), and is
    delivered exactly once when the member is master again."""
    c = cluster_factory()
    c.start_namesrv()
    config = load_config(BrokerConfig, c.write_broker_config("inproc"))

    async def scenario() -> None:
        broker = Broker(config)
        await broker.start()
        admin, producer = AsyncAdmin(c.namesrv), AsyncProducer(c.namesrv)
        try:
            await admin.create_topic("Later", 1)
            await producer.send(Message("Later", b"due in 1 s", delay_level=1))
            sent_at = time.monotonic()
            await broker.role.change(BrokerRole.SLAVE)
            assert time.monotonic() - sent_at < DELAY_LEVEL_1_S, "changed after it was due"
            assert broker.role.info()["services"] == ["ha_client", "slave_sync"]
            # absent until well past its due time: how long it is absent is the point
            await asyncio.sleep(sent_at + 2.5 * DELAY_LEVEL_1_S - time.monotonic())
            assert read_queue(broker.store, "Later") == {}, "a slave delivered a delay message"
            await broker.role.change(BrokerRole.MASTER, config.listen)
            assert broker.role.info()["services"] == [
                "delay_delivery",
                "ha_master",
                "pop_revive",
                "transaction_check",
            ]
            await _until(lambda: read_queue(broker.store, "Later"), "the delivery")
            await _until(
                lambda: broker.schedule.progress.delay_offset(1) == 1,
                "delay progress past the message, so it is never delivered again",
            )
            assert read_queue(broker.store, "Later") == {0: b"due in 1 s"}
        finally:
            await producer.close()
            await admin.close()
            await broker.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


async def _until(predicate, what: str, timeout_s: float = 10.0) -> None:
    """``wait_for`` inside the broker's event loop: polls without blocking it."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)
