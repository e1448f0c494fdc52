"""Master epochs in the HA handshake (issue 14 scope 5) on real brokers in master–slave
mode: the members' epoch files are written while they are stopped (a controller would
have written them), then the brokers run the handshake as controller mode does."""

from __future__ import annotations

import hamq
from hamq import Message, SendStatus
from hamq.config import StoreConfig
from hamq.errors import HamqError
from hamq.protocol.message import encode_batch, encode_message
from hamq.sim.replica_checkers import check_same_queues
from hamq.store.epoch_file import EpochFile
from hamq.store.message_store import MessageStore
from helpers import wait_for

WAIT_S = 20


def start_pair(cluster_factory, master_epochs=(), slave_epochs=()):
    """A name server, a sync master and one slave, whose epoch files hold the entries
    given before they start."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    for name, entries in (("master", master_epochs), ("slave1", slave_epochs)):
        (c.root / name).mkdir()
        write_epochs(c.root / name, *entries)
    c.start_broker("master", broker_role="sync_master", total_replicas=2)
    c.start_broker("slave1", broker_id=1, broker_role="slave", total_replicas=2)
    return c


def open_store(path) -> MessageStore:
    return MessageStore(StoreConfig(store_dir=str(path), disk_min_free_bytes=1))


def append_offline(path, tag: str, n: int) -> tuple[int, int]:
    """``n`` messages written into a stopped member's store; its log end before and after."""
    store = open_store(path)
    try:
        before = store.commitlog.max_offset
        for i in range(n):
            payload, crc = encode_batch([encode_message(f"{tag}-{i}".encode())])
            store.put_batch("Rep", i % 2, payload, 1, crc, born_timestamp_ms=i)
        store.commit()
        return before, store.commitlog.max_offset
    finally:
        store.close()


def write_epochs(path, *entries: tuple[int, int]) -> None:
    epochs = EpochFile(path / "epoch")
    for epoch, start in entries:
        epochs.append(epoch, start)


def runtime_ha(c, name: str) -> dict:
    with hamq.Admin(c.namesrv) as admin:
        return admin.broker_runtime_info(c.broker_addr(name))["ha"]


def test_a_slave_with_an_old_epochs_tail_cuts_to_the_consistent_point_and_follows(
    cluster_factory,
):
    """The slave was master in epoch 1 and kept a tail the group never got; epoch 2
    began on the other member at the point where their logs last agreed. On connecting,
    the slave cuts its commit log and consume queues there, copies epoch 2, and its epoch
    file ends up the master's."""
    c = start_pair(cluster_factory)
    wait_for(lambda: runtime_ha(c, "slave1")["state"] == "TRANSFER", WAIT_S, "slave attached")
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("Rep", 2)
    with hamq.Producer(c.namesrv) as producer:
        for i in range(20):
            assert producer.send(Message("Rep", b"shared-%d" % i)).status is SendStatus.SEND_OK
    wait_for(lambda: runtime_ha(c, "master")["slaves"][0]["behind_bytes"] == 0, WAIT_S, "caught up")
    c.procs["slave1"].stop()
    c.procs["master"].stop()
    epoch_two, _ = append_offline(c.root / "master", "new", 10)
    append_offline(c.root / "slave1", "old", 7)  # epoch 1's tail, never replicated
    write_epochs(c.root / "master", (1, 0), (2, epoch_two))
    write_epochs(c.root / "slave1", (1, 0))
    c.procs["master"].start()
    c.procs["slave1"].start()

    def followed() -> bool:
        ha = runtime_ha(c, "slave1")
        return ha.get("epochs") == [[1, 0], [2, epoch_two]] and ha["state"] == "TRANSFER"

    wait_for(followed, WAIT_S, "the slave's epoch file follows the master's")
    cut = runtime_ha(c, "slave1")["last_cut"]
    assert cut is not None and cut["offset"] == epoch_two
    wait_for(lambda: runtime_ha(c, "master")["slaves"][0]["behind_bytes"] == 0, WAIT_S, "caught up")
    c.procs["slave1"].stop()
    c.procs["master"].stop()
    master, slave = (open_store(c.root / name) for name in ("master", "slave1"))
    try:
        log = master.commitlog
        assert slave.commitlog.read_range(0, log.max_offset) == log.read_range(0, log.max_offset)
        assert slave.commitlog.max_offset == log.max_offset
        check_same_queues(master, slave, 1)  # the old tail's queue entries went with it
        assert [(e.epoch, e.start_offset) for e in slave.epochs.entries()] == [
            (1, 0),
            (2, epoch_two),
        ]
    finally:
        master.close()
        slave.close()


def test_a_master_that_meets_a_slave_of_a_newer_epoch_stops_acknowledging(cluster_factory):
    """A member still master in epoch 2 while its slave already follows epoch 3: it was
    deposed. It takes no more sends, and the slave copies nothing from it."""
    c = start_pair(cluster_factory, master_epochs=[(1, 0), (2, 0)], slave_epochs=[(1, 0), (3, 0)])
    wait_for(lambda: runtime_ha(c, "master").get("deposed") is True, WAIT_S, "master deposed")
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("Rep", 2)
    with hamq.Producer(c.namesrv, send_timeout_s=2.0) as producer:
        try:
            result = producer.send(Message("Rep", b"after"))
        except HamqError as err:
            assert "epoch 3 has begun" in str(err)
        else:
            raise AssertionError(f"a deposed master took a send: {result}")
    ha = runtime_ha(c, "slave1")
    assert ha["state"] != "TRANSFER" and ha["replica_offset"] == 0
