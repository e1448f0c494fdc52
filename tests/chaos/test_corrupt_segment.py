"""The ``corrupt`` nemesis on real processes: one byte flipped inside a message body of a
closed commit-log segment of one member, while it runs (Jepsen found NATS JetStream losing
acknowledged writes to this).

Before the fix a pull handed the damaged body out as a valid message (a phantom: the
client checks the record header's CRC, not the payload's), and a restart that had to scan
the damaged record (its checkpoint older than it) cut the log there, dropping every
acknowledged message after it. Now reads from closed segments check both CRCs: a member
with replicas puts the record back from another member's copy and serves it; a single
broker refuses that one record (CRC_MISMATCH, counted and logged) and serves the rest; and
recovery keeps a closed segment's damaged record instead of cutting the log.

Replication never spreads the damage: a slave checks both CRCs of every record it appends
and drops the session at a damaged one (a slave catching up through a master's damaged
record retries until a client read has the master repair it: the HA path neither checks
nor repairs by itself); what a slave holds is only read by clients
once it serves reads or is elected (controller election, DLedger leadership), and those
reads are checked and repaired like a master's.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from controller_group import CLUSTER, ControllerGroup
from controller_group import GROUP as CONTROLLED_GROUP
from controller_group import MEMBERS as CONTROLLED
from test_dledger import Group

import hamq
from hamq.client.consumer import PullStatus
from hamq.errors import HamqError
from hamq.net.connection import connect
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.message import decode_records, parse_record_header
from helpers import wait_for

TOPIC = "Rot"
SEGMENT_BYTES = 16 * 1024  # a few hundred small messages close several segments
MESSAGES = 300
DAMAGED_INDEX = 10  # the record of the first (closed) segment whose body gets the flip


def body(i: int) -> bytes:
    return b"m-%05d-" % i + b"x" * 200


def send_all(namesrv: str) -> None:
    with hamq.Admin(namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    with hamq.Producer(namesrv) as producer:
        for i in range(MESSAGES):
            assert producer.send(hamq.Message(TOPIC, body(i))).status is hamq.SendStatus.SEND_OK


def flip_body_byte(store_dir: Path) -> int:
    """Flip the last byte (message body) of the topic's DAMAGED_INDEX-th record of the
    first segment, in place, as bit rot would; returns that record's queue offset."""
    commitlog = store_dir / "commitlog"
    segments = sorted(commitlog.iterdir())
    assert len(segments) > 2, "no closed segment yet"
    data = segments[0].read_bytes()
    pos = 0
    while (header := parse_record_header(data, pos)).topic != TOPIC or (
        header.base_queue_offset < DAMAGED_INDEX
    ):
        pos += header.total_size
    at = pos + header.total_size - 1
    with open(segments[0], "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x5A]))
    return header.base_queue_offset


def pull_all(namesrv: str) -> tuple[dict[int, bytes], dict[int, str]]:
    """Every message of the topic's queue one offset at a time: (offset -> body, offset ->
    the error a pull of it got)."""
    got: dict[int, bytes] = {}
    errors: dict[int, str] = {}
    with hamq.PullConsumer("g-rot", namesrv) as consumer:
        (mq,) = consumer.fetch_message_queues(TOPIC)
        for offset in range(consumer.max_offset(mq)):
            try:
                result = consumer.pull(mq, offset, 1)
            except HamqError as err:
                errors[offset] = err.message
                continue
            assert result.status is PullStatus.FOUND, (offset, result.status)
            got[offset] = result.messages[0].body
    return got, errors


def wait_served_intact(namesrv: str, timeout_s: float) -> None:
    """Until every message is served intact (a refused read starts the repair); no read
    may ever hand out a damaged body."""

    def all_intact() -> bool:
        got, errors = pull_all(namesrv)
        assert {o: b for o, b in got.items() if b != body(o)} == {}
        return not errors and len(got) == MESSAGES

    wait_for(all_intact, timeout_s, "every message served intact")


def wait_routed(admin: hamq.Admin, group: str, addr: str) -> None:
    """Until the name server routes the group's reads to ``addr`` (the elected member)."""
    wait_for(lambda: admin.master_addrs().get(group) == addr, 20, f"{group} routed to {addr}")


def test_single_broker_refuses_the_damaged_record_and_serves_the_rest(cluster_factory):
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(flush_disk_type="sync", mapped_file_size_commitlog=SEGMENT_BYTES)
    send_all(c.namesrv)
    damaged = flip_body_byte(c.root / "broker")
    got, errors = pull_all(c.namesrv)
    # no phantom: nothing handed out differs from what was sent
    assert {o: b for o, b in got.items() if b != body(o)} == {}
    # one copy cannot be repaired: that record alone is refused, every other one served
    assert list(errors) == [damaged] and "damaged" in errors[damaged]
    assert sorted(got) == [o for o in range(MESSAGES) if o != damaged]
    assert "is damaged: CRC mismatch" in (c.root / "broker.log").read_text()


def test_restart_scanning_a_damaged_record_keeps_the_log_after_it(cluster_factory):
    """A checkpoint older than the damaged record (kill -9 before the next one) makes
    recovery scan it: a closed segment's record whose payload fails its CRC is not a torn
    tail, and the acknowledged messages after it stay."""
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(
        flush_disk_type="sync",
        mapped_file_size_commitlog=SEGMENT_BYTES,
        flush_interval_consume_queue_ms=600_000,  # no checkpoint past the first one
    )
    send_all(c.namesrv)
    damaged = flip_body_byte(c.root / "broker")
    c.procs["broker"].kill9()
    c.procs["broker"].start()
    got, errors = pull_all(c.namesrv)
    assert {o: b for o, b in got.items() if b != body(o)} == {}
    lost = [o for o in range(damaged + 1, MESSAGES) if o not in got]
    assert lost == [], f"{len(lost)} acknowledged messages after the damaged record lost"
    assert list(errors) == [damaged]


def start_pair(cluster_factory):
    """A sync master and one slave under sync flush, every message on both."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    common = {"flush_disk_type": "sync", "mapped_file_size_commitlog": SEGMENT_BYTES}
    c.start_broker("master", broker_role="sync_master", total_replicas=2, **common)
    c.start_broker("slave", broker_id=1, broker_role="slave", total_replicas=2, **common)
    with hamq.Admin(c.namesrv) as admin:

        def slave_transfers() -> bool:
            slaves = admin.broker_runtime_info(c.broker_addr("master"))["ha"]["slaves"]
            return len(slaves) == 1 and slaves[0]["state"] == "TRANSFER"

        wait_for(slave_transfers, 15, "slave attached")
    send_all(c.namesrv)
    return c


def segment_bytes(c, member: str) -> bytes:
    return sorted((c.root / member / "commitlog").iterdir())[0].read_bytes()


def test_master_repairs_a_damaged_record_from_its_slave(cluster_factory):
    c = start_pair(cluster_factory)
    flip_body_byte(c.root / "master")
    wait_served_intact(c.namesrv, 20)
    assert segment_bytes(c, "master") == segment_bytes(c, "slave")  # repaired on disk


def pull_from(addr: str, offset: int) -> tuple[int, bytes]:
    """One message of the queue straight from the member at ``addr`` (a slave serves
    reads too): (response code, body or remark)."""

    async def pull() -> tuple[int, bytes]:
        conn = await connect(addr, None)
        try:
            ext = {"topic": TOPIC, "queue_id": 0, "queue_offset": offset, "max_msgs": 1}
            frame = await conn.request(RequestCode.PULL_MESSAGE, ext, timeout_s=5)
        finally:
            conn.close()
        if frame.code != ResponseCode.SUCCESS:
            return frame.code, frame.remark.encode()
        (message,) = decode_records(frame.body, offset, lambda *a: a[-1])
        return frame.code, message

    return asyncio.run(pull())


def test_damage_on_a_slave_never_reaches_a_client(cluster_factory):
    c = start_pair(cluster_factory)
    damaged = flip_body_byte(c.root / "slave")
    slave = c.broker_addr("slave")

    def served_intact() -> bool:
        code, got = pull_from(slave, damaged)
        assert code != ResponseCode.SUCCESS or got == body(damaged)  # never the damaged body
        return code == ResponseCode.SUCCESS

    wait_for(served_intact, 20, "the slave serves the record, repaired from its master")
    assert segment_bytes(c, "slave") == segment_bytes(c, "master")


def test_dledger_member_elected_with_a_damaged_record_serves_it_repaired(cluster_factory):
    """A follower's damage, then leadership moved to it: the new leader's reads take the
    record back from a peer."""
    group = Group(cluster_factory, flush_disk_type="sync", mapped_file_size_commitlog=SEGMENT_BYTES)
    try:
        send_all(group.c.namesrv)
        target = next(m for m in group.members if m != group.leader())
        wait_for(
            lambda: (
                group.info(target)["commitlog_max_offset"]
                == group.info(group.leader())["commitlog_max_offset"]
            ),
            20,
            "the follower holds every record",
        )
        flip_body_byte(group.c.root / f"m{target}")
        group.admin.elect("dl", target)
        wait_routed(group.admin, "dl", group.c.broker_addr(f"m{target}"))
        wait_served_intact(group.c.namesrv, 30)
    finally:
        group.close()


def test_controller_slave_elected_with_a_damaged_record_serves_it_repaired(cluster_factory):
    """Controller mode (all_ack_in_sync_state_set): a slave's damage, then an admin
    election of that slave: the new master takes the record back from a member's copy."""
    group = ControllerGroup(
        cluster_factory, flush_disk_type="sync", mapped_file_size_commitlog=SEGMENT_BYTES
    )
    try:
        send_all(group.c.namesrv)
        master = group.master()
        target = next(m for m in CONTROLLED if m != master)
        wait_for(lambda: group.log_end(target) == group.log_end(master), 20, "the slave holds all")
        flip_body_byte(group.c.root / target)
        target_id = group.role(target)["broker_id"]
        group.controller_call(
            lambda cc: cc.elect_master(CLUSTER, CONTROLLED_GROUP, target_id, "admin")
        )
        assert group.master(other_than=master) == target
        wait_routed(group.admin, CONTROLLED_GROUP, group.c.broker_addr(target))
        wait_served_intact(group.c.namesrv, 30)
    finally:
        group.close()


def test_scrub_repairs_a_slave_record_no_client_reads(cluster_factory):
    """No client reads the slave's damaged record: the scrub of its closed segments (every
    scrub_interval_ms, 5 s by default) finds it and takes it back from the master."""
    c = start_pair(cluster_factory)
    flip_body_byte(c.root / "slave")
    wait_for(
        lambda: segment_bytes(c, "slave") == segment_bytes(c, "master"),
        30,
        "the slave's segment repaired on disk without a read",
    )
    with hamq.Admin(c.namesrv) as admin:
        info = admin.broker_runtime_info(c.broker_addr("slave"))["scrub"]
    assert info["damaged_found"] == 1 and info["repaired"] == 1 and info["damaged_now"] == 0


def test_scrub_of_a_single_broker_counts_the_damage_once_and_never_serves_it(cluster_factory):
    """No peer holds a copy: the scrub counts and logs the record once, reads refuse it,
    and later passes leave the damaged segment alone (no loop over it)."""
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(
        flush_disk_type="sync", mapped_file_size_commitlog=SEGMENT_BYTES, scrub_interval_ms=100
    )
    send_all(c.namesrv)
    damaged = flip_body_byte(c.root / "broker")
    with hamq.Admin(c.namesrv) as admin:
        addr = c.broker_addr("broker")
        wait_for(
            lambda: admin.broker_runtime_info(addr)["scrub"]["damaged_found"] == 1,
            20,
            "the scrub found the damaged record",
        )
        first = admin.broker_runtime_info(addr)["scrub"]
        deadline = time.monotonic() + 2  # 20 passes: none checks the segment again
        while time.monotonic() < deadline:
            assert admin.broker_runtime_info(addr)["scrub"] == first
    assert first["damaged_now"] == 1 and first["repaired"] == 0
    got, errors = pull_all(c.namesrv)
    assert list(errors) == [damaged] and damaged not in got
    text = (c.root / "broker.log").read_text()
    assert text.count("scrub found the commit log record") == 1
    assert text.count("no other member") == 1


def test_a_restarted_broker_seals_its_old_segments_and_still_catches_a_flip(cluster_factory):
    """Segments opened from disk are checked on every read until verified: the scrub
    checks each once and seals it (reads then cost an fstat, not a CRC per record), and a
    byte flipped after that moves the mtime, so it is caught, never served."""
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(
        flush_disk_type="sync", mapped_file_size_commitlog=SEGMENT_BYTES, scrub_interval_ms=100
    )
    send_all(c.namesrv)
    c.restart("broker")
    closed = len(list((c.root / "broker" / "commitlog").iterdir())) - 1
    with hamq.Admin(c.namesrv) as admin:
        addr = c.broker_addr("broker")
        wait_for(
            lambda: admin.broker_runtime_info(addr)["scrub"]["segments_sealed"] == closed,
            30,
            f"the restarted broker's {closed} closed segments sealed",
        )
    damaged = flip_body_byte(c.root / "broker")
    got, errors = pull_all(c.namesrv)
    assert {o: b for o, b in got.items() if b != body(o)} == {}
    assert list(errors) == [damaged]
    assert sorted(got) == [o for o in range(MESSAGES) if o != damaged]
