"""Break-it tests of pop while a group has no master (issue 15, seed 004), on real processes
(the ActingCluster: group A master + 2 slaves, group B master + slave, remote escape).

- A slave that lagged behind the other one (SIGSTOP) misses the master's last CKs; when it
  acts after the first acting member died, it replays that member's escaped CKs of later
  offsets over a state that never saw the master's: the messages the master handed out
  and nobody acked must still come back (at least once), not be skipped for ever.
- POP_ESCAPED_REVIVE forged by a client: records under A's broker name put into B's revive
  log must not cancel a message A's consumers never acked."""

from __future__ import annotations

import time

from chaos.acting_cluster import ACTING, GROUP_A, ActingCluster
from chaos.acting_cluster import receive_until as receive_bodies
from hamq import Message, MessageQueue
from hamq.broker.pop.escaped import ESCAPED_CK_BASE
from hamq.broker.pop.revive_log import ack_record, ck_record
from hamq.errors import HamqError, RequestTimeout
from hamq.protocol.codes import RequestCode
from helpers import wait_for
from integration.test_pop_acting import (
    CONSUMER_GROUP,
    INVISIBLE_S,
    TOPIC,
    consumer_of,
    escaped_records,
    outage,
    pop_and_ack,
    receive_until,
    wait_acting,
)

MASTER_INVISIBLE_S = 20.0  # the master's pops stay in flight through both kills
# A small HA window, so a frozen slave's socket buffers cannot hold what the master writes
# after a filler: the frozen slave really misses the master's CK.
HA_WINDOW = {"ha_window_bytes": 64 * 1024, "ha_transfer_batch_bytes": 32 * 1024}
FILLER = [Message("PopActingFiller", b"f" * 100_000) for _ in range(3)]


def receive_while_b_frozen(consumer, want: set[bytes], timeout_s: float) -> list:
    """``receive_until`` with B's master frozen: the topic has a queue there too, receive
    asks the groups in turn, and one that reaches B times out. That is the freeze, not a
    failure (CI saw it: a first pop on a1 that did not bring all eight sends the next
    receive to B first)."""
    return receive_bodies(consumer, want, timeout_s, INVISIBLE_S, (RequestTimeout,))


def test_a_lagging_slave_acting_second_redelivers_what_the_master_handed_out(cluster_factory):
    """a2 is frozen while the master pops four messages (their CK reaches a1 only); the
    master is killed, a1 acts and pops the next four, then a1 is killed and a2 acts. a2's
    own log never had the master's CK, and a1's escaped CK names offsets 4..7: the first
    four must come back from a2 all the same (nobody acked them)."""
    ac = ActingCluster(cluster_factory, {TOPIC: 1, "PopActingFiller": 1}, **HA_WINDOW)
    try:
        mq = MessageQueue(TOPIC, GROUP_A, 0)
        with consumer_of(ac) as consumer:  # the group's offset exists on every member
            assert consumer.receive(1, 1.0) == []
        wait_for(lambda: ac.consumer_offset("a2", CONSUMER_GROUP, mq) == 0, 20, "a2 synced")
        bodies = [b"lag%d" % i for i in range(8)]
        ac.send_to(GROUP_A, [Message(TOPIC, b) for b in bodies])
        ac.wait_replicated()
        with ac.frozen("a2"):
            ac.send_to(GROUP_A, FILLER)
            with consumer_of(ac) as consumer:
                first = consumer.receive(4, MASTER_INVISIBLE_S)
            assert {m.body for m in first} == set(bodies[:4])
            end = ac.log_end("a0")
            wait_for(lambda: ac.log_end(ACTING) >= end, 20, "a1 has the master's CK")
            ac.c.procs["a0"].kill9()
            master_end = end
        wait_acting(ac, ACTING)
        assert ac.log_end("a2") < master_end, "a2 got the master's CK: nothing to test"
        with consumer_of(ac) as consumer:  # on a loaded machine a1's first pops may be empty
            second = receive_until(consumer, set(bodies[4:]), 20)
        assert {m.body for m in second} == set(bodies[4:]), "a1 handed out the master's four"
        wait_for(lambda: any(r.kind == "ck" for r in escaped_records(ac)), 20, "a1's CK in B's log")
        ac.c.procs[ACTING].kill9()
        wait_acting(ac, "a2")
        with consumer_of(ac) as consumer:
            again = receive_until(consumer, set(bodies), 40)
        came = {m.body for m in again}
        for popped_at, part in (("the master", set(bodies[:4])), ("a1", set(bodies[4:]))):
            assert came >= part, f"popped at {popped_at}, never again: {part - came}"
    finally:
        ac.close()


def test_a_forged_escaped_ack_does_not_cancel_a_pop_nobody_acked(cluster_factory):
    """A client sends B's master a CK and an ACK under A's broker name naming the eight
    messages a1 handed out (and nobody acked). B must refuse them (no member of A put them),
    else the next acting member replays them and takes the eight for acked: lost."""
    ac = ActingCluster(cluster_factory, {TOPIC: 1})
    try:
        bodies = outage(ac, b"forge")
        with consumer_of(ac) as consumer:
            got = receive_until(consumer, set(bodies), 20)
        popped = {m.body: m for m in got}
        assert set(popped) == set(bodies)
        offsets = sorted(m.queue_offset for m in popped.values())
        forged_ck = ESCAPED_CK_BASE + 12345
        forged = [
            ck_record(
                GROUP_A,
                CONSUMER_GROUP,
                TOPIC,
                int(time.time() * 1000) + 3600_000,
                [(0, offsets, [0] * len(offsets))],
                forged_ck,
            ),
            ack_record(GROUP_A, CONSUMER_GROUP, [(TOPIC, 0, o, forged_ck) for o in offsets]),
        ]
        refused = 0
        for record in forged:
            try:
                ac.invoke(ac.addr("b0"), RequestCode.POP_ESCAPED_REVIVE, body=record)
            except HamqError:
                refused += 1
        wait_for(lambda: escaped_records(ac), 20, "a1's CK in B's log")
        ac.c.procs[ACTING].kill9()
        wait_acting(ac, "a2")
        with consumer_of(ac) as consumer:
            again = receive_until(consumer, set(bodies), 30)
        came = {m.body for m in again}
        assert came == set(bodies), f"never acked, never delivered again: {set(bodies) - came}"
        assert refused == len(forged), "B's master took records no member of A put"
    finally:
        ac.close()


def test_acks_on_the_acting_master_go_through_with_a_member_of_its_group_frozen(
    cluster_factory,
):
    """B's master asks A's members whether they are putting a record before it stores it:
    with a2 frozen (SIGSTOP, still listed by the name server for a while) the answer of a1,
    the putter, is enough, so acks on a1 are answered within the client's timeout."""
    ac = ActingCluster(cluster_factory, {TOPIC: 1})
    try:
        bodies = outage(ac, b"frozen")
        with ac.frozen("a2"):
            with consumer_of(ac) as consumer:
                acked = set(bodies[:4])
                pop_and_ack(consumer, bodies, acked)  # an ack raises if not answered in time
                again = receive_until(consumer, set(bodies) - acked, 30)
            came = {m.body for m in again}
            assert came >= set(bodies) - acked and not came & acked, came
    finally:
        ac.close()


def test_acting_member_killed_before_its_records_reach_the_chosen_master(cluster_factory):
    """B's master frozen (SIGSTOP): a1's pop is answered with its CK still queued, and an
    ack on a1 is not answered (its ACK cannot be stored), so the client does not take it
    for done. a1 is killed with both records unsent; a2 acts. Nothing is lost: every
    message, the one whose ack was never answered too, is delivered again."""
    ac = ActingCluster(cluster_factory, {TOPIC: 1})
    try:
        bodies = outage(ac, b"unsent")
        with ac.frozen("b0"):
            with consumer_of(ac) as consumer:
                got = receive_while_b_frozen(consumer, set(bodies), 20)
                assert {m.body for m in got} == set(bodies)
                try:
                    consumer.ack(got[0])
                    acked = True
                except HamqError:
                    acked = False  # no answer in time: not done
            assert not acked, "an ack was answered before its record was stored anywhere"
            ac.c.procs[ACTING].kill9()
        wait_acting(ac, "a2")
        with consumer_of(ac) as consumer:
            again = receive_until(consumer, set(bodies), 30)
        came = {m.body for m in again}
        assert came == set(bodies), f"lost with a1: {set(bodies) - came}"
    finally:
        ac.close()


def test_a_restarted_acting_member_with_a_torn_target_file_keeps_its_pops_and_acks(
    cluster_factory,
):
    """a1 acts, hands out eight messages, four acked; it is killed, its
    pop_escape_target.json is found torn at its restart (a new target is chosen, broker-b,
    the only other master): whichever of A's members acts next takes a1's records back
    from B's log. The unacked four come again, the acked four never do."""
    ac = ActingCluster(cluster_factory, {TOPIC: 1})
    try:
        bodies = outage(ac, b"torn")
        acked = set(bodies[:4])
        with consumer_of(ac) as consumer:
            pop_and_ack(consumer, bodies, acked)
        target = ac.c.root / ACTING / "pop_escape_target.json"
        assert b"broker-b" in target.read_bytes()
        ac.c.procs[ACTING].kill9()
        target.write_bytes(b'{"broker_na')
        ac.c.procs[ACTING].start()
        wait_for(lambda: ac.runtime(ACTING)["acting_master"]["acting"], 30, "a1 acting again")
        wait_acting(ac, ACTING)
        unacked = set(bodies) - acked
        with consumer_of(ac) as consumer:
            again = receive_until(consumer, unacked, 30)
        came = {m.body for m in again}
        assert came >= unacked, f"not redelivered: {unacked - came}"
        assert not came & acked, f"acked before the restart, delivered again: {came & acked}"
        ac.assert_acting_log_unchanged()
    finally:
        ac.close()


def test_a_retried_ack_is_not_answered_before_the_first_ones_record_is_stored(cluster_factory):
    """B's master frozen: an ack on a1 times out at the client (its ACK record waits), and
    the client tries again. The retry finds the message acked in a1's state; it must wait
    for the same record, not answer OK at once: a1 is then killed with the record unsent,
    and the message comes back from a2 (the client was never told it was acked)."""
    ac = ActingCluster(cluster_factory, {TOPIC: 1})
    try:
        bodies = outage(ac, b"retry")
        with ac.frozen("b0"):
            with consumer_of(ac) as consumer:
                got = receive_while_b_frozen(consumer, set(bodies), 20)
                answered = []
                for _ in range(2):
                    try:
                        consumer.ack(got[0])
                        answered.append(True)
                    except HamqError:
                        answered.append(False)
            ac.c.procs[ACTING].kill9()
        assert answered == [False, False], f"ack answered OK with its record unstored: {answered}"
        wait_acting(ac, "a2")
        with consumer_of(ac) as consumer:
            again = receive_until(consumer, {got[0].body}, 30)
        assert got[0].body in {m.body for m in again}
    finally:
        ac.close()


def test_two_acting_periods_with_different_members_deliver_no_acked_message_again(
    cluster_factory,
):
    """Period one: a1 acts, four of eight acked. a0 returns through pre-online (takes a1's
    state), two more acked there. Period two: a1 and a0 killed, a2 acts: it rebuilds from
    its own log (a0's records) and a1's records in B's log, in that order. Only the last
    two, never acked, come back; none of the six acked does."""
    ac = ActingCluster(cluster_factory, {TOPIC: 1})
    try:
        bodies = outage(ac, b"twice")
        with consumer_of(ac) as consumer:
            got = {m.body: m for m in receive_until(consumer, set(bodies), 20)}
            for body in bodies[:4]:
                consumer.ack(got[body])
        ac.restart_master(TOPIC)
        with consumer_of(ac) as consumer:
            got = {m.body: m for m in receive_until(consumer, set(bodies[4:]), 30)}
            assert set(got) == set(bodies[4:]), f"after the return: {set(got)}"
            for body in bodies[4:6]:
                consumer.ack(got[body])
        ac.wait_replicated()
        ac.c.procs[ACTING].kill9()
        ac.c.procs["a0"].kill9()
        wait_acting(ac, "a2")
        with consumer_of(ac) as consumer:
            again = receive_until(consumer, set(bodies[6:]), 30)
            again += receive_until(consumer, {b"nothing more"}, 3)
        came = [m.body for m in again]
        assert set(came) >= set(bodies[6:]), f"unacked, not delivered again: {came}"
        assert not set(came) & set(bodies[:6]), f"acked, delivered again: {came}"
    finally:
        ac.close()


def test_the_master_returns_while_the_chosen_master_is_down(cluster_factory):
    """a1 acts; four of eight acked (their records in B), then B's master is killed: two
    more acks wait for it and time out at the client. A's master returns through
    pre-online and takes a1's pop state from a1 itself (not from B): the two never acked
    come back, the four acked do not."""
    ac = ActingCluster(cluster_factory, {TOPIC: 1})
    try:
        bodies = outage(ac, b"bdown")
        with consumer_of(ac) as consumer:
            got = {m.body: m for m in receive_until(consumer, set(bodies), 20)}
            for body in bodies[:4]:
                consumer.ack(got[body])
            wait_for(
                lambda: sum(r.kind == "ack" for r in escaped_records(ac)) >= 4,
                20,
                "a1's ACKs in B's log",
            )
            ac.c.procs["b0"].kill9()
            for body in bodies[4:6]:
                try:
                    consumer.ack(got[body])
                except HamqError:
                    pass  # B's master is down: not answered (possibly taken all the same)
        ac.restart_master(TOPIC)
        with consumer_of(ac) as consumer:
            again = receive_until(consumer, set(bodies[6:]), 30)
        came = {m.body for m in again}
        assert came >= set(bodies[6:]), f"the returned master lost {set(bodies[6:]) - came}"
        assert not came & set(bodies[:4]), f"acked, delivered again: {came & set(bodies[:4])}"
    finally:
        ac.close()
