"""Real servers facing well-framed hostile requests (issue 12): names that would reach the
file system, system topics, forged registrations, clients that open many connections,
trickle bytes or never read, and fields out of range. Each is refused with a precise error
or bounded, nothing that should have been refused is stored, the server keeps serving and
restarts, and memory stays within a stated bound (VmRSS of the server process)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

import hamq
from hamq import Message
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import FrameDecoder, encode_frame_bytes, pack_body, unpack_body
from hamq.protocol.message import encode_batch, encode_message
from helpers import free_port, scrape_metrics, send_and_pull, wait_for

MIB = 1024 * 1024
SYSTEM_TOPICS = [
    "SCHEDULE_TOPIC_XXXX",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "rmq_sys_REVIVE_LOG",
    "TBW102",
    "rmq_sys_ANYTHING",
]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        kib = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return kib / 1024


def ask(conn, code: int, opaque: int, ext: dict, body: bytes = b""):
    conn.send(encode_frame_bytes(code, opaque, ext=ext, body=body))
    answer = conn.read_frame()
    while answer is not None and answer.opaque == 0 and opaque != 0:  # a notice, unasked
        answer = conn.read_frame()
    assert answer is not None and answer.opaque == opaque, answer
    return answer


def send_ext(topic: str, body: bytes = b"x", **ext) -> tuple[dict, bytes]:
    payload, crc = encode_batch([encode_message(body)])
    return {"topic": topic, "queue_id": 0, "count": 1, "crc": crc, **ext}, payload


@pytest.fixture
def auto_cluster(cluster_factory):
    """A name server and a broker that auto-creates topics on first send (the widest door
    for a hostile name)."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    c.start_broker(auto_create_topic_enable=True)
    return c


# -- 1. names that reach the file system ------------------------------------------------
@pytest.mark.parametrize(
    "name, says",
    [
        ("..", "directory reference"),
        (".", "directory reference"),
        ("a\0b", "NUL"),
        ("../etc", "'/'"),
        ("a\\b", "'\\\\'"),
        ("", "empty"),
        ("tab\there", "'\\t'"),
    ],
    ids=["dotdot", "dot", "nul", "slash", "backslash", "empty", "tab"],
)
def test_unsafe_topic_names_are_refused_everywhere(auto_cluster, raw_conn, name, says):
    """Create, send (auto-create) and delete of a name that would leave or break the store
    directory are refused with MESSAGE_ILLEGAL naming the problem; the store is whole and
    the broker restarts."""
    c = auto_cluster
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("Safe", 1)
    conn = raw_conn(c.broker_addr())
    store = c.root / "broker"
    ext, body = send_ext(name)
    for code, request_ext, request_body in [
        (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": name}, b""),
        (RequestCode.SEND_MESSAGE, ext, body),
        (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": name}, b""),
    ]:
        answer = ask(conn, code, 7, request_ext, request_body)
        assert answer.code == ResponseCode.MESSAGE_ILLEGAL, (code, answer)
        assert "topic" in answer.remark and says in answer.remark, answer.remark
    assert (store / "commitlog").is_dir() and (store / "checkpoint").exists()
    assert {p.name for p in (store / "consumequeue").iterdir()} <= {
        "Safe",
        "TBW102",
        "rmq_sys_REVIVE_LOG",
    }
    assert not list(store.glob("[0-9]*")) and not list(store.glob("consumequeue/[0-9]*"))
    c.restart("broker")
    send_and_pull(c.namesrv, "Safe")


# -- 2. system topics are the broker's own ---------------------------------------------
def test_clients_cannot_create_change_delete_or_write_system_topics(auto_cluster, raw_conn):
    c = auto_cluster
    conn = raw_conn(c.broker_addr())
    for topic in SYSTEM_TOPICS:
        ext, body = send_ext(topic, b"not-an-offset")
        for code, request_ext, request_body in [
            (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "perm": 6}, b""),
            (RequestCode.SEND_MESSAGE, ext, body),
            (RequestCode.SEND_BATCH_MESSAGE, ext, body),
            (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}, b""),
        ]:
            answer = ask(conn, code, 8, request_ext, request_body)
            assert answer.code == ResponseCode.NO_PERMISSION, (topic, code, answer)
            assert "system topic" in answer.remark
    configs = ask(conn, RequestCode.GET_ALL_TOPIC_CONFIG, 9, {})
    assert set(unpack_body(configs.body)) <= {"TBW102", "rmq_sys_REVIVE_LOG"}
    c.restart("broker")  # nothing a client wrote can stop the restart
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("AfterSys", 1)
    send_and_pull(c.namesrv, "AfterSys")


# -- 3. forged registrations on the name server -----------------------------------------
REAL = {"cluster_name": "TestCluster", "broker_name": "broker-a"}


def _topic_config(**cfg) -> bytes:
    return pack_body(
        {
            "topic_configs": {
                "Forged": {"read_queue_nums": 4, "write_queue_nums": 4, "perm": 6, **cfg}
            }
        }
    )


@pytest.mark.parametrize(
    "ext, body, field",
    [
        ({"broker_id": 2, "ha_addr": 123}, b"", "ha_addr"),
        ({"broker_id": 2, "ha_addr": "no-port"}, b"", "ha_addr"),
        ({"broker_id": 2}, _topic_config(read_queue_nums=0), "read_queue_nums"),
        ({"broker_id": 2}, _topic_config(write_queue_nums=-1), "write_queue_nums"),
        ({"broker_id": 2}, _topic_config(write_queue_nums=2**62), "write_queue_nums"),
        ({"broker_id": 2}, _topic_config(perm=1), "perm"),
        ({"broker_id": -1}, b"", "broker_id"),
        ({"broker_id": 2**62}, b"", "broker_id"),
        ({"broker_id": 2, "broker_addr": 5}, b"", "broker_addr"),
        ({"broker_id": 2, "cluster_name": "../x"}, b"", "cluster_name"),
        ({"broker_id": 2, "heartbeat_timeout_ms": 2**62}, b"", "heartbeat_timeout_ms"),
        ({"broker_id": 2}, pack_body({"data_version": {"counter": "x"}}), "data_version"),
    ],
    ids=[
        "ha_addr-int",
        "ha_addr-no-port",
        "queues-0",
        "queues-negative",
        "queues-2**62",
        "perm-inherit",
        "id-negative",
        "id-huge",
        "addr-int",
        "cluster-path",
        "timeout-huge",
        "data_version-str",
    ],
)
def test_registration_fields_are_checked(cluster, raw_conn, ext, body, field):
    """A registration with any field of the wrong type or range is INVALID_ARGUMENT naming
    the field, and nothing of it reaches the routes the clients and slaves read."""
    conn = raw_conn(cluster.namesrv_addrs[0])
    answer = ask(
        conn, RequestCode.REGISTER_BROKER, 3, {**REAL, "broker_addr": "127.0.0.1:1", **ext}, body
    )
    assert answer.code == ResponseCode.INVALID_ARGUMENT, answer
    assert field in answer.remark, answer.remark
    group = ask(conn, RequestCode.GET_BROKER_MEMBER_GROUP, 4, REAL)
    members = unpack_body(group.body)
    assert members["broker_addrs"] == {0: cluster.broker_addr()}
    assert members["ha_addrs"] == {0: _ha_listen(cluster)}
    assert (
        ask(conn, RequestCode.GET_ROUTEINFO_BY_TOPIC, 5, {"topic": "Forged"}).code
        == ResponseCode.TOPIC_NOT_EXIST
    )


def _ha_listen(cluster) -> str:
    text = (cluster.root / "broker.toml").read_text()
    return next(line.split('"')[1] for line in text.splitlines() if line.startswith("ha_listen"))


def test_registration_taking_over_a_live_members_id_is_refused(cluster, raw_conn):
    """Another address claiming the live master's id (or moving its group to another
    cluster) is refused and logged; routes keep the real broker, which keeps serving."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Owned", 2)
    conn = raw_conn(cluster.namesrv_addrs[0])
    for ext in ({**REAL, "broker_id": 0}, {**REAL, "broker_id": 5, "cluster_name": "Evil"}):
        answer = ask(
            conn,
            RequestCode.REGISTER_BROKER,
            6,
            {**ext, "broker_addr": "127.0.0.1:1"},
            _topic_config(),
        )
        assert answer.code == ResponseCode.NO_PERMISSION, answer
        assert "live" in answer.remark
    assert "registration from" in (cluster.root / "namesrv.log").read_text()
    with hamq.Admin(cluster.namesrv) as admin:
        assert len(admin.topic_route("Owned").write_queues) == 2
        assert "Forged" not in admin.topic_list()
    send_and_pull(cluster.namesrv, "Owned")


def test_a_slave_registration_does_not_open_the_masters_id(cluster, raw_conn):
    """A stranger that first registers as a slave under a free id, then claims id 0, is
    refused while the master heartbeats (it took the master's routes, and the master
    was locked out of its own id for the stranger's heartbeat_timeout_ms)."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Owned", 1)
    conn = raw_conn(cluster.namesrv_addrs[0])
    stranger = {**REAL, "broker_addr": "127.0.0.1:1", "heartbeat_timeout_ms": 600_000}
    assert (
        ask(conn, RequestCode.REGISTER_BROKER, 11, {**stranger, "broker_id": 7}).code
        == ResponseCode.SUCCESS
    )
    answer = ask(
        conn, RequestCode.REGISTER_BROKER, 12, {**stranger, "broker_id": 0}, _topic_config()
    )
    assert answer.code == ResponseCode.NO_PERMISSION, answer
    with hamq.Admin(cluster.namesrv) as admin:
        assert admin.topic_route("Owned").brokers["broker-a"][0] == cluster.broker_addr()
    send_and_pull(cluster.namesrv, "Owned")


FLOOD_GROUPS = 100  # forged groups of FLOOD_TOPICS topics each: 300k routes
FLOOD_TOPICS = 3000
REGISTER_BOUND_MS = 8  # a one-topic registration took 16..70 ms after the flood before
#   (0.1 ms since), and more the more routes


def test_a_flood_of_registrations_does_not_slow_every_later_one(cluster, raw_conn):
    """Registrations touch the routes of their own group only: after 300k routes of forged
    groups, a registration (every broker sends one each 30 s, blocking the name server's
    event loop while it is applied) still takes milliseconds."""
    topic = _made_topic(cluster)  # before forged groups join its cluster's admin view
    conn = raw_conn(cluster.namesrv_addrs[0])

    def register(name: str, port: int, topics: int, opaque: int) -> float:
        body = pack_body(
            {
                "topic_configs": {
                    f"{name}_{i}": {"read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}
                    for i in range(topics)
                }
            }
        )
        started = time.perf_counter()
        answer = ask(
            conn,
            RequestCode.REGISTER_BROKER,
            opaque,
            {
                "cluster_name": "Flood",
                "broker_name": name,
                "broker_id": 0,
                "broker_addr": f"127.0.0.1:{port}",
            },
            body,
        )
        assert answer.code == ResponseCode.SUCCESS, answer
        return (time.perf_counter() - started) * 1000

    for i in range(FLOOD_GROUPS):
        register(f"flood{i}", 1000 + i, FLOOD_TOPICS, i + 1)
    took = min(register("small", 999, 1, FLOOD_GROUPS + 1 + i) for i in range(5))
    assert took < REGISTER_BOUND_MS, f"a registration took {took:.1f} ms"
    send_and_pull(cluster.namesrv, topic)


def test_registrations_past_max_route_entries_are_refused(cluster_factory, raw_conn):
    """Forged groups cost the name server memory until they expire (at most 10 min, their
    choice): past max_route_entries a registration that adds routes or members is
    SYSTEM_BUSY naming the key, and the brokers already there keep registering."""
    c = cluster_factory()
    c.start_namesrv(max_route_entries=40)
    c.start_broker()
    conn = raw_conn(c.namesrv_addrs[0])
    forged = {"cluster_name": "Flood", "broker_id": 0}
    for i, (topics, code) in enumerate(
        [(30, ResponseCode.SUCCESS), (30, ResponseCode.SYSTEM_BUSY), (0, ResponseCode.SUCCESS)]
    ):
        body = pack_body(
            {
                "topic_configs": {
                    f"F{i}_{t}": {"read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}
                    for t in range(topics)
                }
            }
        )
        answer = ask(
            conn,
            RequestCode.REGISTER_BROKER,
            40 + i,
            {**forged, "broker_name": f"f{i}", "broker_addr": f"127.0.0.1:{i + 1}"},
            body,
        )
        assert answer.code == code, (i, answer)
        assert code == ResponseCode.SUCCESS or "max_route_entries" in answer.remark, answer
    with hamq.Admin(c.namesrv) as admin:
        assert "F1_0" not in admin.topic_list()
    with hamq.Admin(c.namesrv) as admin:  # the broker re-registers with one more
        admin.create_topic("Alive", 1, cluster="TestCluster")
    send_and_pull(c.namesrv, "Alive")


# -- 7. slowloris ---------------------------------------------------------------------
SLOW_CONNECTIONS = 32
SLOWLORIS_RSS_BOUND_MIB = 24  # 32 connections declaring 16 MiB each cost 512 MiB before


def _trickle(address: str, n: int) -> list[socket.socket]:
    """``n`` connections that each declare a 16 MiB frame and send a few bytes of it."""
    host, port = address.rsplit(":", 1)
    socks = []
    for _ in range(n):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(struct.pack(">II", 16 * MIB - 1, 20) + b"\x95")
        socks.append(sock)
    time.sleep(0.5)
    for sock in socks:  # the next read happens once the declared size is known
        sock.sendall(b"\x0a")
    return socks


@pytest.mark.parametrize("port", ["broker", "namesrv", "ha"])
def test_declared_frame_sizes_cost_nothing_until_sent(cluster, port):
    """Memory grows with the bytes that arrive, not the bytes a frame declares."""
    proc = cluster.procs["namesrv" if port == "namesrv" else "broker"]
    address = {
        "broker": cluster.broker_addr(),
        "namesrv": cluster.namesrv_addrs[0],
        "ha": _ha_listen(cluster),
    }[port]
    before = rss_mib(proc.pid)
    socks = _trickle(address, SLOW_CONNECTIONS)
    try:
        time.sleep(1.0)  # let the server read what arrived
        grown = rss_mib(proc.pid) - before
        assert grown < SLOWLORIS_RSS_BOUND_MIB, f"{port}: RSS grew {grown:.0f} MiB"
    finally:
        for sock in socks:
            sock.close()
    assert proc.alive()
    send_and_pull(cluster.namesrv, _made_topic(cluster))


def _made_topic(cluster) -> str:
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Alive", 1)
    return "Alive"


def test_idle_and_half_sent_connections_time_out(cluster_factory, raw_conn):
    """A frame begun and trickled but not finished is closed after frame_read_timeout_ms
    although bytes keep arriving, a silent connection after connection_idle_timeout_ms; a
    connection in use stays open."""
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(frame_read_timeout_ms=1000, connection_idle_timeout_ms=3000)
    addr = c.broker_addr()
    half, idle, busy = raw_conn(addr), raw_conn(addr), raw_conn(addr)
    half.send(struct.pack(">II", 1000, 20))
    started = time.monotonic()
    trickling = True
    for i in range(14):  # 5.6 s: the slowloris trickles, the busy client keeps asking
        if trickling:
            try:
                half.send(b"\0")
            except OSError:  # closed by the server
                trickling = False
                assert time.monotonic() - started >= 1.0
        assert ask(busy, RequestCode.GET_BROKER_RUNTIME_INFO, 10 + i, {}).code == 0
        time.sleep(0.4)
    assert half.closed_by_server(), "half-sent frame not timed out"
    assert idle.closed_by_server(), "idle connection not timed out"
    assert ask(busy, RequestCode.GET_BROKER_RUNTIME_INFO, 99, {}).code == 0
    log = (c.root / "broker.log").read_text()
    assert "still unfinished" in log and "idle for 3 s" in log


def test_connection_caps_per_address_and_per_server(cluster_factory):
    """Past max_connections_per_address (per client IP) or max_connections, a connection
    gets a SYSTEM_BUSY frame naming the limit and is closed; closing one makes room."""
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(max_connections=6, max_connections_per_address=3)
    host, port = c.broker_addr().rsplit(":", 1)
    opened: list[socket.socket] = []

    def connect(source: str) -> socket.socket:
        sock = socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))
        opened.append(sock)
        return sock

    def refused(sock: socket.socket) -> str:
        """The refusal's remark (a refused connection is told at once, unasked), or "" if
        the connection serves requests."""
        sock.settimeout(0.5)
        try:
            frames = FrameDecoder().feed(sock.recv(65536))
        except TimeoutError:  # nothing unasked: admitted
            sock.settimeout(5)
            sock.sendall(encode_frame_bytes(RequestCode.GET_BROKER_RUNTIME_INFO, 1))
            frames = FrameDecoder().feed(sock.recv(65536))
            assert (frames[0].code, frames[0].opaque) == (ResponseCode.SUCCESS, 1)
            return ""
        assert frames[0].code == ResponseCode.SYSTEM_BUSY, frames
        assert sock.recv(65536) == b""  # and closed
        return frames[0].remark

    try:
        # the broker's own connection to the name server is outgoing: it does not count
        assert [refused(connect("127.0.0.1")) for _ in range(3)] == ["", "", ""]
        assert "max_connections_per_address" in refused(connect("127.0.0.1"))
        assert [refused(connect("127.0.0.2")) for _ in range(3)] == ["", "", ""]
        assert "max_connections" in refused(connect("127.0.0.3"))
        opened[0].close()
        wait_for(lambda: not refused(connect("127.0.0.3")), 5, "room after a close")
    finally:
        for sock in opened:
            sock.close()


# -- 8. clients that do not read --------------------------------------------------------
PIPELINED_PULLS = 40
PENDING_RSS_BOUND_MIB = 48  # 16 MiB pending + one answer + slack; 40 answers are ~190 MiB


def _fill(cluster, topic: str, mib: int) -> None:
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic(topic, 1)
    with hamq.Producer(cluster.namesrv) as producer:
        for i in range(mib):
            producer.send_batch([Message(topic, bytes([i % 256]) * 1024)] * 1024)


def test_pipelined_pulls_from_a_client_that_does_not_read_are_bounded(cluster):
    """40 pulls of 4 MiB in one write from a client that reads nothing: the broker stops
    reading that connection once 16 MiB wait for the client, instead of building all 40
    answers; when the client reads, every answer arrives, in order, complete."""
    _fill(cluster, "Big", 48)
    host, port = cluster.broker_addr().rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        b"".join(
            encode_frame_bytes(
                RequestCode.PULL_MESSAGE,
                i + 1,
                ext={"topic": "Big", "queue_id": 0, "queue_offset": 0, "max_msgs": 65536},
            )
            for i in range(PIPELINED_PULLS)
        )
    )
    pid = cluster.procs["broker"].pid
    before = rss_mib(pid)
    time.sleep(2.0)  # the point: time for the pulls to pile up answers, if they could
    grown = rss_mib(pid) - before
    try:
        assert grown < PENDING_RSS_BOUND_MIB, f"RSS grew {grown:.0f} MiB"
        decoder, frames = FrameDecoder(), []
        deadline = time.monotonic() + 60
        while len(frames) < PIPELINED_PULLS and time.monotonic() < deadline:
            frames += decoder.feed(sock.recv(4 * MIB))
        assert [f.opaque for f in frames] == list(range(1, PIPELINED_PULLS + 1))
        assert all(f.code == ResponseCode.SUCCESS and len(f.body) >= 4 * MIB for f in frames)
    finally:
        sock.close()
    send_and_pull(cluster.namesrv, "Big")


def test_held_pulls_of_a_client_that_does_not_read_wait_for_it(cluster, raw_conn):
    """Long-polling pulls woken by new data are answered only as fast as their client
    reads: 24 held pulls woken by one 8 MB batch do not pile 24 answers up in memory."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Held", 1)
    host, port = cluster.broker_addr().rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    held = 24
    sock.sendall(
        b"".join(
            encode_frame_bytes(
                RequestCode.PULL_MESSAGE,
                i + 1,
                ext={
                    "topic": "Held",
                    "queue_id": 0,
                    "queue_offset": 0,
                    "max_msgs": 65536,
                    "suspend_timeout_ms": 15000,
                },
            )
            for i in range(held)
        )
    )
    pid = cluster.procs["broker"].pid
    time.sleep(0.5)
    before = rss_mib(pid)
    with hamq.Producer(cluster.namesrv) as producer:
        producer.send_batch([Message("Held", b"h" * 2048)] * 3900)
    time.sleep(1.0)
    grown = rss_mib(pid) - before
    try:
        assert grown < PENDING_RSS_BOUND_MIB, f"RSS grew {grown:.0f} MiB"
        decoder, frames = FrameDecoder(), []
        deadline = time.monotonic() + 60
        while len(frames) < held and time.monotonic() < deadline:
            frames += decoder.feed(sock.recv(4 * MIB))
        assert sorted(f.opaque for f in frames) == list(range(1, held + 1))
        assert all(f.code == ResponseCode.SUCCESS and f.body for f in frames)
    finally:
        sock.close()


HALF_SCRAPES = 300
METRICS_THREADS_BOUND = 40  # 300 half-sent scrapes made 300 threads, for good, before


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Threads:"))


def test_half_sent_scrapes_do_not_pile_up_threads(cluster_factory):
    """The metrics port is a thread-per-request HTTP server: connections that send half a
    request hold a bounded number of threads, a scrape still gets through, and SIGTERM
    still stops the process cleanly (1000 such threads made it hang)."""
    c = cluster_factory()
    c.start_namesrv()
    metrics = f"127.0.0.1:{free_port()}"
    proc = c.start_broker(metrics_listen=metrics)
    host, port = metrics.rsplit(":", 1)
    socks = []
    try:
        for i in range(HALF_SCRAPES):
            source = f"127.0.{1 + i // 250}.{2 + i % 250}"  # past the per-address cap
            sock = socket.create_connection(
                (host, int(port)), timeout=5, source_address=(source, 0)
            )
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
        assert _threads(proc.pid) < METRICS_THREADS_BOUND, _threads(proc.pid)
        wait_for(lambda: _scraped(metrics), 30, "a scrape past the half-sent ones")
    finally:
        for sock in socks:
            sock.close()
    proc.stop()
    assert proc.popen.returncode == 0, proc.popen.returncode


def _scraped(metrics: str) -> bool:
    try:
        return "hamq_internal_errors_total" in scrape_metrics(metrics)
    except OSError:  # every slot taken by a half-sent request: closed unanswered
        return False


# -- 7, 8. what all connections hold together ---------------------------------------------
CROWD = 16  # connections, each from its own loopback address (past the per-address cap)
CROWD_HELD_MIB = 16  # max_held_bytes of the broker under test
HELD_IN_BOUND_MIB = 96  # 16 connections holding 15 MiB of unfinished frame grew 300 MiB before
HELD_OUT_BOUND_MIB = 160  # 16 x 10 unread 4 MiB pulls grew 270 MiB before


def _crowd(address: str) -> list[socket.socket]:
    host, port = address.rsplit(":", 1)
    return [
        socket.create_connection(
            (host, int(port)), timeout=5, source_address=(f"127.0.0.{10 + i}", 0)
        )
        for i in range(CROWD)
    ]


def _push(socks: list[socket.socket], mib: int, seconds: float) -> None:
    """Send ``mib`` MiB on every socket for as long as the server takes them, at most
    ``seconds`` (a server that stops reading a socket blocks only that socket)."""
    left = dict.fromkeys(socks, mib * MIB)
    chunk = bytes(MIB)
    for sock in socks:
        sock.setblocking(False)
    deadline = time.monotonic() + seconds
    while any(left.values()) and time.monotonic() < deadline:
        for sock, n in left.items():
            try:
                left[sock] -= sock.send(chunk[: min(n, MIB)]) if n else 0
            except BlockingIOError:
                pass
        time.sleep(0.01)


@pytest.fixture
def crowded(cluster_factory):
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(max_held_bytes=CROWD_HELD_MIB * MIB, frame_read_timeout_ms=5000)
    return c


def test_unfinished_frames_of_many_connections_are_bounded_together(crowded):
    """Many connections each sending most of a 16 MiB frame and then nothing (within every
    per-connection limit) hold at most about max_held_bytes together: past it their frames
    are not read further. A client with small requests stays fast meanwhile, and once the
    crowd timed out a large batch goes through."""
    c = crowded
    pid = c.procs["broker"].pid
    before = rss_mib(pid)
    socks = _crowd(c.broker_addr())
    try:
        for sock in socks:
            sock.sendall(struct.pack(">II", 16 * MIB - 1, 20))
        _push(socks, 15, 3.0)
        grown = rss_mib(pid) - before
        assert grown < HELD_IN_BOUND_MIB, f"RSS grew {grown:.0f} MiB"
        send_and_pull(c.namesrv, _made_topic(c))
    finally:
        for sock in socks:
            sock.close()
    with hamq.Producer(c.namesrv) as producer:  # 7.8 MiB in one frame
        wait_for(
            lambda: _sent(producer, [Message("Alive", b"b" * 2000)] * 3900),
            30,
            "a large batch after the crowd timed out",
        )


def _sent(producer, messages: list) -> bool:
    try:
        return bool(producer.send_batch(messages))
    except HamqError:  # waited for room past frame_read_timeout_ms while the crowd held it
        return False


def test_unread_answers_of_many_connections_are_bounded_together(crowded):
    """Many connections pipelining large pulls and reading nothing hold at most about
    max_held_bytes of answers together, plus one answer each; reading clients stay fast,
    and a crowd member that reads at last gets every answer."""
    c = crowded
    _fill(c, "Big", 24)
    pid = c.procs["broker"].pid
    before = rss_mib(pid)
    socks = _crowd(c.broker_addr())
    pulls = 10
    try:
        for sock in socks:
            sock.sendall(
                b"".join(
                    encode_frame_bytes(
                        RequestCode.PULL_MESSAGE,
                        i + 1,
                        ext={"topic": "Big", "queue_id": 0, "queue_offset": 0, "max_msgs": 65536},
                    )
                    for i in range(pulls)
                )
            )
        time.sleep(3.0)  # the point: time for the pulls to pile up answers, if they could
        grown = rss_mib(pid) - before
        assert grown < HELD_OUT_BOUND_MIB, f"RSS grew {grown:.0f} MiB"
        send_and_pull(c.namesrv, "Big")
        decoder, frames = FrameDecoder(), []
        deadline = time.monotonic() + 60
        while len(frames) < pulls and time.monotonic() < deadline:
            frames += decoder.feed(socks[0].recv(4 * MIB))
        assert [f.opaque for f in frames] == list(range(1, pulls + 1))
    finally:
        for sock in socks:
            sock.close()


# -- 11. every field checked before anything changes -----------------------------------
@pytest.mark.parametrize(
    "code, ext, field",
    [
        (RequestCode.SEND_MESSAGE, {"born_ts": 2**63}, "born_ts"),
        (RequestCode.SEND_MESSAGE, {"born_ts": -1}, "born_ts"),
        (RequestCode.UPDATE_CONSUMER_OFFSET, {"group": "g", "offset": 2**64 - 1}, "offset"),
        (RequestCode.UPDATE_CONSUMER_OFFSET, {"group": 5, "offset": 1}, "group"),
        (RequestCode.UPDATE_CONSUMER_OFFSET, {"group": "a/b", "offset": 1}, "group"),
        (RequestCode.QUERY_CONSUMER_OFFSET, {"group": ["g"]}, "group"),
        (RequestCode.GET_MAX_OFFSET, {"queue_id": 2**64 - 1}, "queue_id"),
        (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"timestamp_ms": 2**63}, "timestamp_ms"),
        (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Other", "perm": 2**40}, "perm"),
    ],
    ids=[
        "born_ts-2**63",
        "born_ts-negative",
        "offset-2**64",
        "group-int",
        "group-path",
        "group-list",
        "queue_id-huge",
        "timestamp-huge",
        "perm-huge",
    ],
)
def test_out_of_range_fields_are_invalid_argument(cluster_factory, raw_conn, code, ext, field):
    """Out-of-range and ill-typed fields are INVALID_ARGUMENT naming the field (never an
    internal error), nothing is stored, and the internal-error metric stays at zero."""
    c = cluster_factory()
    c.start_namesrv()
    metrics = f"127.0.0.1:{free_port()}"
    c.start_broker(metrics_listen=metrics)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("Typed", 1)
    body = b""
    if code == RequestCode.SEND_MESSAGE:
        ext, body = send_ext("Typed", **ext)
    else:
        ext = {"topic": "Typed", "queue_id": 0, **ext}
    conn = raw_conn(c.broker_addr())
    answer = ask(conn, code, 21, ext, body)
    assert answer.code == ResponseCode.INVALID_ARGUMENT, answer
    assert field in answer.remark, answer.remark
    assert ask(conn, RequestCode.GET_MAX_OFFSET, 22, {"topic": "Typed", "queue_id": 0}).ext == {
        "offset": 0
    }
    assert ask(conn, RequestCode.GET_ALL_CONSUMER_OFFSET, 23, {}).body in (b"", pack_body({}))
    assert scrape_metrics(metrics)["hamq_internal_errors_total"] == 0


def test_name_server_fields_are_checked(cluster, raw_conn):
    conn = raw_conn(cluster.namesrv_addrs[0])
    for code, ext, field in [
        (
            RequestCode.GET_BROKER_MEMBER_GROUP,
            {"cluster_name": "C", "broker_name": 5},
            "broker_name",
        ),
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": ["x"]}, "topic"),
        (RequestCode.BROKER_HEARTBEAT, {"broker_addr": {"a": 1}}, "broker_addr"),
        (
            RequestCode.UNREGISTER_BROKER,
            {"broker_name": "broker-a", "broker_id": "0", "broker_addr": cluster.broker_addr()},
            "broker_id",
        ),
        (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": ".."}, "topic"),
    ]:
        answer = ask(conn, code, 31, ext)
        assert answer.code in (ResponseCode.INVALID_ARGUMENT, ResponseCode.MESSAGE_ILLEGAL), (
            code,
            answer,
        )
        assert field in answer.remark, (code, answer.remark)
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("StillRouted", 1)
    send_and_pull(cluster.namesrv, "StillRouted")
