"""The chaos workload on a real master + slave group, no fault: every send acknowledged is
in the final read, every consumer kind receives valid messages that were sent, the ordered
topic keeps each key's seqs increasing, and every history line has the documented shape
(the checker, chaos/checker.py, reads these files)."""

from __future__ import annotations

import collections
import time

import hamq
from hamq.chaos.consumers import KINDS
from hamq.chaos.history import read_history
from hamq.chaos.workload import TOPICS, Workload, final_read
from helpers import wait_for

WORKLOAD_S = 3.0
DRAIN_S = 60.0
FINAL_READ_S = 60.0


def start_group(cluster_factory):
    """A sync master needing its slave in sync (quorum of 2), the chaos topics created."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    c.start_broker("master", broker_role="sync_master", total_replicas=2, in_sync_replicas=2)
    c.start_broker("slave", broker_id=1, broker_role="slave", total_replicas=2)
    with hamq.Admin(c.namesrv) as admin:
        addr = c.broker_addr("master")
        wait_for(
            lambda: (
                [s["state"] for s in admin.broker_runtime_info(addr)["ha"]["slaves"]]
                == ["TRANSFER"]
            ),
            30,
            "slave connected",
        )
        for topic, queues in TOPICS.items():
            admin.create_topic(topic, queues)
    return c


def test_workload_histories_and_final_read(cluster_factory, tmp_path):
    c = start_group(cluster_factory)
    history_dir = tmp_path / "history"
    workload = Workload(c.namesrv, history_dir, seed=11)
    try:
        workload.start()
        time.sleep(WORKLOAD_S)  # the workload's length, not a wait for a condition
        workload.stop_producers()
        assert workload.acked() > 0
        assert workload.drain(DRAIN_S) == dict.fromkeys(KINDS, 0)
        assert workload.unsupported() == {}  # a master-slave group serves every kind
    finally:
        workload.stop()
    final = history_dir / "final.jsonl"
    final_read(c.namesrv, TOPICS, final, FINAL_READ_S)

    sends = [line for p in (0, 1) for line in read_history(history_dir / f"producer-{p}.jsonl")]
    invoked = {s["id"]: s for s in sends if s["type"] == "invoke"}
    outcomes = [s for s in sends if s["type"] != "invoke"]
    ok = {s["id"] for s in outcomes if s["type"] == "ok"}
    assert len(ok) == workload.acked()
    # one outcome per invoke; no fault, so every send is acknowledged
    assert sorted(s["id"] for s in outcomes) == sorted(invoked)
    assert {s["type"] for s in outcomes} == {"ok"}
    assert {s["topic"] for s in invoked.values()} == set(TOPICS)
    for s in outcomes:
        assert s["queue"].startswith("broker-a/") and s["offset"] >= 0
    for p in (0, 1):  # a key's next send is invoked only after its previous one's outcome
        in_flight: set[str] = set()
        for s in read_history(history_dir / f"producer-{p}.jsonl"):
            if s["type"] == "invoke":
                assert s["key"] not in in_flight, s
                in_flight.add(s["key"])
            else:
                in_flight.remove(s["key"])

    reads = read_history(final)
    assert ok <= {r["id"] for r in reads}
    assert all(r["valid"] for r in reads)
    assert len(reads) == len({r["id"] for r in reads})  # no copies
    seqs_by_key: dict[str, list[int]] = {}
    for r in reads:
        assert r["key"] == invoked[r["id"]]["key"] and r["seq"] == invoked[r["id"]]["seq"]
        if r["topic"] == "chaos-ordered":
            seqs_by_key.setdefault((r["key"], r["queue"]), []).append(r["seq"])
    assert len({key for key, _ in seqs_by_key}) == 8  # 2 producers x 4 keys, one queue each
    for seqs in seqs_by_key.values():
        assert seqs == sorted(seqs)

    for kind in KINDS:
        lines = read_history(history_dir / f"consumer-{kind}-0.jsonl")
        received = [line for line in lines if line["op"] == "receive"]
        acks = {line["id"] for line in lines if line["op"] == "ack"}
        assert received, kind
        assert all(r["valid"] and r["id"] in invoked for r in received), kind
        assert all(r["queue"].startswith("broker-a/") for r in received), kind
        assert acks == {r["id"] for r in received}, kind  # no fault: every one acked
        if kind == "orderly":  # each key's messages handed over in the order sent
            first_seqs: dict[str, list[int]] = {}
            for r in received:
                first_seqs.setdefault(invoked[r["id"]]["key"], []).append(invoked[r["id"]]["seq"])
            assert set(first_seqs) <= {f"k{p}-{j}" for p in (0, 1) for j in range(4)}
            assert all(seqs == sorted(seqs) for seqs in first_seqs.values())
    for path in history_dir.glob("*.jsonl"):
        lines = read_history(path)
        assert [line["n"] for line in lines] == list(range(len(lines))), path.name


def test_refusals_are_failures_and_acknowledged_sends_survive(cluster_factory, tmp_path):
    """The slave killed mid-run: the master refuses sends before storing them (not enough
    replicas in sync), and those are recorded ``fail``, never ``ok``; once the slave is
    back, sends are acknowledged again and the final read holds every acknowledged one."""
    c = start_group(cluster_factory)
    history_dir = tmp_path / "history"
    workload = Workload(c.namesrv, history_dir, seed=12, consumers=("pull",))
    try:
        workload.start()
        wait_for(lambda: workload.acked() > 20, 30, "sends acknowledged")
        c.procs["slave"].kill9()
        sends = history_dir / "producer-0.jsonl"
        wait_for(
            lambda: any(line.get("type") == "fail" for line in read_history(sends)),
            30,
            "a send refused",
        )
        c.procs["slave"].start()
        acked = workload.acked()
        wait_for(lambda: workload.acked() > acked + 20, 60, "sends acknowledged again")
        workload.stop_producers()
        assert workload.drain(DRAIN_S) == {"pull": 0}
    finally:
        workload.stop()
    final_read(c.namesrv, TOPICS, history_dir / "final.jsonl", FINAL_READ_S)
    lines = [line for p in (0, 1) for line in read_history(history_dir / f"producer-{p}.jsonl")]
    outcomes = collections.Counter(line["id"] for line in lines if line["type"] != "invoke")
    assert set(outcomes.values()) == {1}  # exactly one outcome per send
    fails = [line for line in lines if line["type"] == "fail"]
    assert {f["error"].split(":")[0] for f in fails} <= {
        "InSyncReplicasNotEnough",
        "ServiceNotAvailable",
        "TopicNotExist",
    }
    ok = {line["id"] for line in lines if line["type"] == "ok"}
    read = {r["id"] for r in read_history(history_dir / "final.jsonl")}
    assert ok <= read
    assert not read & {f["id"] for f in fails}  # a failed send is one never stored
