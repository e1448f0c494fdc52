"""A bounded protocol fuzzer against real processes (issue 12, "Done when"): every request
code the broker, the name server and the HA port serve — and codes they do not — is driven
with well-framed hostile values: wrong types, out-of-range and boundary integers, unsafe
names, system topics, malformed bodies and message properties. After each campaign the
server is alive, answered every request with a precise code (never an internal error, and
the internal-error metric is zero; unknown codes REQUEST_CODE_NOT_SUPPORTED), stored
nothing it should have refused, kept its memory within a stated bound (FUZZ_RSS_BOUND_MIB),
still serves a produce/consume round trip, and restarts."""

from __future__ import annotations

import re
from pathlib import Path

import msgpack
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import hamq
from hamq.config import dump_toml
from hamq.errors import TopicNotExist
from hamq.protocol.codes import Flag, RequestCode, ResponseCode
from hamq.protocol.frame import encode_frame_bytes, pack_body, unpack_body
from hamq.protocol.message import encode_batch, encode_message
from harness import Proc
from helpers import free_port, scrape_metrics, send_and_pull, wait_for

EXAMPLES_PER_CAMPAIGN = 1000
FUZZ_RSS_BOUND_MIB = 64
# Held pulls and pops end after this, so a campaign on one connection never waits long.
FUZZ_MAX_WAIT_MS = 50

INTS = st.one_of(
    st.sampled_from(
        [0, 1, 2, -1, 1023, 1024, 1025, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]
    ),
    st.integers(-10, 10),
)
NAMES = st.one_of(
    st.sampled_from(
        [
            "Fuzz",
            "..",
            ".",
            "a\0b",
            "a/b",
            "",
            " ",
            "é",
            "x" * 300,
            "broker-a",
            "TestCluster",
            "g",
            "SCHEDULE_TOPIC_XXXX",
            "RMQ_SYS_TRANS_OP_HALF_TOPIC",
            "rmq_sys_REVIVE_LOG",
            "TBW102",
            "%RETRY%g",
            "127.0.0.1:1",
            "no-port",
            "h:99999",
            "h:-1",
        ]
    ),
    st.text(max_size=12),
)
VALUES = st.one_of(
    INTS,
    NAMES,
    st.none(),
    st.booleans(),
    st.binary(max_size=8),
    st.floats(allow_nan=True),
    st.lists(INTS, max_size=3),
    st.dictionaries(NAMES, INTS, max_size=3),
)

BROKER_FIELDS = {
    RequestCode.SEND_MESSAGE: ("topic", "queue_id", "count", "crc", "born_ts"),
    RequestCode.SEND_BATCH_MESSAGE: ("topic", "queue_id", "count", "crc", "born_ts"),
    RequestCode.QUERY_CONSUMER_OFFSET: ("topic", "queue_id", "group"),
    RequestCode.UPDATE_CONSUMER_OFFSET: ("topic", "queue_id", "group", "offset"),
    RequestCode.GET_MAX_OFFSET: ("topic", "queue_id"),
    RequestCode.GET_MIN_OFFSET: ("topic", "queue_id"),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: ("topic", "queue_id", "timestamp_ms"),
    RequestCode.GET_EARLIEST_MSG_STORETIME: ("topic", "queue_id"),
    RequestCode.UPDATE_AND_CREATE_TOPIC: ("topic", "read_queue_nums", "write_queue_nums", "perm"),
    RequestCode.DELETE_TOPIC_IN_BROKER: ("topic",),
    RequestCode.GET_ALL_TOPIC_CONFIG: (),
    RequestCode.GET_ALL_CONSUMER_OFFSET: (),
    RequestCode.GET_BROKER_RUNTIME_INFO: (),
    RequestCode.PULL_MESSAGE: (
        "topic",
        "queue_id",
        "queue_offset",
        "max_msgs",
        "max_bytes",
        "suspend_timeout_ms",
        "group",
        "commit_offset",
    ),
    RequestCode.HEART_BEAT: (),
    RequestCode.UNREGISTER_CLIENT: ("client_id", "group"),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: ("group",),
    RequestCode.LOCK_BATCH_MQ: ("group", "client_id"),
    RequestCode.UNLOCK_BATCH_MQ: ("group", "client_id"),
    RequestCode.CONSUMER_SEND_MSG_BACK: (
        "group",
        "topic",
        "queue_id",
        "queue_offset",
        "delay_level",
        "max_reconsume_times",
    ),
    RequestCode.END_TRANSACTION: ("group", "tran_state_table_offset", "commit_or_rollback"),
    RequestCode.GET_ALL_DELAY_OFFSET: (),
    RequestCode.POP_MESSAGE: (
        "group",
        "topic",
        "queue_id",
        "invisible_time_ms",
        "max_msgs",
        "init_mode",
        "poll_time_ms",
        "max_reconsume_times",
    ),
    RequestCode.ACK_MESSAGE: ("group", "topic", "queue_id", "offset", "ck"),
    RequestCode.BATCH_ACK_MESSAGE: ("group",),
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: (
        "group",
        "topic",
        "queue_id",
        "offset",
        "ck",
        "invisible_time_ms",
    ),
    # seed 004: a returning master's announcement (refused on a master), pre-online reads,
    # an acting master's escaped pop record
    RequestCode.EXCHANGE_BROKER_HA_INFO: (
        "cluster_name",
        "broker_name",
        "master_addr",
        "master_ha_addr",
        "hold_ms",
    ),
    RequestCode.GET_POP_CHECKPOINT: (),
    RequestCode.POP_ESCAPED_REVIVE: (),
    RequestCode.GET_TRANSACTION_DECISIONS: (),
}
# A broker container's own port (seed 004): the fuzzed container hosts one member,
# "member-x", whose name no drawn REMOVE_BROKER names, and ADD_BROKER never names a free
# port, so neither may succeed.
CONTAINER_FIELDS = {
    RequestCode.ADD_BROKER: ("config_path",),
    RequestCode.REMOVE_BROKER: ("broker_name", "broker_id"),
}
# Codes a port does not serve (other ports' codes, the ones only a server sends, and
# numbers nobody uses): REQUEST_CODE_NOT_SUPPORTED, with any fields.
NOT_SERVED = (
    RequestCode.HA_HANDSHAKE,
    RequestCode.DLEDGER_MESSAGE,
    RequestCode.CHECK_TRANSACTION_STATE,
    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
    RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE,
    RequestCode.ADD_BROKER,
    RequestCode.REMOVE_BROKER,
    0,
    9999,
    2**31 - 1,
)
HA_FIELDS = {
    RequestCode.HA_HANDSHAKE: ("broker_id", "attach", "proof", "probes"),
    RequestCode.HA_ACK: ("ack_offset",),
}
NAMESRV_FIELDS = {
    RequestCode.REGISTER_BROKER: (
        "cluster_name",
        "broker_name",
        "broker_id",
        "broker_addr",
        "ha_addr",
        "heartbeat_timeout_ms",
    ),
    RequestCode.BROKER_HEARTBEAT: ("broker_addr",),
    RequestCode.UNREGISTER_BROKER: ("broker_name", "broker_id", "broker_addr"),
    RequestCode.GET_ROUTEINFO_BY_TOPIC: ("topic",),
    RequestCode.GET_BROKER_MEMBER_GROUP: ("cluster_name", "broker_name"),
    RequestCode.GET_BROKER_CLUSTER_INFO: (),
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: (),
    RequestCode.DELETE_TOPIC_IN_NAMESRV: ("topic",),
}
INTERNAL_TOPICS = {"TBW102", "rmq_sys_REVIVE_LOG"}
# What may be stored, spelled out here rather than imported, so the check is independent of
# the code under test.
SAFE_NAME = re.compile(r"[A-Za-z0-9%|_.-]{1,255}")
ADDRESS = re.compile(r"[^\s:]+:[0-9]{1,5}")


def safe_name(name: object) -> bool:
    return isinstance(name, str) and bool(SAFE_NAME.fullmatch(name)) and name not in (".", "..")


def system_topic(topic: str) -> bool:
    return topic in ("TBW102", "SCHEDULE_TOPIC_XXXX") or topic.lower().startswith("rmq_sys_")


# Plausible values per field: a request is mostly valid, so the hostile field is the one
# that decides (a fuzzer of only garbage stops at the first type check).
PORTS = st.integers(1, 65535).map(lambda port: f"127.0.0.1:{port}")
VALID = {
    "topic": st.sampled_from(["Fuzz", "Fuzz2", "fz"]),
    "queue_id": st.integers(0, 1),
    "count": st.just(1),
    "crc": st.integers(0, 2**32 - 1),
    "born_ts": st.integers(0, 2**41),
    "group": st.sampled_from(["g", "g2"]),
    "offset": st.integers(0, 100),
    "timestamp_ms": st.integers(0, 2**41),
    "read_queue_nums": st.integers(1, 4),
    "write_queue_nums": st.integers(1, 4),
    "perm": st.sampled_from([2, 4, 6]),
    "cluster_name": st.just("TestCluster"),
    "broker_name": st.sampled_from(["broker-a", "bz"]),
    "broker_id": st.integers(0, 5),
    "broker_addr": PORTS,
    "ha_addr": PORTS,
    "heartbeat_timeout_ms": st.integers(1000, 60_000),
    "queue_offset": st.integers(0, 10),
    "max_msgs": st.integers(1, 64),
    "max_bytes": st.integers(1, 2**20),
    "suspend_timeout_ms": st.integers(0, 100),
    "commit_offset": st.integers(0, 10),
    "client_id": st.sampled_from(["c1", "c2"]),
    "delay_level": st.integers(0, 3),
    "max_reconsume_times": st.integers(0, 16),
    "tran_state_table_offset": st.integers(0, 5),
    "commit_or_rollback": st.sampled_from(["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"]),
    "invisible_time_ms": st.integers(100, 60_000),
    "init_mode": st.sampled_from(["min", "max"]),
    "poll_time_ms": st.integers(0, 100),
    "ck": st.integers(0, 10),
    "attach": st.integers(0, 2**20),
    "proof": st.none(),
    "probes": st.just([]),
    "ack_offset": st.integers(0, 2**20),
    "master_addr": PORTS,
    "master_ha_addr": PORTS,
    "hold_ms": st.integers(1, 60_000),
    "config_path": st.sampled_from(["member.toml", "../../etc/passwd"]),
}
# Message properties: plain, held back (delay, timer, transaction half) and their hostile
# variants. Each raw map is (bytes, whether a send carrying it may be stored).
PROPERTIES = [
    (b"", True),
    (msgpack.packb({"KEYS": "k", "TAGS": "t"}), True),
    (msgpack.packb({"DELAY": "2"}), True),
    (msgpack.packb({"DELAY": 2}), False),
    (msgpack.packb({"DELAY": "\u00b2"}), False),
    (msgpack.packb({"DELAY": "99"}), False),
    (msgpack.packb({"TIMER_DELIVER_MS": ["1"]}), False),
    (msgpack.packb({"TRAN_MSG": "true", "PGROUP": "pg"}), True),
    (msgpack.packb({"TRAN_MSG": "true", "PGROUP": 7}), False),
    (msgpack.packb({"TRAN_MSG": "true", "PGROUP": "pg", "TRAN_BATCH": [1]}), False),
    (msgpack.packb({"TRAN_MSG": "true", "PGROUP": "pg", "REAL_TOPIC": ".."}), False),
    (msgpack.packb(["not", "a", "map"]), False),
    (msgpack.packb("text"), False),
]
TOPIC_CONFIG_FIELDS = ("read_queue_nums", "write_queue_nums", "perm")


def field(draw, name: str):
    return draw(VALUES) if draw(st.integers(0, 5)) == 0 else draw(VALID[name])


@st.composite
def requests(draw, fields: dict[int, tuple[str, ...]], taken: str = ""):
    """(code, ext, body): every known field, now and then hostile, now and then missing,
    now and then a field nobody asked for. ``taken``: an address in use (a container
    campaign's ADD_BROKER listens there, so no member it asks for can start)."""
    code = draw(st.sampled_from(sorted(fields) + list(NOT_SERVED)))
    ext = {name: field(draw, name) for name in fields.get(code, ()) if draw(st.integers(0, 15))}
    ext.update(draw(st.dictionaries(st.just("x"), VALUES, max_size=1)))
    body = b""
    if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE):
        props = draw(st.sampled_from(PROPERTIES))[0]
        body, crc = encode_batch([encode_message(draw(st.binary(max_size=64)), props)])
        if draw(st.integers(0, 3)):
            ext["crc"] = crc  # a real batch: the other fields decide
        body = draw(st.sampled_from([body, body, body + b"\0", body[:3], b""]))
    elif code == RequestCode.REGISTER_BROKER:
        configs = {
            draw(NAMES) if draw(st.integers(0, 3)) == 0 else draw(VALID["topic"]): {
                key: field(draw, key) for key in TOPIC_CONFIG_FIELDS
            }
            for _ in range(draw(st.integers(0, 2)))
        }
        version = draw(
            st.one_of(
                VALUES, st.dictionaries(st.sampled_from(["counter", "state_version", "x"]), INTS)
            )
        )
        body = draw(
            st.sampled_from(
                [
                    pack_body({"topic_configs": configs, "data_version": version}),
                    pack_body([configs]),
                    b"\xc1",
                ]
            )
        )
    elif code == RequestCode.HEART_BEAT:
        entry = {
            "group": field(draw, "group"),
            "message_model": draw(
                st.one_of(st.sampled_from(["clustering", "broadcasting"]), VALUES)
            ),
            "subscriptions": draw(st.one_of(st.just({"Fuzz": "*"}), VALUES)),
        }
        body = pack_body(
            draw(
                st.one_of(
                    VALUES,
                    st.fixed_dictionaries(
                        {
                            "client_id": st.one_of(VALID["client_id"], VALUES),
                            "producer_groups": st.lists(
                                st.one_of(VALID["group"], VALUES), max_size=2
                            ),
                            "consumer_groups": st.lists(
                                st.one_of(st.just(entry), VALUES), max_size=2
                            ),
                        }
                    ),
                )
            )
        )
    elif code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        queue = st.lists(st.one_of(VALID["topic"], NAMES, VALUES), min_size=2, max_size=2)
        body = pack_body(
            draw(
                st.one_of(
                    VALUES,
                    st.lists(
                        st.tuples(
                            st.one_of(VALID["topic"], NAMES), st.one_of(VALID["queue_id"], INTS)
                        ).map(list)
                        | queue,
                        max_size=4,
                    ),
                )
            )
        )
    elif code == RequestCode.POP_ESCAPED_REVIVE:
        body = pack_body(draw(st.one_of(VALUES, escaped_records())))
    elif code == RequestCode.ADD_BROKER:
        body = draw(st.one_of(st.just(b"\xc1"), VALUES.map(pack_body), member_settings(taken)))
    elif code == RequestCode.BATCH_ACK_MESSAGE:
        body = pack_body(draw(st.one_of(VALUES, st.lists(st.lists(INTS, max_size=4), max_size=3))))
    return code, ext, body


# An acting master's pop record (broker/pop/revive_log.py): kind, broker name, group,
# topic, deadline and entries, CK entries (queue id, offsets, times), ACK entries (topic,
# queue id, offset, receipt).
CK_ENTRY = st.tuples(st.integers(0, 3), st.lists(st.integers(0, 9), min_size=1, max_size=2))
ACK_ENTRY = st.tuples(VALID["topic"], st.integers(0, 3), st.integers(0, 9), st.integers(0, 9))


@st.composite
def escaped_records(draw):
    kind = draw(st.sampled_from(["ck", "ack"]))
    if kind == "ck":
        good = st.lists(CK_ENTRY.map(lambda e: [e[0], e[1], [0] * len(e[1])]), max_size=2)
    else:
        good = st.lists(ACK_ENTRY.map(list), max_size=2)
    record = {
        "k": kind,
        "b": draw(st.sampled_from(["broker-x", "broker-a"])),  # broker-a: the master's own
        "g": field(draw, "group"),
        "t": field(draw, "topic"),
        "d": draw(st.integers(0, 2**41)),
        "e": draw(st.one_of(good, good, st.lists(VALUES, max_size=2), VALUES)),
    }
    for key in draw(st.lists(st.sampled_from(list(record)), max_size=1)):
        record[key] = draw(VALUES)
    return record


@st.composite
def member_settings(draw, taken: str):
    """A member's settings as ``hamq admin container add-broker`` sends them, one of them
    hostile (or a key no config has); ``listen`` is always ``taken``, never drawn (a free
    port would start a member writing where store_dir says)."""
    settings = {
        "broker_name": draw(st.sampled_from(["broker-y", "member-x"])),
        "broker_id": draw(st.integers(0, 2)),
        "listen": taken,
        "store_dir": draw(st.sampled_from(["/", "/etc", "/dev/null", "..", "relative-store"])),
    }
    key = draw(st.sampled_from(["broker_name", "broker_id", "store_dir", "no_such_key", 7, ""]))
    settings[key] = draw(VALUES)
    return pack_body(settings)


def is_int(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def is_address(value: object) -> bool:
    return (
        isinstance(value, str)
        and bool(ADDRESS.fullmatch(value))
        and 0 < int(value.rpartition(":")[2]) < 65536
    )


def acceptable(code: int, ext: dict, body: bytes) -> bool:
    """Whether a request may succeed at all (the spec, independent of the code under test):
    a SUCCESS answer to anything else stored something that should have been refused."""
    topic = ext.get("topic")
    if code in (
        RequestCode.SEND_MESSAGE,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.DELETE_TOPIC_IN_BROKER,
    ):
        if not (safe_name(topic) and len(topic) <= 127 and not system_topic(topic)):
            return False
    if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE):
        return send_acceptable(body) and (
            "born_ts" not in ext or ext["born_ts"] is None or is_int(ext["born_ts"], 0, 2**63 - 1)
        )
    if code == RequestCode.UPDATE_AND_CREATE_TOPIC:
        return all(
            ext.get(k) is None or is_int(ext[k], 1, 1024)
            for k in ("read_queue_nums", "write_queue_nums")
        ) and (ext.get("perm") is None or ext["perm"] in (0, 2, 4, 6))
    if code == RequestCode.UPDATE_CONSUMER_OFFSET:
        return safe_name(ext.get("group")) and is_int(ext.get("offset"), 0, 2**63 - 1)
    if code == RequestCode.REGISTER_BROKER:
        return registration_acceptable(ext, body)
    if code == RequestCode.PULL_MESSAGE and ext.get("commit_offset") is not None:
        return safe_name(ext.get("group")) and is_int(ext["commit_offset"], 0, 2**63 - 1)
    if code == RequestCode.END_TRANSACTION:
        return safe_name(ext.get("group")) and is_int(
            ext.get("tran_state_table_offset"), 0, 2**63 - 1
        )
    if code == RequestCode.HEART_BEAT:
        return heartbeat_acceptable(body)
    if code == RequestCode.LOCK_BATCH_MQ:
        return safe_name(ext.get("group")) and isinstance(ext.get("client_id"), str)
    if code == RequestCode.POP_ESCAPED_REVIVE:
        return False  # no member of the record's group confirms putting it (pop/escaped.py)
    if code == RequestCode.EXCHANGE_BROKER_HA_INFO:
        return False  # the fuzzed broker is a master: it follows no announced master
    return code not in CONTAINER_FIELDS


def send_acceptable(body: bytes) -> bool:
    """A send whose one message carries properties listed as refused must not be stored."""
    return not any(props and not ok and props in body for props, ok in PROPERTIES)


def heartbeat_acceptable(body: bytes) -> bool:
    content = unpack_body(body)
    if not isinstance(content, dict) or not isinstance(content.get("client_id"), str):
        return False
    groups = content.get("consumer_groups") or []
    producers = content.get("producer_groups") or []
    return (
        isinstance(groups, list)
        and isinstance(producers, list)
        and all(safe_name(g) for g in producers)
        and all(
            isinstance(e, dict)
            and safe_name(e.get("group"))
            and e.get("message_model", "clustering") in ("clustering", "broadcasting")
            and isinstance(e.get("subscriptions") or {}, dict)
            for e in groups
        )
    )


def registration_acceptable(ext: dict, body: bytes) -> bool:
    if not (
        safe_name(ext.get("cluster_name"))
        and safe_name(ext.get("broker_name"))
        and is_int(ext.get("broker_id"), 0, 1023)
        and is_address(ext.get("broker_addr"))
        and (not ext.get("ha_addr") or is_address(ext["ha_addr"]))
        and (
            ext.get("heartbeat_timeout_ms") is None
            or is_int(ext["heartbeat_timeout_ms"], 1, 600_000)
        )
    ):
        return False
    try:
        content = unpack_body(body) or {}
    except Exception:  # noqa: BLE001 (any undecodable body is simply not a match)
        return False
    if not isinstance(content, dict):
        return False
    configs, version = content.get("topic_configs") or {}, content.get("data_version") or {}
    return (
        isinstance(configs, dict)
        and isinstance(version, dict)
        and all(
            safe_name(t)
            and isinstance(c, dict)
            and set(c) == set(TOPIC_CONFIG_FIELDS)
            and is_int(c["read_queue_nums"], 1, 1024)
            and is_int(c["write_queue_nums"], 1, 1024)
            and c["perm"] in (0, 2, 4, 6)
            and not isinstance(c["perm"], bool)
            for t, c in configs.items()
        )
        and all(
            k in ("counter", "state_version", "timestamp_ms") and is_int(v, 0, 2**63 - 1)
            for k, v in version.items()
        )
    )


def run_campaign(conn, fields: dict[int, tuple[str, ...]], taken: str = "") -> None:
    opaque = iter(range(1, 10**9))

    # One connection carries the whole campaign, so examples are not independent: no
    # shrinking, the first failure is reported as it happened.
    @settings(
        max_examples=EXAMPLES_PER_CAMPAIGN,
        deadline=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(requests(fields, taken))
    def campaign(request):
        code, ext, body = request
        op = next(opaque)
        if code == RequestCode.HA_ACK and code in fields:  # one-way, as a slave sends it
            conn.send(encode_frame_bytes(code, op, Flag.ONEWAY, ext))
            return
        conn.send(encode_frame_bytes(code, op, ext=ext, body=body))
        answer = conn.read_frame()
        while answer is not None and not answer.flags & Flag.RESPONSE:
            answer = conn.read_frame()  # notifications to the client we posed as, log bytes
        assert answer is not None, f"connection closed on {code} {ext!r}"
        assert answer.opaque == op
        if code not in fields:
            assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, (code, answer)
        assert not (answer.code == ResponseCode.SYSTEM_ERROR and "internal" in answer.remark), (
            code,
            ext,
            answer.remark,
        )
        assert answer.code != ResponseCode.SUCCESS or acceptable(code, ext, body), (
            f"accepted what should have been refused: {code!r} {ext!r} {body!r}"
        )

    campaign()


def ask(conn, code: int, ext: dict):
    conn.send(encode_frame_bytes(code, 1, ext=ext))
    return unpack_body(conn.read_frame().body)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def test_broker_request_fuzz(cluster_factory, raw_conn):
    c = cluster_factory()
    c.start_namesrv()
    metrics = f"127.0.0.1:{free_port()}"
    c.start_broker(
        auto_create_topic_enable=True,
        metrics_listen=metrics,
        long_polling_max_wait_ms=FUZZ_MAX_WAIT_MS,
    )
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("Fuzz", 2)
    before = rss_mib(c.procs["broker"].pid)
    run_campaign(raw_conn(c.broker_addr()), BROKER_FIELDS)
    assert c.procs["broker"].alive()
    assert rss_mib(c.procs["broker"].pid) - before < FUZZ_RSS_BOUND_MIB
    assert scrape_metrics(metrics)["hamq_internal_errors_total"] == 0
    check = raw_conn(c.broker_addr())
    for topic in ask(check, RequestCode.GET_ALL_TOPIC_CONFIG, {}):  # nothing unsafe stored
        assert safe_name(topic) and len(topic) <= 127, topic
        assert (
            topic in INTERNAL_TOPICS
            or not system_topic(topic)
            or topic.startswith("RMQ_SYS_TRANS_")
        ), topic  # created by a stored half message
    for key, queues in (ask(check, RequestCode.GET_ALL_CONSUMER_OFFSET, {}) or {}).items():
        assert all(safe_name(part) for part in key.split("@")), key  # topic@group
        assert all(is_int(offset, 0, 2**63 - 1) for offset in queues.values()), queues
    c.restart("broker")
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("AfterFuzz", 1)
    send_and_pull(c.namesrv, "AfterFuzz")


def test_name_server_request_fuzz(cluster, raw_conn):
    namesrv = cluster.procs["namesrv"]
    before = rss_mib(namesrv.pid)
    run_campaign(raw_conn(cluster.namesrv_addrs[0]), NAMESRV_FIELDS)
    assert namesrv.alive()
    assert rss_mib(namesrv.pid) - before < FUZZ_RSS_BOUND_MIB
    check = raw_conn(cluster.namesrv_addrs[0])
    groups = ask(check, RequestCode.GET_BROKER_CLUSTER_INFO, {})["broker_addr_table"]
    for name, group in groups.items():
        assert safe_name(name), name  # nothing unsafe was stored
        assert all(isinstance(i, int) and 0 <= i <= 1023 for i in group["broker_addrs"])
        assert all(
            isinstance(a, str) and ADDRESS.fullmatch(a) for a in group["broker_addrs"].values()
        ), group
        members = ask(
            check,
            RequestCode.GET_BROKER_MEMBER_GROUP,
            {"cluster_name": "TestCluster", "broker_name": name},
        )
        assert all(
            isinstance(a, str) and ADDRESS.fullmatch(a) for a in members["ha_addrs"].values()
        ), members
    with hamq.Admin(cluster.namesrv) as admin:
        for topic in admin.topic_list():
            assert safe_name(topic), topic
            for queues in ask(check, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})[
                "queue_datas"
            ]:
                assert 1 <= queues["read_queue_nums"] <= 1024, queues
                assert 1 <= queues["write_queue_nums"] <= 1024, queues
                assert queues["perm"] in (0, 2, 4, 6), queues
    # the campaign may have registered valid strangers (there is no authentication yet):
    # the topic is created on the real broker only, not on every master of the cluster
    round_trip(cluster, raw_conn, "AfterFuzz")
    cluster.restart("namesrv")
    round_trip(cluster, raw_conn, "AfterRestart")


def round_trip(cluster, raw_conn, topic: str) -> None:
    ask(raw_conn(cluster.broker_addr()), RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": topic})
    with hamq.Admin(cluster.namesrv) as admin:
        wait_for(lambda: routed(admin, topic), 10, f"route of {topic}")
    send_and_pull(cluster.namesrv, topic)


def routed(admin, topic: str) -> bool:
    try:
        return bool(admin.topic_route(topic).write_queues)
    except TopicNotExist:
        return False


def test_ha_port_request_fuzz(cluster, raw_conn):
    """The master's HA port: handshakes and acks with hostile values (a forged slave among
    them attaches, acks past what it was sent, and reads the log bytes it is shipped), and
    every other code."""
    broker = cluster.procs["broker"]
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Fuzz", 1)
    send_and_pull(cluster.namesrv, "Fuzz")
    before = rss_mib(broker.pid)
    run_campaign(raw_conn(ha_listen(cluster)), HA_FIELDS)
    assert broker.alive()
    assert rss_mib(broker.pid) - before < FUZZ_RSS_BOUND_MIB
    with hamq.Admin(cluster.namesrv) as admin:
        slaves = admin.broker_runtime_info(cluster.broker_addr())["ha"]["slaves"]
    # no forged session counts an ack past the master's log
    assert all(s["behind_bytes"] >= 0 for s in slaves), slaves
    round_trip(cluster, raw_conn, "AfterHaFuzz")
    cluster.restart("broker")
    round_trip(cluster, raw_conn, "AfterHaRestart")


def ha_listen(cluster) -> str:
    text = (cluster.root / "broker.toml").read_text()
    return next(line.split('"')[1] for line in text.splitlines() if line.startswith("ha_listen"))


def test_container_port_request_fuzz(cluster_factory, raw_conn):
    """A broker container's port (ADD_BROKER, REMOVE_BROKER; seed 004): hostile member
    settings and names, undecodable bodies, every other code. No member is added or
    removed, nothing is created where a drawn store_dir points, the hosted member serves on."""
    c = cluster_factory()
    c.start_namesrv()
    member = c.write_broker_config("member", broker_name="member-x")
    listen, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    cfg = c.root / "container.toml"
    cfg.write_text(
        dump_toml(
            {
                "listen": listen,
                "namesrv": c.namesrv_addrs,
                "brokers": [str(member)],
                "metrics_listen": metrics,
            }
        )
    )
    container = Proc("container", ["container", "-c", str(cfg)], c.root / "container.log")
    c.procs["container"] = container.start()
    before = rss_mib(container.pid)
    run_campaign(raw_conn(listen), CONTAINER_FIELDS, taken=c.broker_addr("member"))
    assert container.alive()
    assert rss_mib(container.pid) - before < FUZZ_RSS_BOUND_MIB
    assert scrape_metrics(metrics)["hamq_internal_errors_total"] == 0
    assert not Path("relative-store").exists()
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: "member-x" in admin.master_addrs(), 10, "member-x registered")
        assert set(admin.master_addrs()) == {"member-x"}  # none added, none removed
        admin.create_topic("AfterContainerFuzz", 1)
        wait_for(lambda: routed(admin, "AfterContainerFuzz"), 10, "route of AfterContainerFuzz")
    send_and_pull(c.namesrv, "AfterContainerFuzz")


def test_slave_request_fuzz(cluster_factory, raw_conn):
    """Every broker code against a slave that may act as master (seed 004): hostile
    EXCHANGE_BROKER_HA_INFO announcements among them. Its master alive, none is taken: the
    slave still follows its master (caught up after more sends) and does not act."""
    c = cluster_factory()
    c.start_namesrv(support_acting_master=True)
    acting = {"enable_slave_acting_master": True, "long_polling_max_wait_ms": FUZZ_MAX_WAIT_MS}
    c.start_broker("master", broker_role="sync_master", total_replicas=2, **acting)
    metrics = f"127.0.0.1:{free_port()}"
    c.start_broker("slave", broker_id=1, broker_role="slave", metrics_listen=metrics, **acting)
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: "broker-a" in admin.master_addrs(), 30, "the master registered")
        admin.create_topic("Fuzz", 2)
    run_campaign(raw_conn(c.broker_addr("slave")), BROKER_FIELDS)
    assert c.procs["slave"].alive()
    assert scrape_metrics(metrics)["hamq_internal_errors_total"] == 0
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: routed(admin, "Fuzz"), 10, "route of Fuzz")
        send_and_pull(c.namesrv, "Fuzz")

        def caught_up() -> bool:
            ends = [
                admin.broker_runtime_info(c.broker_addr(n))["commitlog_max_offset"]
                for n in ("master", "slave")
            ]
            return ends[0] == ends[1]

        wait_for(caught_up, 10, "the slave following its master")
        info = admin.broker_runtime_info(c.broker_addr("slave"))
        assert not info["acting_master"]["acting"]
        assert admin.master_addrs()["broker-a"] == c.broker_addr("master")
