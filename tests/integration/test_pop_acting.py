"""Pop while a group has no master (issue 15, seed 004), with real processes: group A
(master + 2 slaves, slave acting master on) and group B, whose master is where A's acting
master escapes to (remote escape: every member is its own process). After ``kill -9`` of
A's master, the unchanged simple consumer pops from the acting master; what it acks is never
delivered again, what it leaves past its invisible time is; the acting master's commit log
does not grow, and B's revive log holds the CK and ACK records under A's broker name, where
they cancel each other. Then A's master returns: pre-online takes the acting master's pop
state (GET_POP_CHECKPOINT), so the returning master redelivers what was left unacked in the
outage and not what was acked."""

from __future__ import annotations

import hamq
from chaos.acting_cluster import ACTING, GROUP_A, ActingCluster
from chaos.acting_cluster import receive_until as receive_bodies
from hamq import Message
from hamq.broker.pop.escaped import ESCAPED_CK_BASE
from hamq.broker.pop.ledger import apply_record
from hamq.broker.pop.revive_log import KIND_ACK, KIND_CK, REVIVE_LOG_TOPIC, decode_record
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode
from hamq.protocol.message import decode_records
from helpers import wait_for

TOPIC = "PopActing"
CONSUMER_GROUP = "g-pop-acting"
INVISIBLE_S = 2.0


def outage(ac: ActingCluster, prefix: bytes) -> list[bytes]:
    """Eight messages into A's queue, then A's master killed; returns once a1 serves pops."""
    bodies = [prefix + b"%d" % i for i in range(8)]
    ac.send_to(GROUP_A, [Message(TOPIC, b) for b in bodies])
    ac.kill_master(TOPIC)
    wait_acting(ac, ACTING)
    return bodies


def consumer_of(ac: ActingCluster) -> hamq.SimpleConsumer:
    return hamq.SimpleConsumer(CONSUMER_GROUP, ac.c.namesrv, {TOPIC: "*"}, await_duration_s=0.5)


def receive_until(consumer: hamq.SimpleConsumer, want: set[bytes], timeout_s: float) -> list:
    """``acting_cluster.receive_until`` with these tests' invisible time."""
    return receive_bodies(consumer, want, timeout_s, INVISIBLE_S)


def pop_and_ack(consumer: hamq.SimpleConsumer, bodies: list[bytes], acked: set[bytes]) -> None:
    """Pops every body of ``bodies`` (the test fails if one does not come) and acks those
    of ``acked``, each by its latest receipt (a slow loop may have had some again)."""
    latest = {m.body: m for m in receive_until(consumer, set(bodies), 20)}
    assert set(latest) == set(bodies), f"not popped: {set(bodies) - set(latest)}"
    for body in sorted(acked):
        consumer.ack(latest[body])


def wait_acting(ac: ActingCluster, name: str) -> None:
    """``name`` serves pops: routed as A's brokerId 0 and acting (the route may name it
    a moment before its own member-group sync makes it act)."""
    wait_for(lambda: ac.routed_master(TOPIC, GROUP_A) == ac.addr(name), 30, f"{name} routed")
    wait_for(lambda: ac.runtime(name)["acting_master"]["acting"], 20, f"{name} acting")


def escaped_records(ac: ActingCluster) -> list:
    """The records of broker A in B's master's revive log (read as a pull of that topic,
    which has no route: straight from B's master)."""
    records: list = []
    offset = 0
    for _ in range(1000):
        ext = {
            "topic": REVIVE_LOG_TOPIC,
            "queue_id": 0,
            "queue_offset": offset,
            "max_msgs": 256,
            "suspend_timeout_ms": 0,
            "group": "pop-acting-reader",
        }
        try:
            frame = ac.invoke(ac.addr("b0"), RequestCode.PULL_MESSAGE, ext)
        except HamqError:
            break  # nothing more to read
        if not frame.body:
            break
        for revive_offset, body in decode_records(frame.body, offset, _offset_body):
            record = decode_record(revive_offset, body, GROUP_A)
            if record is not None:
                records.append(record)
        offset = frame.ext["next_begin_offset"]
    return records


def _offset_body(header, index, queue_offset, props, body):
    return queue_offset, body


def test_pop_in_the_outage_escapes_its_records_and_survives_the_masters_return(
    cluster_factory,
):
    ac = ActingCluster(cluster_factory, {TOPIC: 1})
    try:
        bodies = outage(ac, b"pa")
        with consumer_of(ac) as consumer:
            acked = set(bodies[:4])
            pop_and_ack(consumer, bodies, acked)
            unacked = set(bodies) - acked
            again = receive_until(consumer, unacked, 30)
            redelivered = {m.body for m in again}
            assert redelivered >= unacked, f"not redelivered: {unacked - redelivered}"
            assert not redelivered & acked, "a message acked on the acting master came back"
            assert all(m.reconsume_times >= 1 for m in again)
        ac.assert_acting_log_unchanged()

        records = wait_for(
            lambda: (r := escaped_records(ac)) and any(x.kind == KIND_ACK for x in r) and r,
            20,
            "A's CK/ACK records in B's revive log",
        )
        cks = [r for r in records if r.kind == KIND_CK]
        assert cks and all(r.ck >= ESCAPED_CK_BASE for r in cks)
        state: dict = {}
        for record in records:  # cancelled against each other where they are
            apply_record(state, record, lambda g, t, q, offsets: min(offsets))
        (queue,) = [s for (g, t, _), s in state.items() if (g, t) == (CONSUMER_GROUP, TOPIC)]
        assert len(queue.inflight) == len(unacked), "B's log does not cancel A's acks"

        # the master returns: pre-online takes the acting master's pop state
        ac.restart_master(TOPIC)
        with consumer_of(ac) as consumer:
            after = receive_until(consumer, unacked, 30)
            came = {m.body for m in after}
            assert came >= unacked, f"the returned master lost {unacked - came}"
            assert not came & acked, f"the returned master replayed acked {came & acked}"
        assert ac.runtime(ACTING)["acting_master"]["acting"] is False
    finally:
        ac.close()


def test_a_second_acting_member_takes_what_the_first_escaped(cluster_factory):
    """A's master is killed, a1 acts: all popped, half acked; then a1 is killed too and a2
    acts. a2 never saw a1's pops and acks (an acting member writes nothing to the group's
    log): it reads them back from B's revive log, so it redelivers the unacked half and
    never the acked one, and its own log does not grow either."""
    ac = ActingCluster(cluster_factory, {TOPIC: 1})
    try:
        bodies = outage(ac, b"pb")
        acked = set(bodies[:4])
        with consumer_of(ac) as consumer:
            pop_and_ack(consumer, bodies, acked)
        second_log_end = ac.log_end("a2")
        ac.c.procs[ACTING].kill9()
        wait_acting(ac, "a2")
        unacked = set(bodies) - acked
        with consumer_of(ac) as consumer:
            again = receive_until(consumer, unacked, 30)
            came = {m.body for m in again}
            assert came >= unacked, f"not redelivered: {unacked - came}"
            assert not came & acked, f"acked on a1, delivered again by a2: {came & acked}"
            assert all(m.reconsume_times >= 1 for m in again)
        assert ac.log_end("a2") == second_log_end, "the second acting member wrote its log"
    finally:
        ac.close()
