"""Push consumers on real brokers: rebalancing as members join and leave, ordered
consumption under a killed member, broadcasting, tag filtering."""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
from pathlib import Path

import hamq
from hamq import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, Message
from helpers import wait_for
from push_consumers import FAST, start_consumer


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, bytes]] = []
        self.by_member: collections.Counter[str] = collections.Counter()

    def listener_for(self, name: str):
        def listener(messages):
            with self.lock:
                self.seen.extend((name, m.body) for m in messages)
                self.by_member[name] += len(messages)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        return listener

    def consumed(self, name: str) -> bool:
        with self.lock:
            return self.by_member[name] > 0


def test_members_join_and_leave_while_20000_messages_flow(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Flow", 8)
    rec = Recorder()
    total = 20_000
    sent: list[bytes] = []

    def produce() -> None:
        with hamq.Producer(cluster.namesrv) as producer:
            deadline = time.monotonic() + 60
            for i in range(0, total, 20):
                batch = [Message("Flow", b"m%05d" % j) for j in range(i, i + 20)]
                producer.send_batch(batch)
                sent.extend(m.body for m in batch)
                time.sleep(0.008)  # pacing, not waiting: ~8 s of traffic to join and leave in
                assert time.monotonic() < deadline

    members = {"a": start_consumer(cluster.namesrv, "flow", "Flow", rec.listener_for("a"))}
    producer = threading.Thread(target=produce)
    producer.start()
    wait_for(lambda: rec.consumed("a"), 15, "member a to consume")
    members["b"] = start_consumer(cluster.namesrv, "flow", "Flow", rec.listener_for("b"))
    wait_for(lambda: rec.consumed("b"), 15, "member b to take queues and consume")
    members["c"] = start_consumer(cluster.namesrv, "flow", "Flow", rec.listener_for("c"))
    wait_for(lambda: rec.consumed("c"), 15, "member c to take queues and consume")
    members.pop("a").shutdown()
    producer.join()
    wait_for(lambda: {b for _, b in rec.seen} >= set(sent), 30, "every message consumed")

    # Settled: the live members hold fair, disjoint shares that cover every queue.
    def flow_queues(c):
        return {mq for mq in c._async.process_queues if mq.topic == "Flow"}

    wait_for(
        lambda: (
            sorted(len(flow_queues(c)) for c in members.values()) == [4, 4]
            and not flow_queues(members["b"]) & flow_queues(members["c"])
        ),
        10,
        "a settled rebalance",
    )
    consumed = collections.Counter(b for _, b in rec.seen)
    duplicates = sum(n - 1 for n in consumed.values())
    print(
        f"\n{len(rec.seen)} deliveries of {total} messages, {duplicates} duplicates "
        f"(around rebalances)"
    )
    assert len(consumed) == total
    assert duplicates < total * 0.05
    assert {name for name, _ in rec.seen} == {"a", "b", "c"}
    for c in members.values():
        c.shutdown()


def test_ordered_consumption_survives_a_killed_member(cluster_factory, tmp_path: Path):
    # A killed member's locks lapse only after the broker's lease (never when its
    # connections close); a short lease keeps the takeover within the test's time.
    cluster = cluster_factory()
    cluster.start_namesrv()
    cluster.start_broker(rebalance_lock_max_live_time_ms=5000)
    with hamq.Admin(cluster.namesrv) as admin:
        wait_for(admin.master_addrs, 10, "the broker to register")
        admin.create_topic("Ordered", 8)
    keys = [f"key{k}" for k in range(50)]
    with hamq.Producer(cluster.namesrv) as producer:
        for seq in range(100):
            for key in keys:
                producer.send_orderly(Message("Ordered", f"{key} {seq}".encode()), key)
    outs = [tmp_path / "c1.out", tmp_path / "c2.out"]
    script = Path(__file__).with_name("orderly_consumer.py")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), cluster.namesrv, "orderly", "Ordered", str(out), "60"],
            stdout=subprocess.PIPE,
        )
        for out in outs
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == b"started"
        wait_for(
            lambda: outs[0].exists() and len(outs[0].read_text().splitlines()) > 500,
            30,
            "the first member to consume",
        )
        procs[0].kill()  # SIGKILL midway: no unlock, no final commit
        procs[0].wait()
        wait_for(lambda: _complete(outs, keys), 60, "all 5,000 messages consumed")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for out in outs:  # within each member, every key strictly in order
        last: dict[str, int] = {}
        for line in out.read_text().splitlines():
            key, seq = line.split()
            assert int(seq) > last.get(key, -1), f"{key} out of order in {out.name}"
            last[key] = int(seq)
    survivor = _by_key(outs[1])
    for key in keys:  # the survivor resumed each key without a gap
        seqs = survivor.get(key, [])
        if seqs:
            assert seqs == list(range(seqs[0], 100)), f"{key} has a gap after the takeover"


def _by_key(out: Path) -> dict[str, list[int]]:
    keyed: dict[str, list[int]] = {}
    if out.exists():
        for line in out.read_text().splitlines():
            key, seq = line.split()
            keyed.setdefault(key, []).append(int(seq))
    return keyed


def _complete(outs: list[Path], keys: list[str]) -> bool:
    seen = set()
    for out in outs:
        for key, seqs in _by_key(out).items():
            seen.update((key, s) for s in seqs)
    return len(seen) == len(keys) * 100


def test_broadcasting_every_member_gets_every_message(cluster, tmp_path: Path):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Bcast", 4)
    rec = Recorder()
    consumers = [
        start_consumer(
            cluster.namesrv,
            "bcast",
            "Bcast",
            rec.listener_for(n),
            message_model="broadcasting",
            offset_store_dir=str(tmp_path),
            instance_name=n,
        )
        for n in ("x", "y")
    ]
    with hamq.Producer(cluster.namesrv) as producer:
        for i in range(200):
            producer.send(Message("Bcast", b"b%d" % i))
    wait_for(lambda: len({(n, b) for n, b in rec.seen}) == 400, 20, "both members to get all")
    for c in consumers:
        c.shutdown()
    # Offsets kept locally, per instance (two members on one host need two names).
    assert sorted(p.parent.name for p in tmp_path.glob("*/bcast.json")) == ["x", "y"]


def test_tag_expression_filters(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Tags", 2)
    got: list[bytes] = []

    def listener(messages):
        got.extend(m.body for m in messages)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = hamq.PushConsumer("tags", cluster.namesrv, **FAST)
    consumer.subscribe("Tags", "TagA || TagB")
    consumer.register_message_listener(listener)
    consumer.start()
    with hamq.Producer(cluster.namesrv) as producer:
        for i, tag in enumerate(["TagA", "TagB", "TagC", None] * 25):
            producer.send(Message("Tags", b"%s-%d" % (str(tag).encode(), i), tags=tag))
    wait_for(lambda: len(got) == 50, 15, "the tagged messages")
    time.sleep(0.5)  # the point: nothing more arrives (other tags would come with these)
    consumer.shutdown()
    assert all(b.startswith((b"TagA", b"TagB")) for b in got) and len(got) == 50


def test_orderly_listener_suspends_and_retries_in_place(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Suspend", 1)
    order: list[bytes] = []
    failures = {"n": 0}

    def listener(messages):
        if messages[0].body == b"s2" and failures["n"] < 2:
            failures["n"] += 1
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        order.extend(m.body for m in messages)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = hamq.PushConsumer("suspend", cluster.namesrv, **FAST)
    consumer.subscribe("Suspend")
    consumer.register_message_listener(listener, orderly=True)
    consumer.start()
    with hamq.Producer(cluster.namesrv) as producer:
        for i in range(5):
            producer.send_orderly(Message("Suspend", b"s%d" % i), "k")
    wait_for(lambda: len(order) == 5, 20, "all five, in order")
    consumer.shutdown()
    assert order == [b"s0", b"s1", b"s2", b"s3", b"s4"] and failures["n"] == 2
