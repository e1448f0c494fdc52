"""The master–slave handshake over real message stores (``MasterLink`` / ``SlaveLink``, the
steps the broker and the simulator run): a slave attaches only where both logs agree,
cuts what follows and then holds exactly the master's bytes (defect 2 of issue 10)."""

from __future__ import annotations

import random
import time

import pytest

from hamq.broker.ha.service import MasterDeposed, MasterLink, SlaveLink
from hamq.config import StoreConfig
from hamq.errors import HamqError
from hamq.protocol.message import decode_records, encode_batch, encode_message
from hamq.replication.master import MAX_PROBES, MasterReplication, ReplicaStatus
from hamq.replication.quorum import QuorumConfig
from hamq.sim.fs import ProcessCrash, SimDisk
from hamq.sim.replica_checkers import check_same_queues
from hamq.store.message_store import GetStatus, MessageStore

KEY = "session"
ROUNDS_MAX = 10


def open_store(path) -> MessageStore:
    return MessageStore(
        StoreConfig(
            store_dir=str(path), disk_min_free_bytes=1, mapped_file_size_commitlog=64 * 1024
        )
    )


@pytest.fixture
def stores(tmp_path):
    opened = [open_store(tmp_path / "master"), open_store(tmp_path / "slave")]
    yield opened
    for store in opened:
        store.close()


def put(store: MessageStore, tag: str, n: int, queues: int = 3) -> None:
    for i in range(n):
        payload, crc = encode_batch([encode_message(f"{tag}-{i}".encode() * 3)])
        store.put_batch("T", i % queues, payload, 1, crc, born_timestamp_ms=i)
    store.commit()


def boundaries(store: MessageStore) -> list[int]:
    return sorted(p for cq in store.queues.values() for p in cq.phys)


def log_bytes(store: MessageStore) -> bytes:
    log = store.commitlog
    return bytes(log.read_range(log.min_offset, log.max_offset))


def replicate(master: MessageStore, slave: MessageStore) -> tuple[SlaveLink, int]:
    """Handshake, then ship until the slave has everything; returns the link and the
    number of handshake rounds."""
    core = MasterReplication(QuorumConfig(), 64 * 1024, 16 * 1024)
    m, s = MasterLink(core, master), SlaveLink(slave, broker_id=1)
    request, rounds = s.begin(), 0
    while request is not None:
        rounds += 1
        assert rounds <= ROUNDS_MAX
        reply, _ = m.handshake(KEY, request, now_ms=0)
        request = s.on_handshake_reply(reply)
    while core.slaves[KEY].ack_offset < master.commitlog.max_offset:
        shipped = list(m.transfers(KEY, 0))
        assert shipped, f"the master ships nothing; the slave is at {s.ack_offset}"
        for offset, data in shipped:
            s.on_transfer(offset, data)
        m.on_ack(KEY, s.ack(), now_ms=0)
    return s, rounds


def test_an_empty_slave_copies_the_whole_log(stores):
    master, slave = stores
    put(master, "a", 200)
    _, rounds = replicate(master, slave)
    assert rounds == 1
    assert log_bytes(slave) == log_bytes(master)
    assert boundaries(slave) == boundaries(master)


def test_a_record_larger_than_the_window_reaches_the_slave_in_pieces(stores):
    """The slave holds a partial record in memory and acks only whole ones; its ack says
    how far it received too, so the master ships the rest of a record beyond the window."""
    master, slave = stores
    put(master, "before", 3)
    payload, crc = encode_batch([encode_message(bytes(200 * 1024))])  # window: 64 KiB
    master.put_batch("T", 0, payload, 1, crc, born_timestamp_ms=0)
    put(master, "after", 3)
    replicate(master, slave)
    assert log_bytes(slave) == log_bytes(master)
    check_same_queues(master, slave, 1)


def test_a_caught_up_slave_reattaches_in_one_round_without_cutting(stores):
    master, slave = stores
    put(master, "a", 50)
    replicate(master, slave)
    put(master, "b", 50)
    link, rounds = replicate(master, slave)
    assert rounds == 1 and link.last_cut is None
    assert log_bytes(slave) == log_bytes(master)


def test_slave_holding_a_tail_the_master_lost_cuts_it_and_takes_the_new_records(stores):
    """The defect: the master (async flush) lost a tail the slave had, wrote other records
    at those offsets and grew past the slave's end; the slave must not continue at its own
    end with its old records in place."""
    master, slave = stores
    put(master, "a", 100)
    replicate(master, slave)
    lost_from = boundaries(master)[80]
    slave_end = slave.commitlog.max_offset
    master.truncate_to(lost_from)
    put(master, "rewritten", 60)
    assert master.commitlog.max_offset > slave_end
    link, rounds = replicate(master, slave)
    assert link.last_cut == {"offset": lost_from, "bytes": slave_end - lost_from}
    assert rounds <= 4  # an attach, two bisection rounds over 99 records, the attach
    assert log_bytes(slave) == log_bytes(master)
    for key, cq in master.queues.items():  # queue offsets agree too
        assert list(slave.queues[key].base) == list(cq.base)
        assert list(slave.queues[key].phys) == list(cq.phys)


def test_slave_ahead_of_a_master_that_lost_everything_is_cut_back(stores, tmp_path):
    master, slave = stores
    put(master, "a", 40)
    replicate(master, slave)
    fresh = open_store(tmp_path / "new-master")  # the master came back with an empty disk
    try:
        put(fresh, "b", 10)
        link, _ = replicate(fresh, slave)
        assert link.last_cut["offset"] == 0
        assert log_bytes(slave) == log_bytes(fresh)
    finally:
        fresh.close()


def test_divergence_deep_in_a_long_log_is_found_in_few_rounds(stores):
    master, slave = stores
    put(master, "a", 5000, queues=8)
    replicate(master, slave)
    lost_from = boundaries(master)[1234]
    master.truncate_to(lost_from)
    put(master, "b", 4000, queues=8)
    link, rounds = replicate(master, slave)
    assert link.last_cut["offset"] == lost_from
    assert rounds <= 5  # an attach, three bisection rounds over 4999 records, the attach
    assert log_bytes(slave) == log_bytes(master)


def test_bisection_probes_are_bounded(stores):
    master, slave = stores
    put(master, "a", 3 * MAX_PROBES)
    replicate(master, slave)
    master.truncate_to(boundaries(master)[1])
    put(master, "b", 3 * MAX_PROBES)
    core = MasterReplication(QuorumConfig(), 64 * 1024, 16 * 1024)
    m, s = MasterLink(core, master), SlaveLink(slave, broker_id=1)
    request = s.begin()
    while request is not None:
        assert len(request.get("probes", ())) <= MAX_PROBES
        reply, _ = m.handshake(KEY, request, now_ms=0)
        request = s.on_handshake_reply(reply)
    assert s.last_cut["offset"] == boundaries(master)[1]


def test_bytes_before_the_handshake_attached_are_refused(stores):
    master, slave = stores
    put(master, "a", 5)
    link = SlaveLink(slave, broker_id=1)
    link.begin()
    with pytest.raises(HamqError, match="before the handshake"):
        link.on_transfer(0, log_bytes(master))
    assert slave.commitlog.max_offset == 0


def test_a_slave_below_the_masters_retained_log_restarts_at_its_start(stores):
    master, slave = stores
    put(master, "a", 2000)  # several 64 KiB segments
    new_min = master.commitlog.delete_segments_before(time.time() + 60)  # retention
    for cq in master.queues.values():
        cq.drop_below_physical(new_min)
    assert new_min > 0
    replicate(master, slave)
    assert slave.commitlog.min_offset == new_min
    assert log_bytes(slave) == log_bytes(master)


@pytest.mark.parametrize(
    "ext,message",
    [
        ({"broker_id": 1, "max_offset": 0}, "may be too old"),  # a slave from before the check
        ({"broker_id": 1, "attach": -1, "proof": None}, "may be too old"),
        ({"broker_id": 1, "attach": 10, "proof": [10, 5, 0]}, "malformed record probe"),
        ({"broker_id": 1, "probes": [[0, 10, 1]] * (MAX_PROBES + 1)}, f"at most {MAX_PROBES}"),
        ({"broker_id": 1, "probes": [["0", 10, 1]]}, "malformed record probe"),
    ],
)
def test_malformed_handshakes_are_refused_clearly(stores, ext, message):
    master, _ = stores
    core = MasterReplication(QuorumConfig(), 64 * 1024, 16 * 1024)
    with pytest.raises(HamqError, match=message):
        MasterLink(core, master).handshake(KEY, ext, now_ms=0)
    assert core.slaves == {}


def test_retention_removing_what_a_slave_still_needs_ends_its_session(stores):
    """The slave attached, then retention removed the segments it has not received yet:
    the master cannot ship them, so the session ends and the next handshake restarts the
    slave at the master's first byte (it used to read the log at a negative position)."""
    master, slave = stores
    put(master, "a", 2000)  # several 64 KiB segments
    core = MasterReplication(QuorumConfig(), 64 * 1024, 16 * 1024)
    m, s = MasterLink(core, master), SlaveLink(slave, broker_id=1)
    reply, _ = m.handshake(KEY, s.begin(), now_ms=0)
    assert s.on_handshake_reply(reply) is None and core.slaves[KEY].sent_offset == 0
    new_min = master.commitlog.delete_segments_before(time.time() + 60)  # retention
    for cq in master.queues.values():
        cq.drop_below_physical(new_min)
    with pytest.raises(HamqError, match="retention removed"):
        list(m.transfers(KEY, 0))
    core.disconnect(KEY)
    replicate(master, slave)
    assert slave.commitlog.min_offset == new_min
    assert log_bytes(slave) == log_bytes(master)


def sim_store(disk: SimDisk) -> MessageStore:
    # One store time for every record: a rewrite differs from the record it replaces only
    # in its body, and 4 KiB segments put the cut and the new records across rolls.
    return MessageStore(
        StoreConfig(store_dir="/store", disk_min_free_bytes=1, mapped_file_size_commitlog=4096),
        lambda: 1_000,
        disk=disk,
    )


def put_numbered(store: MessageStore, tag: str, first: int, last: int) -> None:
    """Records ``first``..``last - 1``; equal numbers under equal-length tags are equal in
    size, so records written again after a loss land on the old boundaries."""
    for i in range(first, last):
        payload, crc = encode_batch([encode_message(f"{tag}-{i:04d}".encode() * 8)])
        store.put_batch("T", i % 3, payload, 1, crc, born_timestamp_ms=i)
    store.commit()


def lose_tail_and_rewrite(master: MessageStore) -> None:
    """The master lost a tail the slave holds and wrote records of the same sizes and
    store time at the same offsets."""
    master.truncate_to(boundaries(master)[40])
    put_numbered(master, "b", 40, 100)


def delete_and_recreate(master: MessageStore) -> None:
    """The master deleted the topic and created it again: its queues restart at 0."""
    master.delete_topic("T")
    put_numbered(master, "b", 0, 30)


def lose_disk_and_expire(master: MessageStore) -> None:
    """The master lost everything, wrote a new log, and retention removed its start: the
    slave agrees with nothing the master keeps and restarts its log empty."""
    master.truncate_to(0)
    put_numbered(master, "b", 0, 110)
    new_min = master.commitlog.delete_segments_before(2.0)  # the sim clock reads 1.0
    for cq in master.queues.values():
        cq.drop_below_physical(new_min)


def crash_at_every_step(change_master, power_loss: bool) -> int:
    """The slave replicates 90 records, the master changes, and the slave dies before each
    change to its disk in turn while it follows (kill -9, or a power loss that keeps only
    fsynced data); after every crash it restarts without refusing and a new handshake
    leaves it byte-identical to its master, queues included. Returns the crash points."""
    crash_points = 0
    while True:
        master = sim_store(SimDisk(clock=lambda: 1.0))
        disk = SimDisk(clock=lambda: 1.0)
        slave = sim_store(disk)
        put_numbered(master, "a", 0, 90)
        replicate(master, slave)
        slave.close()
        slave = sim_store(disk)
        change_master(master)
        disk.crash_after(crash_points)
        try:
            replicate(master, slave)
            slave.commitlog.flush()
            slave.flush_consume_queues()
        except ProcessCrash:
            disk.kill() if not power_loss else disk.power_loss(random.Random(crash_points))
            slave = sim_store(disk)  # must not refuse
            replicate(master, slave)
        else:
            return crash_points
        assert log_bytes(slave) == log_bytes(master), crash_points
        check_same_queues(master, slave, 1)
        crash_points += 1


@pytest.mark.parametrize("power_loss", [False, True], ids=["kill", "power-loss"])
def test_a_slave_crashing_at_any_step_of_the_cut_recovers_and_converges(power_loss):
    """From the handshake's cut through the new records and their checkpoint."""
    assert crash_at_every_step(lose_tail_and_rewrite, power_loss) > 10


@pytest.mark.parametrize("power_loss", [False, True], ids=["kill", "power-loss"])
def test_a_slave_crashing_while_it_drops_a_deleted_topics_queues_converges(power_loss):
    """Dropping the queues of a topic the master deleted and created again, and indexing
    the new records, can be cut short anywhere."""
    assert crash_at_every_step(delete_and_recreate, power_loss) > 3


def test_a_topic_the_master_deleted_and_created_again_reads_the_same_on_the_slave(stores):
    """The master deleted a topic (its queues gone) and created it again: its queues start
    at offset 0 again. The slave, which knows nothing of the delete, appended the new
    entries after the old ones, so a queue offset read on the slave returned a deleted
    message, and the queue's offsets went backwards."""
    master, slave = stores
    put(master, "old", 30)
    replicate(master, slave)
    master.delete_topic("T")
    put(master, "new", 6)
    replicate(master, slave)
    check_same_queues(master, slave, 1)
    for queue_id in range(3):
        got = slave.get_messages("T", queue_id, 0, 1, 1 << 20)
        assert got.status is GetStatus.FOUND
        assert decode_records(bytes(got.records), 0, lambda h, i, o, p, body: bytes(body)) == [
            f"new-{queue_id}".encode() * 3
        ]


def test_handshake_offsets_beyond_the_log_match_nothing_and_register_nothing(stores):
    """Offsets far past the master's log (a slave of another group, a corrupt one) are no
    error, but prove nothing: no record matches and no session registers at them."""
    master, _ = stores
    put(master, "a", 10)
    core = MasterReplication(QuorumConfig(), 64 * 1024, 16 * 1024)
    link = MasterLink(core, master)
    huge = 1 << 62
    reply, attached = link.handshake(KEY, {"broker_id": 1, "probes": [[huge, huge + 1, 0]]}, 0)
    assert reply == {"matches": [False]} and attached is None
    reply, attached = link.handshake(
        KEY, {"broker_id": 1, "attach": huge, "proof": [huge - 100, huge, 7]}, 0
    )
    assert reply == {"start_offset": None} and core.slaves == {}
    # an empty slave log that far ahead restarts at the master's first byte
    reply, attached = link.handshake(KEY, {"broker_id": 1, "attach": huge, "proof": None}, 0)
    assert reply == {"start_offset": master.commitlog.min_offset}


def test_a_slave_agreeing_on_nothing_the_master_kept_restarts_empty_at_its_start(stores):
    """The master lost its disk, wrote a new log and retention removed its start; the
    slave's old log agrees with none of it and reaches past the master's first byte. The
    slave must restart empty there: it used to cut its log only back to the master's
    first byte, keeping (and serving) old records the master never had."""
    master, slave = stores
    put(slave, "old", 4000)  # what the slave copied from the master's lost disk
    put(master, "new", 3000)
    new_min = master.commitlog.delete_segments_before(time.time() + 60)  # retention
    for cq in master.queues.values():
        cq.drop_below_physical(new_min)
    assert 0 < new_min < slave.commitlog.max_offset
    _link, _ = replicate(master, slave)
    assert slave.commitlog.min_offset == new_min
    assert log_bytes(slave) == log_bytes(master)
    check_same_queues(master, slave, 1)


def test_slave_retention_during_a_handshake_leaves_it_attachable(stores):
    """The slave's retention ran between two handshake rounds and removed the segment
    where its log agrees with the master's: the attach point is now below its first byte,
    so nothing it keeps was found to agree. It restarts empty there (cutting back to it
    was refused, and failed the handshake)."""
    master, slave = stores
    put(master, "a", 100)
    replicate(master, slave)
    put(slave, "x", 4000)  # records the master lost; several segments of them
    put(master, "b", 200)
    core = MasterReplication(QuorumConfig(), 64 * 1024, 16 * 1024)
    m, s = MasterLink(core, master), SlaveLink(slave, broker_id=1)
    request, rounds = s.begin(), 0
    while request is not None:
        rounds += 1
        assert rounds <= ROUNDS_MAX
        reply, _ = m.handshake(KEY, request, now_ms=0)
        request = s.on_handshake_reply(reply)
        if rounds == 2:  # the first compare round is answered: retention on the slave
            new_min = slave.commitlog.delete_segments_before(time.time() + 60)
            for cq in slave.queues.values():
                cq.drop_below_physical(new_min)
    agreed = boundaries(master)[100]
    assert core.slaves[KEY].sent_offset == agreed < new_min
    assert slave.commitlog.min_offset == slave.commitlog.max_offset == agreed
    replicate(master, slave)
    assert log_bytes(slave) == log_bytes(master)[agreed:]
    check_same_queues(master, slave, 1)


@pytest.mark.parametrize("power_loss", [False, True], ids=["kill", "power-loss"])
def test_a_slave_crashing_while_it_restarts_its_log_empty_converges(power_loss):
    """Restarting the log empty at the master's first byte can be cut short anywhere."""
    assert crash_at_every_step(lose_disk_and_expire, power_loss) > 3


# -- epochs (controller mode, issue 14 scope 5) ----------------------------------------------
def write_epochs(store: MessageStore, *entries: tuple[int, int]) -> None:
    for epoch, start in entries:
        store.epochs.append(epoch, start)


def epochs(store: MessageStore) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in store.epochs.entries()]


def test_a_tail_the_epochs_disown_is_cut_even_where_its_records_match(stores):
    """The slave holds the master's bytes past the start of an epoch it never recorded:
    by the epochs nothing there is vouched for, so it is cut and copied again, and its
    epoch file takes the master's history."""
    master, slave = stores
    put(master, "a", 100)
    epoch_two = master.commitlog.max_offset
    put(master, "b", 100)
    write_epochs(master, (1, 0), (2, epoch_two))
    replicate(master, slave)  # the same bytes, but the slave records no epoch of them
    slave.epochs.truncate_suffix_from(0)
    write_epochs(slave, (1, 0))
    link, _ = replicate(master, slave)
    assert link.last_cut == {"offset": epoch_two, "bytes": master.commitlog.max_offset - epoch_two}
    assert log_bytes(slave) == log_bytes(master)
    assert epochs(slave) == [(1, 0), (2, epoch_two)]


def test_an_old_epochs_unreplicated_tail_is_cut_with_its_queue_entries(stores):
    """A deposed master comes back as a slave: its tail of epoch 1 past where epoch 2
    began on the new master is cut (commit log and consume queues), then it copies."""
    master, slave = stores
    put(master, "a", 60)
    write_epochs(master, (1, 0))
    replicate(master, slave)
    write_epochs(slave, (1, 0))
    put(slave, "old", 40)  # epoch 1's tail the new master never got
    epoch_two = master.commitlog.max_offset
    write_epochs(master, (2, epoch_two))
    put(master, "new", 30)
    link, _ = replicate(master, slave)
    assert link.last_cut is not None and link.last_cut["offset"] == epoch_two
    assert log_bytes(slave) == log_bytes(master)
    check_same_queues(master, slave, 1)
    assert epochs(slave) == epochs(master)
    found = slave.get_messages("T", 0, 0, 1000, 1 << 24)
    bodies = decode_records(bytes(found.records), 0, lambda h, i, o, p, body: bytes(body))
    assert bodies and not any(b"old-" in body for body in bodies)


def test_the_slave_epoch_file_follows_the_master_as_data_arrives(stores):
    master, slave = stores
    write_epochs(master, (1, 0))
    put(master, "a", 50)
    epoch_three = master.commitlog.max_offset
    write_epochs(master, (3, epoch_three))
    put(master, "b", 50)
    core = MasterReplication(QuorumConfig(), 64 * 1024, 2 * 1024)
    m, s = MasterLink(core, master), SlaveLink(slave, broker_id=1)
    request = s.begin()
    while request is not None:
        reply, _ = m.handshake(KEY, request, now_ms=0)
        request = s.on_handshake_reply(reply)
    assert epochs(slave) == [(1, 0)]  # epoch 3 starts past its log end
    while slave.commitlog.max_offset < master.commitlog.max_offset:
        for offset, data in m.transfers(KEY, 0):
            s.on_transfer(offset, data)
            assert (3, epoch_three) in epochs(slave) or slave.commitlog.max_offset < epoch_three
        m.on_ack(KEY, s.ack(), now_ms=0)
    assert epochs(slave) == [(1, 0), (3, epoch_three)]


def test_a_slave_refuses_a_master_older_than_the_epoch_it_knows(stores):
    """The answer of a master of epoch 2 (a master deposes itself on hearing of epoch 3,
    so this is one that did not: the slave checks too)."""
    _, slave = stores
    write_epochs(slave, (1, 0), (3, 0))
    s = SlaveLink(slave, broker_id=1)
    assert s.begin()["master_epoch"] == 3
    with pytest.raises(HamqError, match="older than epoch 3"):
        s.on_handshake_reply({"start_offset": 0, "epoch": 2, "epochs": [[1, 0], [2, 0]]})
    assert not s.attached


def test_a_master_that_hears_of_a_newer_epoch_is_deposed(stores):
    master, slave = stores
    write_epochs(master, (1, 0), (2, 0))
    write_epochs(slave, (1, 0), (2, 0))
    core = MasterReplication(QuorumConfig(total_replicas=2, in_sync_replicas=2), 1024, 1024)
    core.start_epoch(2)
    m, s = MasterLink(core, master), SlaveLink(slave, broker_id=1)
    ended: list[ReplicaStatus] = []
    core.wait_for_acks(100, 2, 0, 10_000, ended.append)
    s.known_master_epoch = 3  # the controller elected another member in epoch 3
    with pytest.raises(MasterDeposed) as deposed:
        m.handshake(KEY, s.begin(), now_ms=0)
    assert core.deposed and deposed.value.failed
    for callback, status in deposed.value.failed:
        callback(status)
    core.wait_for_acks(200, 2, 0, 10_000, ended.append)
    assert ended == [ReplicaStatus.SLAVE_NOT_AVAILABLE] * 2


def test_a_master_that_lost_records_of_its_own_epoch_never_cuts_them_from_a_slave(stores):
    """A power loss took the master's unflushed tail (async flush), and it came back
    leading the same epoch before the controller noticed. Its slave holds that tail,
    acknowledged by every member: a master of that epoch never shipped other records at
    those offsets, so the difference is the master's loss, not the slave's. The slave
    keeps its log, and the master acknowledges nothing more (a member holding more of the
    epoch must be elected)."""
    master, slave = stores
    write_epochs(master, (1, 0))
    put(master, "acked", 100)
    replicate(master, slave)
    assert epochs(slave) == [(1, 0)]
    slave_log = log_bytes(slave)
    master.truncate_to(boundaries(master)[80])  # the power loss
    for rewritten in (0, 40):  # at once, and after new sends
        put(master, "after-restart", rewritten)
        core = MasterReplication(QuorumConfig(), 64 * 1024, 16 * 1024)
        m, s = MasterLink(core, master), SlaveLink(slave, broker_id=1)
        assert core.epoch == 1  # the same epoch continues
        request = s.begin()
        with pytest.raises(MasterDeposed, match="lost records of its epoch 1"):
            while request is not None:
                reply, _ = m.handshake(KEY, request, now_ms=0)
                request = s.on_handshake_reply(reply)
        assert core.deposed and not s.attached
        assert log_bytes(slave) == slave_log
        done: list[ReplicaStatus] = []
        core.wait_for_acks(1, 2, 0, 10_000, done.append)
        assert done == [ReplicaStatus.SLAVE_NOT_AVAILABLE]


def test_a_slave_with_a_damaged_record_of_the_epoch_does_not_depose_its_master(stores):
    """The slave's own damage (an unreadable record) is never offered as a probe: it is
    cut and copied again, and the master leads on."""
    master, slave = stores
    write_epochs(master, (1, 0))
    put(master, "a", 50)
    replicate(master, slave)
    damaged = boundaries(slave)[-1]
    seg = next(seg for seg in slave.commitlog.segments if seg.start <= damaged < seg.end)
    with open(seg.path, "r+b") as f:  # bit rot in the record's header: its CRC breaks
        f.seek(damaged - seg.start + 8)
        f.write(b"\xff\xff\xff\xff")
    core = MasterReplication(QuorumConfig(), 64 * 1024, 16 * 1024)
    m, s = MasterLink(core, master), SlaveLink(slave, broker_id=1)
    request = s.begin()
    while request is not None:
        reply, _ = m.handshake(KEY, request, now_ms=0)
        request = s.on_handshake_reply(reply)
    assert not core.deposed and s.last_cut is not None and s.last_cut["offset"] == damaged


def test_a_slave_holding_a_newer_epoch_deposes_the_master_whatever_epoch_it_names(stores):
    """A slave's epoch history is proof too: records of epoch 3 had a master of epoch 3,
    even in a request that names an older one (a slave that restarted and forgot it)."""
    master, slave = stores
    write_epochs(master, (1, 0), (2, 0))
    write_epochs(slave, (1, 0), (3, 0))
    core = MasterReplication(QuorumConfig(), 1024, 1024)
    m, s = MasterLink(core, master), SlaveLink(slave, broker_id=1)
    request = {**s.begin(), "master_epoch": 1}
    with pytest.raises(MasterDeposed, match="follows master epoch 3"):
        m.handshake(KEY, request, now_ms=0)
    assert core.deposed and core.highest_epoch == 3


def test_a_master_epoch_history_that_contradicts_the_slaves_is_refused_clearly(stores):
    """A broken master names an epoch newer than the slave's last that starts below it:
    the slave's epoch file cannot take it, and the session ends with a clear error
    instead of an exception the HA shell does not expect."""
    _, slave = stores
    put(slave, "a", 20)
    write_epochs(slave, (1, 0), (3, boundaries(slave)[10]))
    s = SlaveLink(slave, broker_id=1)
    s.begin()
    end = slave.commitlog.max_offset
    with pytest.raises(HamqError, match="epoch history"):
        s.on_handshake_reply({"start_offset": end, "epoch": 5, "epochs": [[1, 0], [5, 10]]})
    assert epochs(slave) == [(1, 0), (3, boundaries(slave)[10])]
