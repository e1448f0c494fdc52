"""An offset reset survives a failover (issue 17): a group of three in controller mode,
a push-style group's and a pop group's offsets reset back to the start on the master, the
slaves synced, then the master killed with kill -9 before any consumer commits again. The
new master must serve the reset offsets, not the old ones (slaves take offsets from the
master without ever moving one back, so without a reset generation the rewind never
reached them), and pop the reset group's messages again (it rebuilds the pop state from
the revive log, whose acks from before the reset moved the group past them)."""

from __future__ import annotations

import time

import pytest
from controller_group import MEMBERS, QUEUES, TOPIC, module_group

import hamq
from hamq import Message
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode, ResponseCode
from helpers import wait_for

pytestmark = pytest.mark.slow

GROUP_RESET = "g-reset"
POP_GROUP = "g-pop-reset"
MARKER = "g-sync-marker"  # committed after the reset: a slave holding it synced since
PER_QUEUE = 10


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with module_group(tmp_path_factory, "reset_failover") as group:
        yield group


def offset_on(group, member: str, consumer_group: str, queue_id: int) -> int | None:
    ext = {"group": consumer_group, "topic": TOPIC, "queue_id": queue_id}
    try:
        frame = group.invoke(
            group.c.broker_addr(member),
            RequestCode.QUERY_CONSUMER_OFFSET,
            ext,
            ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
        )
    except HamqError:
        return None
    return frame.ext["offset"] if frame.code == ResponseCode.SUCCESS else None


def commit(group, member: str, consumer_group: str, queue_id: int, offset: int) -> None:
    ext = {"group": consumer_group, "topic": TOPIC, "queue_id": queue_id, "offset": offset}
    group.invoke(group.c.broker_addr(member), RequestCode.UPDATE_CONSUMER_OFFSET, ext)


def test_reset_reaches_the_new_master_after_kill9(group):
    with hamq.Producer(group.c.namesrv, send_timeout_s=5.0) as producer:
        for i in range(PER_QUEUE * QUEUES):
            producer.send(Message(TOPIC, b"m%d" % i))
    master = group.master()
    slaves = [m for m in MEMBERS if m != master]
    popper = hamq.SimpleConsumer(POP_GROUP, group.c.namesrv, {TOPIC: "*"}, await_duration_s=1.0)
    try:
        popped = receive(popper, PER_QUEUE * QUEUES, 30)
        assert len(popped) == PER_QUEUE * QUEUES
        for m in popped:
            popper.ack(m)
        run_reset_and_failover(group, master, slaves, popper)
    finally:
        popper.close()


def receive(popper: hamq.SimpleConsumer, want: int, within_s: float) -> list:
    """Pops until ``want`` messages or the deadline; errors while the routes still name the
    killed master are retried."""
    got: list = []
    until = time.monotonic() + within_s
    while len(got) < want and time.monotonic() < until:
        try:
            got += popper.receive(32, 60)
        except HamqError:
            time.sleep(0.2)
    return got


def run_reset_and_failover(group, master: str, slaves: list[str], popper) -> None:
    ends = {
        q: group.invoke(
            group.c.broker_addr(master), RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queue_id": q}
        ).ext["offset"]
        for q in range(QUEUES)
    }
    assert all(ends.values()), f"a queue got no message: {ends}"
    for queue_id, end in ends.items():
        commit(group, master, GROUP_RESET, queue_id, end)
    for m in slaves:
        for queue_id in range(QUEUES):
            wait_for(
                lambda m=m, q=queue_id: offset_on(group, m, GROUP_RESET, q) == ends[q],
                20,
                f"{m} holding the committed offset of queue {queue_id}",
            )

    for consumer_group in (GROUP_RESET, POP_GROUP):
        rows = group.admin.reset_offset(consumer_group, TOPIC, 0)
        assert {r["queue_id"]: r["new_offset"] for r in rows} == dict.fromkeys(range(QUEUES), 0)
    commit(group, master, MARKER, 0, 1)
    for m in slaves:
        wait_for(lambda m=m: offset_on(group, m, MARKER, 0) == 1, 20, f"{m} synced after the reset")

    group.c.procs[master].kill9()
    new = group.master(timeout_s=40, other_than=master)
    served = {q: offset_on(group, new, GROUP_RESET, q) for q in range(QUEUES)}
    assert served == dict.fromkeys(range(QUEUES), 0), (
        f"the new master {new} serves {served}, not the reset offsets (old: {ends})"
    )
    again = receive(popper, PER_QUEUE * QUEUES, 20)
    assert sorted((m.queue_id, m.queue_offset) for m in again) == [
        (q, o) for q in range(QUEUES) for o in range(ends[q])
    ], "the pop group's reset did not survive the failover"
