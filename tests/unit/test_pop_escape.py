"""Pop on an acting master (seed 004): its CK/ACK records escape into one chosen master
under its broker name and cancel each other there, the chosen master's own pop state
ignores them, its own log does not grow, and GET_POP_CHECKPOINT / merge_checkpoint hand
its pop state to the returning master by DataVersion."""

from __future__ import annotations

import asyncio
import zlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.broker.pop import escaped as escaped_module
from hamq.broker.pop.escaped import ESCAPED_CK_BASE, EscapedReviveLog
from hamq.broker.pop.ledger import apply_record
from hamq.broker.pop.revive_log import ReviveLog, ack_record, ck_record
from hamq.broker.pop.service import PopService
from hamq.broker.role import BrokerRole, RoleState
from hamq.errors import InvalidArgument, ServiceNotAvailable
from hamq.protocol.frame import Frame, FrameDecoder
from hamq.protocol.message import encode_message
from hamq.store.message_store import MessageStore
from unit.test_pop_revive import open_broker

TOPIC = "T"
FAR = 10**15  # a deadline that never runs out in a test


class LocalEscape:
    """Escapes into another group's master in this process, as ``ReviveEscape``'s local
    escape does, without a Broker around it; refuses any target but that master."""

    def __init__(self, master: PopService) -> None:
        self.master = master
        self.targets: list[str | None] = []

    async def put(self, record: bytes, target: str | None) -> str:
        self.targets.append(target)
        if target not in (None, self.master.broker_name):
            raise ServiceNotAvailable(f"no master {target}")
        self.master.store_escaped(record)
        self.master.store.commit()
        return self.master.broker_name


def open_member(root, broker_name: str, role: RoleState, escape=None):
    """A member of ``broker_name`` with TOPIC on one queue."""
    return open_broker(root, broker_name, role=role, escape=escape, queues=1)


def produce(store: MessageStore, n: int) -> None:
    for i in range(n):
        payload = encode_message(b"m%d" % i)
        store.put_batch(TOPIC, 0, payload, 1, zlib.crc32(payload), 0)
    store.commit()


def pop(service: PopService, max_msgs: int, invisible_ms: int = 60_000) -> dict[int, int]:
    """Pop from queue 0; returns {offset: ck} of what this pop handed out."""
    frame = Frame(
        200050,
        1,
        ext={
            "group": "g",
            "topic": TOPIC,
            "queue_id": 0,
            "max_msgs": max_msgs,
            "invisible_time_ms": invisible_ms,
        },
    )
    pieces = service._answer(frame, hold=False)
    service.store.commit()
    (answer,) = FrameDecoder().feed(b"".join(bytes(p) for p in pieces))
    if "chunks" not in answer.ext:
        return {}
    return {o: answer.ext["ck"] for chunk in answer.ext["chunks"] for o in chunk[1]}


def inflight(service: PopService) -> list[int]:
    return sorted(service.states[("g", TOPIC, 0)].inflight)


def test_an_origins_records_cancel_in_the_chosen_masters_log_and_its_own_state_ignores_them(
    tmp_path,
):
    store, chosen = open_member(tmp_path, "broker-b", RoleState(BrokerRole.MASTER, 0))
    produce(store, 2)
    own = pop(chosen, 2)  # the chosen master's own pops, in the same revive log
    ck1, ck2 = ESCAPED_CK_BASE + 1, ESCAPED_CK_BASE + 2
    escaped = [
        ck_record("broker-a", "g", TOPIC, FAR, [(0, [0, 1, 2, 3], [0, 0, 0, 0])], ck1),
        ack_record("broker-a", "g", [(TOPIC, 0, 0, ck1), (TOPIC, 0, 2, ck1)]),
        ck_record("broker-a", "g", TOPIC, FAR, [(0, [3], [1])], ck2),  # 3 redelivered
        ack_record("broker-a", "g", [(TOPIC, 0, 3, ck1)]),  # the older handle: stale
    ]
    for record in escaped:
        chosen.store_escaped(record)
    store.commit()
    records = list(ReviveLog(store, "broker-b").replay(0, "broker-a"))
    assert [(r.kind, r.ck) for r in records if r.kind == "ck"] == [("ck", ck1), ("ck", ck2)]
    origin: dict = {}
    for record in records:
        apply_record(origin, record, lambda g, t, q, offsets: min(offsets))
    assert sorted(origin[("g", TOPIC, 0)].inflight) == [1, 3]
    assert origin[("g", TOPIC, 0)].inflight[3][2] == ck2
    assert origin[("g", TOPIC, 0)].consume_offset == 1
    store.close()
    store2, chosen2 = open_member(tmp_path, "broker-b", RoleState(BrokerRole.MASTER, 0))
    assert inflight(chosen2) == sorted(own)  # its own two; broker-a's records not applied
    store2.close()


def test_the_chosen_master_is_recorded_and_kept_across_a_restart(tmp_path):
    b_store, b = open_member(tmp_path / "b", "broker-b", RoleState(BrokerRole.MASTER, 0))
    bridge = LocalEscape(b)

    async def run() -> None:
        first = EscapedReviveLog(bridge.put, tmp_path, b_store.disk)
        first.start()
        await first.submit(ack_record("broker-a", "g", []), wait=True)
        await first.stop()
        again = EscapedReviveLog(bridge.put, tmp_path, b_store.disk)
        assert again.target == "broker-b"
        again.start()
        await again.submit(ack_record("broker-a", "g", []), wait=True)
        await again.stop()

    asyncio.run(run())
    assert bridge.targets == [None, "broker-b"]
    b_store.close()


def test_an_acting_master_pops_and_acks_through_the_escape_and_never_writes_its_log(tmp_path):
    """The group's master popped 0..3 (CKs in the replicated revive log) and died; its
    slave acts: it redelivers in place, pops the rest, acks, and every CK/ACK it makes goes
    into broker-b's revive log, where they cancel; its own commit log does not grow."""
    b_store, b = open_member(tmp_path / "b", "broker-b", RoleState(BrokerRole.MASTER, 0))
    role = RoleState(BrokerRole.MASTER, 0)
    store, service = open_member(tmp_path / "a", "broker-a", role, LocalEscape(b).put)
    produce(store, 8)
    before = pop(service, 4, invisible_ms=100)  # popped by the master, never acked
    now = store.clock_ms()
    role.role = BrokerRole.SLAVE  # what the member has when the master died
    role.acting_master = True
    log_end = store.commitlog.max_offset

    async def act() -> tuple[dict, dict]:
        await service.start()
        while store.clock_ms() < now + 150:  # the master's invisible time runs out
            await asyncio.sleep(0.05)
        again = pop(service, 8)  # the four due ones first, in place, then the rest
        _stale, escaped = service._ack("g", [[TOPIC, 0, o, again[o]] for o in (0, 1, 5)])
        await escaped
        await service.stop()
        return again, escaped

    again, _ = asyncio.run(act())
    assert sorted(again) == list(range(8))
    assert all(ck >= ESCAPED_CK_BASE for ck in again.values())
    assert set(again.values()).isdisjoint(before.values())
    assert store.commitlog.max_offset == log_end  # nothing appended by the acting master
    records = list(ReviveLog(b_store, "broker-b").replay(0, "broker-a"))
    assert [r.kind for r in records] == ["ck", "ack"]
    origin: dict = {}
    for record in records:
        apply_record(origin, record, lambda g, t, q, offsets: min(offsets))
    assert sorted(origin[("g", TOPIC, 0)].inflight) == [2, 3, 4, 6, 7]
    assert inflight(service) == [2, 3, 4, 6, 7]
    store.close()
    b_store.close()


def checkpoint_of(service: PopService) -> bytes:
    (answer,) = FrameDecoder().feed(
        b"".join(bytes(p) for p in service.get_pop_checkpoint(None, Frame(911, 7)))
    )
    return answer.body


def test_the_returning_master_takes_the_acting_members_pop_state_and_replays_no_ack(tmp_path):
    """The master popped 0..3 and died; the acting member popped them again, acked 0 and 1.
    The returning master takes the acting member's state (newer DataVersion): once the
    invisible time is over it redelivers 2 and 3 only, and a restart keeps that."""
    b_store, b = open_member(tmp_path / "b", "broker-b", RoleState(BrokerRole.MASTER, 0))
    m_store, master = open_member(tmp_path / "m", "broker-a", RoleState(BrokerRole.MASTER, 0))
    produce(m_store, 6)
    pop(master, 4, invisible_ms=100)
    acting_role = RoleState(BrokerRole.MASTER, 0)
    s_store, acting = open_member(tmp_path / "s", "broker-a", acting_role, LocalEscape(b).put)
    produce(s_store, 6)  # the same messages, as replicated
    acting_role.role = BrokerRole.SLAVE
    acting_role.acting_master = True

    async def act() -> None:
        await acting.start()
        handles = pop(acting, 4, invisible_ms=100)
        await acting._ack("g", [[TOPIC, 0, o, handles[o]] for o in (0, 1)])[1]
        await acting.stop()

    asyncio.run(act())
    older = checkpoint_of(master)
    assert not acting.merge_checkpoint(older)  # the master's state is older
    assert master.merge_checkpoint(checkpoint_of(acting))
    assert not master.merge_checkpoint(checkpoint_of(acting))  # the same version: no change
    assert master.states[("g", TOPIC, 0)].to_wire() == acting.states[("g", TOPIC, 0)].to_wire()
    assert m_store.offsets.query("g", TOPIC, 0) == 2
    deadline = m_store.clock_ms() + 150
    while m_store.clock_ms() < deadline:  # the acting member's invisible time runs out
        asyncio.run(asyncio.sleep(0.05))
    m_store.close()
    m_store2, master2 = open_member(tmp_path / "m", "broker-a", RoleState(BrokerRole.MASTER, 0))
    assert sorted(pop(master2, 8)) == [2, 3, 4, 5]  # never 0 or 1
    assert [master2.states[("g", TOPIC, 0)].inflight[o][1] for o in (2, 3, 4)] == [1, 1, 0]
    m_store2.close()
    s_store.close()
    b_store.close()


@pytest.mark.parametrize(
    "body",
    [b"", b"\x81\xa1x\x01", b"\x82\xacdata_version\x80\xa6queues\x91\x94\xa1g"],
)
def test_an_unreadable_pop_checkpoint_is_refused_and_changes_nothing(tmp_path, body):
    store, service = open_member(tmp_path, "broker-a", RoleState(BrokerRole.MASTER, 0))
    produce(store, 2)
    pop(service, 2)
    before = service.states[("g", TOPIC, 0)].to_wire()
    with pytest.raises(InvalidArgument):
        service.merge_checkpoint(body)
    assert service.states[("g", TOPIC, 0)].to_wire() == before
    store.close()


def test_a_master_refuses_escaped_records_under_its_own_name_or_unreadable(tmp_path):
    """A client could send POP_ESCAPED_REVIVE: what it sends must never change the
    master's own pop state."""
    store, service = open_member(tmp_path, "broker-b", RoleState(BrokerRole.MASTER, 0))
    produce(store, 2)
    handles = pop(service, 2)
    end = service.revive.end_offset
    forged = ack_record("broker-b", "g", [(TOPIC, 0, o, ck) for o, ck in handles.items()])
    for record in (forged, b"\x93\x01\x02\x03", b"not msgpack", ck_record("a", "g", 5, 1, [])):
        with pytest.raises(InvalidArgument):
            service.store_escaped(record)
    assert service.revive.end_offset == end
    assert inflight(service) == [0, 1]
    store.close()


VALUES = st.recursive(
    st.one_of(
        st.integers(-(2**63), 2**64 - 1), st.text(max_size=8), st.none(), st.binary(max_size=8)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from("kbgtdec"), inner)
    ),
    max_leaves=12,
)


def test_any_escaped_body_is_stored_or_refused_with_a_clear_error(tmp_path):
    """Whatever a client sends as POP_ESCAPED_REVIVE: stored if it is a well-formed record of
    another broker, else InvalidArgument and nothing stored; the master's state unchanged."""
    store, service = open_member(tmp_path, "broker-b", RoleState(BrokerRole.MASTER, 0))
    produce(store, 2)
    pop(service, 2)
    before = service.states[("g", TOPIC, 0)].to_wire()

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.binary(max_size=48), VALUES.map(msgpack.packb)))
    def check(body: bytes) -> None:
        end = service.revive.end_offset
        try:
            service.store_escaped(body)
        except InvalidArgument:
            assert service.revive.end_offset == end

    check()
    store.commit()
    assert service.states[("g", TOPIC, 0)].to_wire() == before
    store.close()


def test_any_pop_checkpoint_body_is_merged_or_refused_with_a_clear_error(tmp_path):
    store, service = open_member(tmp_path, "broker-a", RoleState(BrokerRole.MASTER, 0))
    produce(store, 2)
    pop(service, 2)
    queue = st.lists(VALUES, min_size=4, max_size=4)
    checkpoint = st.fixed_dictionaries(
        {
            "data_version": st.one_of(
                VALUES,
                st.fixed_dictionaries(
                    {"state_version": VALUES, "counter": VALUES, "timestamp_ms": VALUES}
                ),
            ),
            "queues": st.lists(st.tuples(VALUES, VALUES, VALUES, queue).map(list), max_size=2),
        }
    )

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.binary(max_size=48), checkpoint.map(msgpack.packb)))
    def check(body: bytes) -> None:
        try:
            taken = service.merge_checkpoint(body)
        except InvalidArgument:
            return
        if taken:  # a well-formed newer state: every field an integer where it must be
            for state in service.states.values():
                state.check()

    check()
    store.close()


def test_pops_and_acks_are_refused_while_the_chosen_master_does_not_take_records(
    tmp_path, monkeypatch
):
    """The recorded master is gone: records wait (retried), and past MAX_PENDING pops and
    acks are refused, handing nothing out, so memory stays bounded."""
    monkeypatch.setattr(escaped_module, "MAX_PENDING", 2)
    b_store, b = open_member(tmp_path / "b", "broker-b", RoleState(BrokerRole.MASTER, 0))
    role = RoleState(BrokerRole.MASTER, 0)
    store, service = open_member(tmp_path / "a", "broker-a", role, LocalEscape(b).put)
    produce(store, 4)
    role.role = BrokerRole.SLAVE
    role.acting_master = True
    service.escaped.target = "broker-gone"

    async def act() -> None:
        await service.start()
        handles = {**pop(service, 1), **pop(service, 1)}  # two CKs wait
        with pytest.raises(ServiceNotAvailable):
            pop(service, 1)
        with pytest.raises(ServiceNotAvailable):
            service._ack("g", [[TOPIC, 0, o, ck] for o, ck in handles.items()])
        assert inflight(service) == [0, 1]
        await service.stop()

    asyncio.run(act())
    store.close()
    b_store.close()
