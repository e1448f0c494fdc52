"""A new master hands out at once what earlier masters left in flight (seed 003: the new
master requeues every delivered-but-unacked message), with reconsume times + 1, and never
what the revive log it took says was acked. A master starting again in its own epoch keeps
the invisible times. An acting member (seed 004) serves pops only once it has read back
what earlier acting members escaped."""

from __future__ import annotations

import asyncio

import pytest

from hamq.broker.pop.escaped import ESCAPED_CK_BASE
from hamq.broker.role import BrokerRole, RoleState
from hamq.errors import ServiceNotAvailable
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, FrameDecoder
from unit.test_pop_escape import LocalEscape, open_member, produce
from unit.test_pop_escape import pop as escape_pop
from unit.test_pop_revive import TOPIC, open_broker, pop, put


def popped_and_acked(tmp_path) -> dict[int, int]:
    """The old master: 6 of 10 popped (invisible for a minute), 0..2 acked; it dies (no
    checkpoint). Returns the in-flight offsets' receipt ids."""
    store, service = open_broker(tmp_path)
    put(store, 10)
    handles = pop(service, 6)
    service._ack("g", [[TOPIC, 0, o, handles[o]] for o in (0, 1, 2)])
    store.commit()
    store.close()
    return {o: ck for o, ck in handles.items() if o > 2}


def start_as(tmp_path, role: RoleState, epoch: int) -> tuple[dict[int, int], dict[int, int]]:
    """Open the member under ``role``, make it master in ``epoch`` and start pop revive;
    returns what a pop then hands out (offset -> reconsume times) and the receipt ids the
    old master's pops still hold (offset -> ck)."""
    store, service = open_broker(tmp_path, role=role)
    held = {o: e[2] for o, e in service.states[("g", TOPIC, 0)].inflight.items()}
    role.role, role.epoch = BrokerRole.MASTER, epoch

    async def run() -> dict[int, int]:
        await service.start()
        try:
            pop(service, 10)
            return {
                o: times
                for o, (_, times, ck) in service.states[("g", TOPIC, 0)].inflight.items()
                if ck != held.get(o)
            }
        finally:
            await service.stop()
            store.close()

    return asyncio.run(run()), held


def test_a_promoted_slave_redelivers_what_the_old_master_left_in_flight_at_once(tmp_path):
    in_flight = popped_and_acked(tmp_path)
    handed_out, held = start_as(tmp_path, RoleState(BrokerRole.SLAVE, 1), epoch=1)
    assert held == in_flight  # the state the revive log gave the new master
    # 3..5 again at once (a minute before their invisible time ends), never 0..2
    assert {o: t for o, t in handed_out.items() if o < 6} == {3: 1, 4: 1, 5: 1}
    assert sorted(handed_out) == list(range(3, 10))  # and the messages never popped


def test_a_master_starting_again_in_its_own_epoch_keeps_the_invisible_times(tmp_path):
    popped_and_acked(tmp_path)
    handed_out, _ = start_as(tmp_path, RoleState(BrokerRole.MASTER, 0), epoch=0)
    assert sorted(handed_out) == [6, 7, 8, 9]  # only what was never popped


def test_an_acting_member_serves_no_pop_and_takes_no_ack_before_its_state_is_loaded(tmp_path):
    """An acting member takes requests from the moment it acts; until ``start`` read back
    what earlier acting members escaped, a pop finds nothing (it would hand out again what
    they acked) and an ack is refused retriably (it would be taken for stale)."""
    b_store, b = open_member(tmp_path / "b", "broker-b", RoleState(BrokerRole.MASTER, 0))
    role = RoleState(BrokerRole.MASTER, 0)
    store, service = open_member(tmp_path / "a", "broker-a", role, LocalEscape(b).put)
    produce(store, 4)
    role.role = BrokerRole.SLAVE  # what the member has when the master died
    role.acting_master = True  # the flag is up before the acting services start
    frame = Frame(
        RequestCode.POP_MESSAGE,
        1,
        ext={"group": "g", "topic": TOPIC, "queue_id": 0, "invisible_time_ms": 60_000},
    )
    (answer,) = FrameDecoder().feed(b"".join(bytes(p) for p in service.pop(None, frame)))
    assert answer.code == ResponseCode.PULL_NOT_FOUND
    with pytest.raises(ServiceNotAvailable):
        service._ack("g", [[TOPIC, 0, 0, ESCAPED_CK_BASE]])

    async def act() -> dict[int, int]:
        await service.start()
        try:
            return escape_pop(service, 4)
        finally:
            await service.stop()

    assert sorted(asyncio.run(act())) == [0, 1, 2, 3]
    store.close()
    b_store.close()


def test_a_new_master_starts_a_group_where_the_old_master_started_it(tmp_path):
    """A group popping from the end (init mode "max") started on the old master: what was
    sent after that and never popped comes from the new master too, though the consumer
    offset table (copied to slaves only every few seconds) never reached it. Before, the
    new master started the group at its own end, past those messages."""
    store, service = open_broker(tmp_path)
    put(store, 3)
    assert pop(service, 10, init_mode="max") == {}  # the group starts at offset 3
    put(store, 2)  # sent after it started, not popped yet: offsets 3 and 4
    store.close()
    for table in tmp_path.rglob("consumer_offsets.json*"):
        table.unlink()  # what a slave has: the log, not the master's offset table
    role = RoleState(BrokerRole.SLAVE, 1)
    store, service = open_broker(tmp_path, role=role)
    role.role, role.epoch = BrokerRole.MASTER, 1

    async def run() -> dict[int, int]:
        await service.start()
        try:
            return pop(service, 10, init_mode="max")
        finally:
            await service.stop()
            store.close()

    assert sorted(asyncio.run(run())) == [3, 4]
