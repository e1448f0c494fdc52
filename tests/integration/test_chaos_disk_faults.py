"""The chaos suite's disk and clock faults on real child processes: a slow fsync really
takes that long, a power loss keeps exactly what was fsynced, a full tmpfs refuses writes
until freed, a clock jump moves a child's wall clock and not its monotonic clock — and a
real broker under the shim: with sync flush a power loss takes no acknowledged message,
with async flush it takes the unflushed tail and the broker still opens."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import hamq
from hamq import Message
from hamq.chaos.clock_faults import ClockFaults
from hamq.chaos.disk_faults import DiskFaults
from hamq.errors import HamqError
from helpers import free_port, wait_for

CHILD_TIMEOUT_S = 30.0
HOST = "h1"
TOPIC = "DiskFaults"
QUEUES = 4
SENDS = 5000  # an upper bound: the broker is killed once its log holds two segments
LOAD_TIMEOUT_S = 30.0
SEGMENT_BYTES = 64 * 1024
DLEDGER_MEMBERS = (1, 2, 3)


def run_child(env: dict[str, str], code: str) -> dict:
    """Run ``code`` in a fresh Python under ``env``; it prints one JSON object."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def disks(tmp_path):
    faults = DiskFaults(tmp_path / "run")
    yield faults
    faults.close()


def test_slow_fsync_takes_at_least_slow_ms(disks):
    code = """if True:
        import json, os, tempfile, time
        fd, _ = tempfile.mkstemp(dir=os.environ["HAMQ_SHIM_DIR"])
        os.write(fd, b"x")
        took = []
        for sync in (os.fsync, os.fdatasync):
            t = time.monotonic(); sync(fd); took.append(time.monotonic() - t)
        print(json.dumps(took))
    """
    env = disks.env(HOST)
    disks.slow_disk(HOST, 1500)
    assert all(took >= 1.5 for took in run_child(env, code))
    disks.fast_disk(HOST)
    assert all(took < 1.5 for took in run_child(env, code))


def test_power_loss_keeps_exactly_what_was_fsynced(disks):
    data = disks.data_dir(HOST)
    code = f"""if True:
        import os
        os.chdir({str(data)!r})
        def write(name, data, flags=0):
            fd = os.open(name, os.O_RDWR | os.O_CREAT | flags)
            os.write(fd, data)
            return fd
        fd = write("appended", b"a" * 1000)   # fsynced, then a tail that is not
        os.fsync(fd); os.write(fd, b"b" * 500)
        fd = write("cut", b"c" * 800)         # fsynced, cut, grown again unfsynced
        os.fdatasync(fd); os.ftruncate(fd, 300)
        os.lseek(fd, 0, os.SEEK_END); os.write(fd, b"d" * 900)
        write("renamed", b"old")              # an atomic write: temp fsynced, renamed
        fd = write("renamed.tmp", b"new content"); os.fsync(fd)
        os.replace("renamed.tmp", "renamed")
        write("never", b"e" * 700)            # never fsynced
        os.makedirs("sub", exist_ok=True)
        fd = write("sub/nested", b"f" * 64); os.fsync(fd); os.write(fd, b"g")
        print("{{}}")
    """
    run_child(disks.env(HOST), code)
    (disks.host_dir(HOST) / "broker.log").write_text("the runner's log, not the host's disk")
    counts = disks.power_loss(disks.host_dir(HOST))
    assert (data / "appended").read_bytes() == b"a" * 1000
    assert (data / "cut").read_bytes() == b"c" * 300
    assert (data / "renamed").read_bytes() == b"new content"
    assert (data / "never").read_bytes() == b""
    assert (data / "sub" / "nested").read_bytes() == b"f" * 64
    assert (disks.host_dir(HOST) / "broker.log").read_text().startswith("the runner's")
    assert counts == {"files": 5, "truncated": 4, "bytes_dropped": 500 + 900 + 700 + 1}


def test_power_loss_of_a_host_that_never_fsynced_drops_all_it_wrote(disks):
    """A name server's host fsyncs nothing: the shim's log exists from its processes'
    start, so its power loss drops every byte (before, it refused the host as shimless and
    crashed the chaos run)."""
    data = disks.data_dir(HOST)
    code = f"""if True:
        import os
        fd = os.open({str(data / "kv.json")!r}, os.O_RDWR | os.O_CREAT)
        os.write(fd, b"never fsynced")
        print("{{}}")
    """
    run_child(disks.env(HOST), code)
    assert disks.power_loss(disks.host_dir(HOST)) == {
        "files": 1,
        "truncated": 1,
        "bytes_dropped": len(b"never fsynced"),
    }
    assert (data / "kv.json").read_bytes() == b""


def test_full_tmpfs_refuses_writes_until_freed(disks):
    data = disks.data_dir(HOST, tmpfs_mib=4)
    mounts = Path("/proc/self/mounts").read_text()
    assert f" {data} tmpfs " in mounts
    code = f"""if True:
        import json, os
        try:
            with open({str(data / "w")!r}, "ab") as f:
                f.write(b"w" * 65536)
            print(json.dumps(0))
        except OSError as err:
            print(json.dumps(err.errno))
    """
    disks.fill(HOST)
    assert run_child({}, code) == errno.ENOSPC
    disks.free(HOST)
    assert run_child({}, code) == 0
    disks.close()
    assert f" {data} tmpfs " not in Path("/proc/self/mounts").read_text()


@pytest.mark.parametrize("jump_s", [3600, -7200.5])
def test_clock_jump_moves_a_running_childs_wall_clock_not_monotonic(tmp_path, jump_s):
    """The jump reaches a process already running; its monotonic clock stays the system's;
    time.sleep and hand-offs to worker threads keep working under libfaketime (both broke:
    see fsync_shim.c and ClockFaults.env)."""
    disks, clock = DiskFaults(tmp_path / "run"), ClockFaults(tmp_path / "run")
    go = tmp_path / "go"
    code = """if True:
        import asyncio, json, os, sys, time
        before = time.time() - time.monotonic()
        open(sys.argv[1] + ".ready", "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        after = time.time() - time.monotonic()
        async def hop_s():
            start = time.monotonic()
            for _ in range(40):
                await asyncio.to_thread(int)
            return (time.monotonic() - start) / 40
        now = time.monotonic()
        print(json.dumps({"shift": after - before, "mono": now, "hop_s": asyncio.run(hop_s())}))
    """
    env = {**os.environ, **disks.env(HOST, shim=True, clock=True)}
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(go)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: Path(f"{go}.ready").exists(), CHILD_TIMEOUT_S, "the child")
        clock.jump(HOST, jump_s)
        go.touch()
        out, _ = child.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        child.kill()
    assert child.returncode == 0
    seen = json.loads(out)
    assert abs(seen["shift"] - jump_s) < 1.0, seen
    assert 0 <= time.monotonic() - seen["mono"] < CHILD_TIMEOUT_S, seen
    # a hop takes 0.2-0.5 ms on average here; with libfaketime's monotonic fix on, a third
    # of them take 10-170 ms, 24-170 ms on average
    assert seen["hop_s"] < 0.01, seen
    clock.reset(HOST)
    code = "import json, time; print(json.dumps(time.time()))"
    assert abs(run_child(disks.env(HOST, clock=True), code) - time.time()) < CHILD_TIMEOUT_S


# -- a real broker under the shim -------------------------------------------------------------


def send_all(namesrv: str, count: int, stop: threading.Event | None = None) -> dict:
    """Send up to ``count`` messages one at a time (no client retries), until a send
    fails or ``stop`` is set; body -> (queue, offset) of every one acknowledged SEND_OK."""
    acked: dict[bytes, tuple[int, int]] = {}
    with hamq.Producer(namesrv, retry_times_when_send_failed=0) as producer:
        for i in range(count):
            if stop is not None and stop.is_set():
                break
            body = f"m{i}:".encode().ljust(200, b"#")
            try:
                result = producer.send(Message(TOPIC, body))
            except HamqError:
                break  # the broker was killed: this send's outcome is unknown
            if result.status is hamq.SendStatus.SEND_OK:
                acked[body] = (result.queue.queue_id, result.queue_offset)
    return acked


def power_loss_mid_stream(c, disks, monkeypatch, **settings) -> tuple[dict, dict]:
    """A broker under the shim, its store on the host's data dir, SIGKILLed while a producer
    sends, its host's power lost, restarted (the harness raises with the broker's log if it
    does not open). Returns (what was acknowledged, what the power loss dropped)."""
    c.start_namesrv()
    for name, value in disks.env(HOST).items():
        monkeypatch.setenv(name, value)  # the harness starts servers with this environment
    broker = c.start_broker(
        store_dir=str(disks.data_dir(HOST) / "broker"),
        mapped_file_size_commitlog=SEGMENT_BYTES,
        **settings,
    )
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, QUEUES)
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(send_all, c.namesrv, SENDS, stop)
        try:
            wait_for(lambda: store_bytes(disks) > SEGMENT_BYTES * 2, LOAD_TIMEOUT_S, "sends")
            broker.kill9()
        finally:
            stop.set()
        acked = sending.result(LOAD_TIMEOUT_S)
    dropped = disks.power_loss(disks.host_dir(HOST))
    broker.start()
    return acked, dropped


def store_bytes(disks: DiskFaults, store: str = "broker") -> int:
    log = disks.data_dir(HOST) / store / "commitlog"
    return sum(p.stat().st_size for p in log.iterdir()) if log.is_dir() else 0


def read_back(drain_topic, namesrv: str) -> dict[bytes, tuple[int, int]]:
    got = drain_topic(namesrv, TOPIC)
    return {body: (qid, off) for qid, entries in got.items() for off, body in entries}


def test_power_loss_takes_no_message_acknowledged_under_sync_flush(
    cluster_factory, disks, monkeypatch, drain_topic
):
    c = cluster_factory()
    acked, dropped = power_loss_mid_stream(c, disks, monkeypatch, flush_disk_type="sync")
    assert acked and dropped["files"] > 0
    readable = read_back(drain_topic, c.namesrv)
    missing = [body[:8] for body, where in acked.items() if readable.get(body) != where]
    assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:5]}"


@pytest.mark.parametrize("flush_interval_ms", [500, 600_000])
def test_power_loss_under_async_flush_loses_a_tail_and_the_broker_opens(
    cluster_factory, disks, monkeypatch, drain_topic, record_property, flush_interval_ms
):
    """Async flush acknowledges before the fsync: a power loss may take the unflushed tail
    (all of it when no flush ran: 600 s), never a middle; the broker opens and takes sends."""
    c = cluster_factory()
    acked, dropped = power_loss_mid_stream(
        c,
        disks,
        monkeypatch,
        flush_disk_type="async",
        flush_interval_commitlog_ms=flush_interval_ms,
    )
    readable = read_back(drain_topic, c.namesrv)
    lost = [body for body in acked if body not in readable]
    record_property("lost", len(lost))
    print(
        f"async flush ({flush_interval_ms} ms) power loss: {len(lost)} of {len(acked)} "
        f"acknowledged lost, {dropped}"
    )
    # nothing is read that was not acknowledged where it was (the kill's own send may have
    # been stored unanswered: it is read at the end of its queue or not at all)
    unacked = [body for body in readable if body not in acked]
    assert len(unacked) <= 1
    assert all(acked[body] == where for body, where in readable.items() if body in acked)
    for qid in range(QUEUES):  # each queue keeps a prefix: a power loss drops tails
        offsets = sorted(off for q, off in readable.values() if q == qid)
        assert offsets == list(range(len(offsets)))
    if flush_interval_ms > LOAD_TIMEOUT_S * 1000:
        assert dropped["bytes_dropped"] >= SEGMENT_BYTES * 2 and len(lost) == len(acked)
    assert send_all(c.namesrv, 1)


def test_corrupt_flips_a_body_byte_of_a_closed_segment(cluster_factory, disks, monkeypatch):
    """``corrupt`` on a real broker's store changes one byte, in a closed segment (where in
    a record: tests/unit/test_chaos_disk_faults.py)."""
    c = cluster_factory()
    power_loss_mid_stream(c, disks, monkeypatch, flush_disk_type="sync")
    c.procs["broker"].stop()
    store = disks.data_dir(HOST) / "broker"
    segments = sorted((store / "commitlog").iterdir())
    before = {path: path.read_bytes() for path in segments}
    where = disks.corrupt(store, random.Random(7))
    name, _, at = where.rpartition("@")
    path, offset = Path(name), int(at)
    assert path in segments[:-1], "corrupted the newest segment"
    data = path.read_bytes()
    assert [i for i, (a, b) in enumerate(zip(before[path], data)) if a != b] == [offset]
    assert all(p.read_bytes() == before[p] for p in segments if p != path)


def start_dledger_group(c, disks: DiskFaults, **settings) -> list:
    """Three DLedger members of group "dl" on one host's data dir (their files apart by
    inode: one shim log serves them all)."""
    raft = {m: f"127.0.0.1:{free_port()}" for m in DLEDGER_MEMBERS}
    peers = [f"{m}@{addr}" for m, addr in raft.items()]
    return [
        c.start_broker(
            f"m{m}",
            broker_name="dl",
            broker_id=m,
            replication_mode="dledger",
            dledger_self_id=m,
            dledger_peers=peers,
            store_dir=str(disks.data_dir(HOST) / f"m{m}"),
            mapped_file_size_commitlog=SEGMENT_BYTES,
            **settings,
        )
        for m in DLEDGER_MEMBERS
    ]


def test_coordinated_power_loss_of_a_dledger_group_takes_nothing_acknowledged(
    cluster_factory, disks, monkeypatch, drain_topic
):
    """Every member loses power at once (Jepsen's coordinated crash): what a majority had
    fsynced before acknowledging is still there, on whichever member leads next."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    for name, value in disks.env(HOST).items():
        monkeypatch.setenv(name, value)
    members = start_dledger_group(c, disks, flush_disk_type="sync")
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: "dl" in admin.master_addrs(), LOAD_TIMEOUT_S, "a DLedger leader")
        admin.create_topic(TOPIC, QUEUES)
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(send_all, c.namesrv, SENDS, stop)
        try:
            wait_for(
                lambda: sending.done() or store_bytes(disks, "m1") > 0, LOAD_TIMEOUT_S, "sends"
            )
            time.sleep(1.0)  # a second of steady sends (bounded by SENDS)
            for member in members:
                member.kill9()
        finally:
            stop.set()
        acked = sending.result(LOAD_TIMEOUT_S)
    dropped = disks.power_loss(disks.host_dir(HOST))
    for member in members:
        member.start()
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: "dl" in admin.master_addrs(), LOAD_TIMEOUT_S, "a leader after restart")
    assert acked and dropped["files"] > 0
    print(f"DLedger coordinated power loss: {len(acked)} acknowledged, {dropped}")
    readable = wait_for(
        lambda: (got := read_back(drain_topic, c.namesrv)) and set(acked) <= set(got) and got,
        LOAD_TIMEOUT_S,
        "every acknowledged message readable",
    )
    assert all(readable[body] == where for body, where in acked.items())


def send_ok(producer) -> bool:
    try:
        return producer.send(Message(TOPIC, b"f" * 2000)).status is hamq.SendStatus.SEND_OK
    except HamqError:
        return False


def test_a_full_disk_refuses_sends_and_freeing_it_heals_a_sync_flush_broker(
    cluster_factory, disks, monkeypatch
):
    c = cluster_factory()
    c.start_namesrv()
    for name, value in disks.env(HOST).items():
        monkeypatch.setenv(name, value)
    c.start_broker(
        store_dir=str(disks.data_dir(HOST, tmpfs_mib=64) / "broker"),
        flush_disk_type="sync",
        mapped_file_size_commitlog=1 << 20,
        # the guards' defaults (64 and 50 MiB free) would refuse every write on this disk
        disk_min_free_bytes=4 << 20,
        disk_free_limit_bytes=4 << 20,
    )
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, QUEUES)
    with hamq.Producer(c.namesrv, retry_times_when_send_failed=0, send_timeout_s=2) as producer:
        assert send_ok(producer)
        disks.fill(HOST)
        wait_for(lambda: not send_ok(producer), LOAD_TIMEOUT_S, "a send refused on a full disk")
        disks.free(HOST)
        wait_for(lambda: send_ok(producer), LOAD_TIMEOUT_S, "a send accepted once freed")
