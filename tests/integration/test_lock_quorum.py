"""Issue 15 scope 2 and 7 (seed 004, RIP-32 "锁Quorum"), real processes: a group of a master
and two slaves with slave acting master on and a short broker lock lease.

Two consumers are played by raw LOCK_BATCH_MQ requests from two client ids, so each step is
exact: who asks which member, and what every member says it holds (GET_BROKER_RUNTIME_INFO's
``queue_locks``). In strict mode they never both hold a queue: not in normal operation, not
while a slave acts for the killed master, not when the master returns with no locks. In the
default mode they do once the master returns: the seed's reason for strict mode. A real
ordered push consumer keeps consuming through the acting master past the lock lease."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from itertools import count, pairwise
from pathlib import Path

import pytest

import hamq
from hamq import Message
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import encode_frame_bytes, pack_body, unpack_body
from helpers import wait_for

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from orderly_consumer import FAST_ORDERLY

TOPIC = "Locked"
QUEUE_IDS = frozenset(range(4))
GROUP = "g-ordered"
LEASE_MS = 3000  # the broker's lock lease (60 s by default), so lapses happen in the test
RENEW_S = LEASE_MS / 1000 / 4  # a consumer renews well within the lease
SETTLE_S = 20.0
MEMBERS = ("m", "s1", "s2")


def _start_group(cluster_factory, raw_conn, strict: bool, lease_ms: int = LEASE_MS, **settings):
    c = cluster_factory()
    c.start_namesrv(
        scan_not_active_broker_interval_ms=500,
        broker_not_active_timeout_ms=3000,
        support_acting_master=True,
    )
    common = {
        "total_replicas": 3,
        "enable_slave_acting_master": True,
        "lock_in_strict_mode": strict,
        "rebalance_lock_max_live_time_ms": lease_ms,
        "skip_pre_online": True,
        "slave_sync_interval_ms": 500,
        **settings,
    }
    c.start_broker("m", **common)
    c.start_broker("s1", broker_id=1, broker_role="slave", **common)
    c.start_broker("s2", broker_id=2, broker_role="slave", **common)
    with hamq.Admin(c.namesrv) as admin:
        wait_for(admin.master_addrs, SETTLE_S, "the master to register")
        admin.create_topic(TOPIC, len(QUEUE_IDS))
    probe = Locker("probe", raw_conn)
    for m in MEMBERS:  # every member knows the topic and the whole group
        wait_for(
            lambda m=m: _alive_replicas(c, m) == 3 and probe.has_topic(c.broker_addr(m)),
            SETTLE_S,
            f"{m} to know the topic and its group",
        )
    if strict:  # a member grants nothing for a lease after it starts (client_processor.py)
        for m in MEMBERS:
            probe.join(c.broker_addr(m))
        master = c.broker_addr("m")
        wait_for(
            lambda: (
                probe.lock(master) == QUEUE_IDS
                and all(_owners(c, x) == _all("probe") for x in MEMBERS)
            ),
            SETTLE_S + lease_ms / 1000,
            "every member to grant locks",
        )
        probe.unlock(master)
        for m in MEMBERS:  # no consumer of the group any more (a push consumer rebalances)
            probe.ask(c.broker_addr(m), RequestCode.UNREGISTER_CLIENT, {"client_id": "probe"})
    return c


class Locker:
    """A consumer client id with a connection to each member it talks to (a lock is only
    granted to a client that heartbeats on a live connection)."""

    _opaque = count(1)

    def __init__(self, client_id: str, raw_conn) -> None:
        self.client_id = client_id
        self.raw_conn = raw_conn
        self.conns: dict[str, object] = {}

    def ask(self, addr: str, code: int, ext: dict, body: bytes = b""):
        conn = self.conns.get(addr) or self.raw_conn(addr)
        self.conns[addr] = conn
        opaque = next(self._opaque)
        conn.send(encode_frame_bytes(code, opaque, ext=ext, body=body))
        while (answer := conn.read_frame()) is not None and answer.is_oneway:
            pass  # NOTIFY_CONSUMER_IDS_CHANGED and the like
        assert answer is not None and answer.opaque == opaque, answer
        return answer

    def join(self, addr: str) -> None:
        """A fresh connection to ``addr`` (a restarted member) and a heartbeat on it."""
        self.conns.pop(addr, None)
        body = {
            "client_id": self.client_id,
            "consumer_groups": [
                {"group": GROUP, "message_model": "clustering", "subscriptions": {TOPIC: "*"}}
            ],
        }
        answer = self.ask(addr, RequestCode.HEART_BEAT, {}, pack_body(body))
        assert answer.code == ResponseCode.SUCCESS, answer

    def lock(self, addr: str, **ext) -> set[int]:
        answer = self.ask(addr, RequestCode.LOCK_BATCH_MQ, {**self._ext(), **ext}, _queues())
        assert answer.code == ResponseCode.SUCCESS, answer
        return {q for t, q in unpack_body(answer.body)}

    def unlock(self, addr: str) -> None:
        answer = self.ask(addr, RequestCode.UNLOCK_BATCH_MQ, self._ext(), _queues())
        assert answer.code == ResponseCode.SUCCESS, answer

    def has_topic(self, addr: str) -> bool:
        answer = self.ask(addr, RequestCode.GET_ALL_TOPIC_CONFIG, {})
        return TOPIC in unpack_body(answer.body)

    def _ext(self) -> dict:
        return {"group": GROUP, "client_id": self.client_id}


def _queues() -> bytes:
    return pack_body([[TOPIC, q] for q in sorted(QUEUE_IDS)])


def _owners(c, member: str) -> dict[int, str]:
    """Queue id -> the client ``member`` says holds it (live locks only)."""
    with hamq.Admin(c.namesrv) as admin:
        locks = admin.broker_runtime_info(c.broker_addr(member))["queue_locks"]
    return {int(k.rsplit(":", 1)[1]): v for k, v in locks.get(GROUP, {}).items()}


def _all(client_id: str) -> dict[int, str]:
    return dict.fromkeys(QUEUE_IDS, client_id)


def _alive_replicas(c, member: str) -> int:
    with hamq.Admin(c.namesrv) as admin:
        return admin.broker_runtime_info(c.broker_addr(member))["alive_replicas"]


@contextmanager
def renewing(locker: Locker, addr: str):
    """``locker`` renews its queues through ``addr`` every RENEW_S in a thread of its own,
    as a consumer does while the test restarts members and waits; each renewal must hold
    them all. The caller does not use ``locker`` meanwhile."""
    stop = threading.Event()
    answers: list[set[int]] = []

    def loop() -> None:
        while not stop.is_set():
            answers.append(locker.lock(addr))
            stop.wait(RENEW_S)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(RENEW_S + 10)
    assert answers and all(held == QUEUE_IDS for held in answers), answers


@pytest.fixture
def strict_group(cluster_factory, raw_conn):
    """A strict-mode group and the two consumers A and B."""
    c = _start_group(cluster_factory, raw_conn, strict=True)
    return c, Locker("client-a", raw_conn), Locker("client-b", raw_conn)


def test_strict_mode_never_lets_two_consumers_hold_a_queue(strict_group):
    c, a, b = strict_group
    m, s1, s2 = (c.broker_addr(x) for x in MEMBERS)
    for member in (m, s1, s2):
        a.join(member)
        b.join(member)

    # (a) normal operation: A locks through the master, which takes the whole group with it
    assert a.lock(m) == QUEUE_IDS
    for member in (m, s1, s2):  # B is refused whichever member it asks
        assert b.lock(member) == set()
    for x in MEMBERS:
        assert _owners(c, x) == _all("client-a"), x

    # (b) the master is killed; A renews through the acting master for two leases while B
    # asks every member left each time: a majority never forms for B
    c.procs["m"].kill9()
    with renewing(a, s1):
        wait_for(lambda: _alive_replicas(c, "s1") == 2, SETTLE_S, "s1 to see the master gone")
    deadline = time.monotonic() + 2 * LEASE_MS / 1000
    while time.monotonic() < deadline:
        assert a.lock(s1) == QUEUE_IDS
        assert b.lock(s1) == set()
        assert b.lock(s2) == set()
        time.sleep(RENEW_S)
    for x in ("s1", "s2"):
        assert _owners(c, x) == _all("client-a"), x

    # (c) the master returns with no locks; B, whose route already points at it, is
    # granted there alone, short of a quorum: refused, and released on the master again
    with renewing(a, s1):  # A's route still names the acting master
        c.procs["m"].start()
        wait_for(lambda: _alive_replicas(c, "s1") == 3, SETTLE_S, "s1 to see the master back")
        wait_for(lambda: _alive_replicas(c, "m") == 3, SETTLE_S, "the master to see its group")
        b.join(m)
        assert b.lock(m) == set()
        assert _owners(c, "m") == {}
    a.join(m)
    assert a.lock(m) == QUEUE_IDS  # and through the master once its route moved (s1, s2)
    wait_for(  # the master grants too once a lease has passed since it started
        lambda: a.lock(m) == QUEUE_IDS and _owners(c, "m") == _all("client-a"),
        SETTLE_S,
        "the master to grant A's renewal",
    )
    for x in MEMBERS:
        assert _owners(c, x) == _all("client-a"), x

    # an unlock is forwarded too: released on every member, B takes the queues at once
    a.unlock(m)
    for x in MEMBERS:
        assert _owners(c, x) == {}, x
    assert b.lock(s2) == QUEUE_IDS
    assert a.lock(m) == set()


def test_only_this_broker_from_a_client_wins_no_quorum(strict_group):
    """A client marking its request as forwarded locks on that member alone and is told
    so; the member counts as one grant for it, so no other client is let in by it, and the
    client itself cannot reach a majority that way against a holder."""
    c, a, b = strict_group
    m, s1, s2 = (c.broker_addr(x) for x in MEMBERS)
    for member in (m, s1, s2):
        a.join(member)
        b.join(member)
    assert b.lock(s2, only_this_broker=True) == QUEUE_IDS  # one member, as asked
    assert _owners(c, "m") == {} and _owners(c, "s1") == {}
    assert a.lock(m) == QUEUE_IDS  # m and s1 are a majority without s2
    assert b.lock(s2, only_this_broker=True) == QUEUE_IDS  # B's own lock on s2, renewed
    assert b.lock(m) == set()  # but never a majority while A holds m and s1
    bad = b.ask(m, RequestCode.LOCK_BATCH_MQ, {**b._ext(), "only_this_broker": "yes"}, _queues())
    assert bad.code == ResponseCode.INVALID_ARGUMENT and "only_this_broker" in bad.remark
    assert _owners(c, "m") == _all("client-a")  # the refused request changed nothing


def test_a_member_alone_locks_for_nobody_and_keeps_a_renewal_that_fell_short(strict_group):
    """Strict mode puts order before availability: with both slaves gone the master alone
    is no majority, so nothing is locked; A's renewal that fell short is not released
    there (A may still be in the batch in hand), so B is kept off until it lapses."""
    c, a, b = strict_group
    m = c.broker_addr("m")
    for member in MEMBERS:
        a.join(c.broker_addr(member))
    b.join(m)
    assert a.lock(m) == QUEUE_IDS
    c.procs["s1"].kill9()
    c.procs["s2"].kill9()

    def renewed_alone() -> bool:
        held = a.lock(m)  # A keeps renewing (short each time) while the slaves drop out
        return _alive_replicas(c, "m") == 1 and held == set()

    wait_for(renewed_alone, SETTLE_S, "the master to see its slaves gone")
    assert _owners(c, "m") == _all("client-a")
    assert b.lock(m) == set()
    wait_for(lambda: _owners(c, "m") == {}, SETTLE_S, "A's lock to lapse")
    assert b.lock(m) == set()  # and B's own grant, short too, is released again
    assert _owners(c, "m") == {}


def test_default_mode_lets_two_consumers_hold_a_queue_when_the_master_returns(
    cluster_factory, raw_conn
):
    """Why strict mode exists (the seed's 锁Quorum): a lock is one member's. A keeps its
    queues on the acting master; the master returns knowing no locks and grants them to
    B, whose route already points at it: both consume the same queues (out of order,
    twice) until A's next renewal on the master is refused."""
    c = _start_group(cluster_factory, raw_conn, strict=False)
    a, b = Locker("client-a", raw_conn), Locker("client-b", raw_conn)
    m, s1 = c.broker_addr("m"), c.broker_addr("s1")
    for member in (m, s1):
        a.join(member)
        b.join(member)
    assert a.lock(m) == QUEUE_IDS
    assert _owners(c, "s1") == {}  # nothing is forwarded
    c.procs["m"].kill9()
    wait_for(lambda: _alive_replicas(c, "s1") == 2, SETTLE_S, "s1 to see the master gone")
    with renewing(a, s1):  # through the acting master, where A's route points
        c.procs["m"].start()
        wait_for(lambda: _alive_replicas(c, "m") == 3, SETTLE_S, "the master to see its group")
        b.join(m)
        assert b.lock(m) == QUEUE_IDS
        assert _owners(c, "s1") == _all("client-a")
        assert _owners(c, "m") == _all("client-b")  # the double hold


def send_keys(c, keys: list[str], rounds: int) -> None:
    """``rounds`` messages "<key> <seq>" per key, in order, each key to one queue; returns
    once every member has them all (replication is asynchronous; the master may be killed)."""
    with hamq.Producer(c.namesrv) as producer:
        for seq in range(rounds):
            for key in keys:
                producer.send_orderly(Message(TOPIC, f"{key} {seq}".encode()), key)
    with hamq.Admin(c.namesrv) as admin:
        end = admin.broker_runtime_info(c.broker_addr("m"))["commitlog_max_offset"]
        for x in ("s1", "s2"):
            wait_for(
                lambda x=x: (
                    admin.broker_runtime_info(c.broker_addr(x))["commitlog_max_offset"] >= end
                ),
                SETTLE_S,
                f"{x} to have the whole log",
            )


def test_ordered_consumption_continues_past_the_lease_through_the_acting_master(strict_group):
    c = strict_group[0]
    keys = [f"key{k}" for k in range(8)]
    rounds = 50
    send_keys(c, keys, rounds)

    consumed: list[tuple[float, str]] = []
    guard = threading.Lock()

    def listener(messages):
        for msg in messages:
            with guard:
                consumed.append((time.monotonic(), msg.body.decode()))
            time.sleep(0.05)  # consumption spans leases even with every queue at once
        return hamq.ConsumeOrderlyStatus.SUCCESS

    consumer = hamq.PushConsumer(
        GROUP,
        c.namesrv,
        consume_from_where="first",
        poll_name_server_interval_s=1.0,
        **FAST_ORDERLY,
    )
    consumer.subscribe(TOPIC, "*")
    consumer.register_message_listener(listener, orderly=True)
    consumer.start()
    try:
        wait_for(lambda: len(consumed) >= 20, SETTLE_S, "consumption to start")
        c.procs["m"].kill9()
        killed = time.monotonic()
        # the consumer's locks are renewed through the acting master, by a quorum of two
        held = _all(consumer.client_id)
        wait_for(
            lambda: _owners(c, "s1") == held and _owners(c, "s2") == held,
            SETTLE_S,
            "the consumer to hold its queues on both slaves",
        )
        wait_for(lambda: len(consumed) >= rounds * len(keys), 60, "every message consumed")
    finally:
        consumer.shutdown()
    last_at = max(at for at, _ in consumed)
    assert last_at - killed > LEASE_MS / 1000, "consumption did not outlast the lease"
    seen: dict[str, list[int]] = {}
    for _, body in consumed:
        key, seq = body.split()
        seen.setdefault(key, []).append(int(seq))
    for key in keys:  # each key in order, none skipped; a lapse may only repeat a stretch
        seqs = seen[key]
        assert seqs[0] == 0 and set(seqs) == set(range(rounds)), key
        assert all(b <= a + 1 for a, b in pairwise(seqs)), (key, seqs)
