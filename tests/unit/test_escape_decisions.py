"""Transaction decisions an acting master keeps as metadata (seed 004): read back on start
with the op log, only for the very half message decided (its commit-log offset pins it),
merged as a union from another member, and forgotten once the op log holds them."""

from __future__ import annotations

from hamq.broker.escape import EscapeBridge
from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.role import BrokerRole, RoleState
from hamq.broker.transaction.decision_share import DecisionShare
from hamq.broker.transaction.decisions import TransactionDecisions
from hamq.broker.transaction.service import TransactionalMessageService
from hamq.config import BrokerConfig
from hamq.net.pool import ConnectionPool
from hamq.protocol.properties import PROPERTY_PRODUCER_GROUP
from hamq.protocol.transaction import TransactionState
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore


def service(root) -> TransactionalMessageService:
    config = BrokerConfig(store_dir=str(root))
    store = MessageStore(config)
    pool = ConnectionPool()  # a group of one: no member to hand decisions to
    return TransactionalMessageService(
        store,
        FlushService(store),
        RoleState(BrokerRole.MASTER, 0),
        EscapeBridge(config),
        on_put=lambda topic, queue_id: None,
        share=DecisionShare(MemberGroup(config, pool), pool, config.broker_id).share,
    )


def put_halves(tx: TransactionalMessageService, count: int) -> list[int]:
    """Half messages stored; their commit-log offsets."""
    physical = []
    for i in range(count):
        put = tx.put_half("T", 0, {PROPERTY_PRODUCER_GROUP: "pg"}, b"h%d" % i, 0)
        physical.append(put.physical_offset)
    tx.store.commit()
    return physical


def test_decisions_are_read_back_only_for_the_half_they_name(tmp_path):
    tx = service(tmp_path)
    physical = put_halves(tx, 4)
    now = tx.store.clock_ms()
    tx.decisions.write(tx.decisions.record(1, physical[1], now))
    tx.decisions.write(tx.decisions.record(2, physical[1], now))  # another half's offset
    tx.start()
    assert [tx.is_decided(o) for o in range(4)] == [False, True, False, False]
    assert list(tx.undecided()) == [0, 2, 3]
    # the one that named another half is forgotten, on disk too
    assert TransactionDecisions(tmp_path, now).decided() == {1: physical[1]}
    tx.store.close()


def test_merge_is_a_union_and_the_op_log_supersedes_a_decision(tmp_path):
    tx = service(tmp_path)
    physical = put_halves(tx, 3)
    now = tx.store.clock_ms()
    tx.decisions.write(tx.decisions.record(0, physical[0], now))
    merged = tx.decisions.merge({0: physical[0], 2: physical[2]}, now)
    assert merged is not None
    tx.decisions.write(merged)
    assert tx.decisions.merge({2: physical[2]}, now) is None  # nothing new
    assert TransactionDecisions(tmp_path, now).decided() == {0: physical[0], 2: physical[2]}
    tx.start()
    assert list(tx.undecided()) == [1]
    # the master logs a decision of its own for half 0: its metadata copy is dropped
    tx.decide(tx.half_message(0), TransactionState.ROLLBACK_MESSAGE)
    tx.store.commit()
    tx.start()
    assert TransactionDecisions(tmp_path, now).decided() == {2: physical[2]}
    assert list(tx.undecided()) == [1]
    tx.store.close()
