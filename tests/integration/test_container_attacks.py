"""A broker container's port and members under hostile input and operator mistakes, on real
processes (seed 004's BrokerContainer; issue 15 break-it review): ADD_BROKER is not
authenticated, so what a stranger may make the container write is bounded by its
``store_root``; stores that overlap are refused however they are spelled; a member whose
store cannot be opened lets go of it."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import hamq
from hamq import Message
from hamq.client.consumer import PullStatus
from hamq.client.message import MessageQueue, SendStatus
from hamq.config import BrokerConfig, load_config
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import encode_frame_bytes, pack_body
from harness import Cluster, Proc
from helpers import pid_alive, wait_for

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_container import (  # noqa: F401 (dev_containers: a fixture)
    WAIT_S,
    acting_groups,
    create_topic,
    dev_containers,
    produce_and_consume,
    start_container,
    write_container,
)
from test_escape import master_of


def add_broker(hamq_cli, container: str, config: Path):
    return hamq_cli("admin", "container", "add-broker", "--container", container, "-c", str(config))


def ask(raw_conn, address: str, code: int, ext: dict | None = None, body: bytes = b""):
    conn = raw_conn(address)
    conn.send(encode_frame_bytes(code, 1, ext=ext or {}, body=body))
    return conn.read_frame()


@pytest.fixture
def namesrv_cluster(cluster_factory) -> Cluster:
    c = cluster_factory()
    c.start_namesrv()
    return c


def test_a_container_without_store_root_takes_no_member_at_runtime(namesrv_cluster, hamq_cli):
    """ADD_BROKER has no authentication: by default nobody may add a member over the wire
    (its store_dir could be anywhere the process may write)."""
    c = namesrv_cluster
    proc, container = start_container(c, "container", [c.write_broker_config("a")])
    outside = c.root / "outside"
    b = c.write_broker_config("b", broker_name="broker-b", store_dir=str(outside))
    refused = add_broker(hamq_cli, container, b)
    assert refused.returncode == 1
    assert "this container takes no members at runtime: set store_root" in refused.stderr
    assert not outside.exists()
    assert proc.alive()


def test_a_runtime_member_writes_only_inside_store_root(namesrv_cluster, hamq_cli, tmp_path):
    c = namesrv_cluster
    stores = c.root / "stores"
    a = c.write_broker_config("a", store_dir=str(stores / "a"))
    proc, container = start_container(c, "container", [a], store_root=str(stores))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "lock").write_text("not hamq's")  # a file a stranger would have truncated
    (stores / "link").symlink_to(elsewhere)

    def refused(name: str, store_dir: str, expected: str) -> None:
        cfg = c.write_broker_config(name, broker_name="broker-b", store_dir=store_dir)
        result = add_broker(hamq_cli, container, cfg)
        assert result.returncode == 1, result.stdout
        assert expected in result.stderr, result.stderr

    refused("out", str(elsewhere), "is not inside the container's store_root")
    refused("via_link", str(stores / "link"), "is not inside the container's store_root")
    refused("up", str(stores / ".." / "up"), "is not inside the container's store_root")
    refused("root", str(stores), "is not inside the container's store_root")
    # inside the root, but among member a's files, or a's store spelled another way
    refused("nested", str(stores / "a" / "commitlog"), "overlaps the store of member broker-a")
    refused("same", str(stores / "a" / "."), "is already the store of member broker-a")
    assert (elsewhere / "lock").read_text() == "not hamq's"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["lock"]
    assert not (c.root / "up").exists()
    assert not (stores / "a" / "commitlog" / "lock").exists()

    fine = c.write_broker_config("fine", broker_name="broker-b", store_dir=str(stores / "b"))
    added = add_broker(hamq_cli, container, fine)
    assert added.returncode == 0, added.stderr
    create_topic(c.namesrv, "Confined", 2, {"broker-a", "broker-b"})
    assert produce_and_consume(c.namesrv, "Confined") == {"broker-a", "broker-b"}
    assert proc.alive()


def test_configured_members_with_overlapping_stores_are_refused(namesrv_cluster, hamq_cli):
    c = namesrv_cluster
    a = c.write_broker_config("a")
    inner = c.write_broker_config(
        "inner", broker_name="broker-b", store_dir=str(c.root / "a" / "consumequeue")
    )
    cfg = write_container(c, "container", [a, inner])
    result = hamq_cli("container", "-c", str(cfg), timeout=60)
    assert result.returncode == 2, result.stderr
    assert "overlaps the store of member broker-a id 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_member_whose_store_cannot_be_opened_lets_go_of_it(namesrv_cluster, hamq_cli):
    """Recovery fails on a broken store (a directory where its topic table belongs): the
    member is refused, and once the operator repaired the store it can be added (before,
    the failed member kept the store's lock for the container's life)."""
    c = namesrv_cluster
    a = c.write_broker_config("a")
    proc, container = start_container(c, "container", [a], store_root=str(c.root))
    broken = c.root / "b" / "topics.json"
    broken.mkdir(parents=True)
    b = c.write_broker_config("b", broker_name="broker-b")
    refused = add_broker(hamq_cli, container, b)
    assert refused.returncode == 1
    assert f"cannot open its store {c.root / 'b'}" in refused.stderr, refused.stderr
    assert "Is a directory" in refused.stderr
    broken.rmdir()
    added = add_broker(hamq_cli, container, b)
    assert added.returncode == 0, added.stderr
    create_topic(c.namesrv, "Repaired", 2, {"broker-a", "broker-b"})
    assert produce_and_consume(c.namesrv, "Repaired") == {"broker-a", "broker-b"}
    assert proc.alive()


def test_unknown_codes_on_the_container_port_are_not_supported(namesrv_cluster, raw_conn):
    c = namesrv_cluster
    _, container = start_container(c, "container", [c.write_broker_config("a")])
    answer = ask(raw_conn, container, RequestCode.SEND_MESSAGE, {"topic": "T"})
    assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, answer
    answer = ask(raw_conn, container, RequestCode.ADD_BROKER, body=pack_body({7: "x"}))
    assert answer.code == ResponseCode.INVALID_ARGUMENT, answer
    assert "map of broker settings (names to values)" in answer.remark


def test_dev_containers_killed_and_restarted_take_their_groups_back(
    dev_containers,  # noqa: F811 (the fixture imported above)
    tmp_path,
    hamq_cli,
):
    """``hamq dev --mode container``: kill -9 of container-1 takes broker-a's master and
    broker-b's slave at once; broker-a's slave (in container-2) acts, broker-b's master
    serves on. Restarted, broker-a's master runs pre-online against its slave in the other
    container and takes the group back. Then both containers die and come back one after
    the other: each one's master waits for its slave in the other (pre-online), and neither
    waits for ever."""
    dev, ready = dev_containers
    namesrv = ready["namesrv"]
    addr = {b["name"]: b["address"] for b in ready["brokers"]}
    configs = {c["name"]: Path(ready["data"]) / f"{c['name']}.toml" for c in ready["containers"]}
    pids = {c["name"]: c["pid"] for c in ready["containers"]}
    create_topic(namesrv, "DevRestart", 2, {"broker-a", "broker-b"})

    # what hamq dev prints works as printed: connect there, remove a member, add it back
    printed = wait_for(
        lambda: (text := (tmp_path / "dev.stderr").read_text()).count("adds it back") == 2 and text,
        10,
        "hamq dev's usage lines",
    )
    assert f"connect with --namesrv {namesrv}" in printed
    line = next(ln for ln in printed.splitlines() if "container-1 at" in ln)
    container_1 = line.split("--container ")[1].split()[0]
    member_file = line.split(" -c ")[1].split()[0].replace("NAME-ID", "broker-b-1")
    for args in (
        ["remove-broker", "--container", container_1, "-b", "broker-b", "-i", "1"],
        ["add-broker", "--container", container_1, "-c", member_file],
    ):
        result = hamq_cli("admin", "container", *args)
        assert result.returncode == 0, result.stderr
    restarted: list[Proc] = []

    def restart(name: str) -> None:
        log = tmp_path / f"{name}-restart.log"
        restarted.append(Proc(name, ["container", "-c", str(configs[name])], log).start())

    def masters_back(admin) -> bool:
        masters = admin.master_addrs()
        return (masters.get("broker-a"), masters.get("broker-b")) == (
            addr["broker-a-0"],
            addr["broker-b-0"],
        ) and not admin.broker_runtime_info(addr["broker-a-1"])["acting_master"]["acting"]

    try:
        with hamq.Admin(namesrv) as admin:
            os.kill(pids["container-1"], signal.SIGKILL)
            wait_for(
                lambda: admin.broker_runtime_info(addr["broker-a-1"])["acting_master"]["acting"],
                WAIT_S,
                "broker-a's slave acting in container-2",
            )
            restart("container-1")
            wait_for(lambda: masters_back(admin), WAIT_S, "broker-a's master back")
        assert produce_and_consume(namesrv, "DevRestart") == {"broker-a", "broker-b"}

        for proc in restarted:
            proc.kill9()
        os.kill(pids["container-2"], signal.SIGKILL)
        wait_for(lambda: not pid_alive(pids["container-2"]), 10, "container-2 gone")
        restart("container-1")
        restart("container-2")
        with hamq.Admin(namesrv) as admin:
            wait_for(lambda: masters_back(admin), WAIT_S, "both masters back")
        assert produce_and_consume(namesrv, "DevRestart") == {"broker-a", "broker-b"}
    finally:
        for proc in restarted:
            proc.stop()
    assert dev.poll() is None  # hamq dev itself serves on (it reported the children's exit)


def pull_all(namesrv: str, queue: MessageQueue) -> set[bytes]:
    got: set[bytes] = set()
    with hamq.PullConsumer("g-removed", namesrv) as consumer:
        offset = 0
        while (result := consumer.pull(queue, offset, 500)).status is PullStatus.FOUND:
            got |= {m.body for m in result.messages}
            offset = result.next_begin_offset
    return got


def test_removing_a_master_mid_stream_loses_no_acknowledged_send(cluster_factory, hamq_cli):
    """remove-broker of broker-a's master while a producer streams into it: every send it
    acknowledged (sync master: its slave has it) is read from the acting slave in the
    other container, and again from the master once it is added back (pre-online)."""
    c = cluster_factory()
    configs = acting_groups(c, skip_pre_online=False)
    _, c1 = start_container(
        c, "c1", [configs["a-master"], configs["b-slave"]], store_root=str(c.root)
    )
    start_container(c, "c2", [configs["b-master"], configs["a-slave"]])
    create_topic(c.namesrv, "Stream", 1, {"broker-a", "broker-b"})
    queue = MessageQueue("Stream", "broker-a", 0)
    acked: list[bytes] = []
    stop = threading.Event()

    def produce() -> None:
        with hamq.Producer(c.namesrv) as producer:
            for i in range(20_000):
                if stop.is_set():
                    return
                body = f"s{i}".encode()
                try:
                    if producer.send(Message("Stream", body), queue).status is SendStatus.SEND_OK:
                        acked.append(body)
                except HamqError:
                    time.sleep(0.05)  # the master is gone: its sends fail, none is acked

    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: master_of(admin, "Stream", "broker-a"), WAIT_S, "Stream routed")
        producer = threading.Thread(target=produce)
        producer.start()
        try:
            wait_for(lambda: len(acked) >= 100, WAIT_S, "sends acknowledged")
            removed = hamq_cli(
                "admin", "container", "remove-broker", "--container", c1,
                "-b", "broker-a", "-i", "0",
            )  # fmt: skip
            assert removed.returncode == 0, removed.stderr
            slave = c.broker_addr("a-slave")
            wait_for(
                lambda: admin.broker_runtime_info(slave)["acting_master"]["acting"],
                WAIT_S,
                "broker-a's slave acting",
            )
        finally:
            stop.set()
            producer.join(30)
        assert acked
        missing = set(acked) - pull_all(c.namesrv, queue)
        assert not missing, f"{len(missing)} acknowledged sends lost: {sorted(missing)[:5]}"

        back = add_broker(hamq_cli, c1, configs["a-master"])
        assert back.returncode == 0, back.stderr
        master = c.broker_addr("a-master")
        wait_for(
            lambda: (
                admin.master_addrs().get("broker-a") == master
                and not admin.broker_runtime_info(slave)["acting_master"]["acting"]
            ),
            WAIT_S,
            "broker-a's master back",
        )
    assert set(acked) <= pull_all(c.namesrv, queue)


def test_an_add_and_remove_storm_leaves_one_consistent_member(namesrv_cluster, raw_conn):
    """Adds and removes of one member sent at once on many connections: they run one at a
    time, each answered (added, already a member, removed, not a member); afterwards the
    member is either there and serving or absent with its store free to be added again."""
    c = namesrv_cluster
    a = c.write_broker_config("a")
    proc, container = start_container(c, "container", [a], store_root=str(c.root))
    b = c.write_broker_config("b", broker_name="broker-b")
    settings = pack_body(dataclasses.asdict(load_config(BrokerConfig, b)))
    remove = {"broker_name": "broker-b", "broker_id": 0}
    conns = [raw_conn(container) for _ in range(16)]
    for i, conn in enumerate(conns):
        if i % 2:
            conn.send(encode_frame_bytes(RequestCode.REMOVE_BROKER, i, ext=remove))
        else:
            conn.send(encode_frame_bytes(RequestCode.ADD_BROKER, i, body=settings))
    answers = [conn.read_frame() for conn in conns]
    assert all(answer is not None for answer in answers)
    expected = ("is already a member", "is not a member")
    for answer in answers:
        assert answer.code == ResponseCode.SUCCESS or any(e in answer.remark for e in expected), (
            answer
        )
    members = ask(raw_conn, container, RequestCode.REMOVE_BROKER, remove)
    if members.code != ResponseCode.SUCCESS:  # the storm ended with it removed
        assert "is not a member" in members.remark
    back = ask(raw_conn, container, RequestCode.ADD_BROKER, body=settings)
    assert back.code == ResponseCode.SUCCESS, back
    create_topic(c.namesrv, "Storm", 2, {"broker-a", "broker-b"})
    assert produce_and_consume(c.namesrv, "Storm") == {"broker-a", "broker-b"}
    assert proc.alive()


def test_a_member_whose_broker_id_is_live_elsewhere_is_refused(namesrv_cluster, hamq_cli):
    """broker-a's master runs in a process of its own; adding another broker-a id 0 to a
    container (another store, another port) must not take the group's id: the name server
    refuses its registration, and the container refuses the member instead of hosting an
    unrouted master."""
    c = namesrv_cluster
    c.start_broker("solo", broker_name="broker-a")
    proc, container = start_container(
        c, "container", [c.write_broker_config("b", broker_name="broker-b")], store_root=str(c.root)
    )
    twin = c.write_broker_config("twin", broker_name="broker-a")
    refused = add_broker(hamq_cli, container, twin)
    assert refused.returncode == 1, refused.stdout
    assert f"is registered by live member {c.broker_addr('solo')}" in refused.stderr
    with hamq.Admin(c.namesrv) as admin:
        assert admin.master_addrs()["broker-a"] == c.broker_addr("solo")
    create_topic(c.namesrv, "Twin", 1, {"broker-a", "broker-b"})
    assert produce_and_consume(c.namesrv, "Twin") == {"broker-a", "broker-b"}
    assert proc.alive()


def test_an_oversized_add_broker_body_is_refused_at_once(namesrv_cluster, raw_conn):
    """Member settings are checked on the loop every member shares: a body near the frame
    limit (a million name-server addresses) is refused by its size, not checked entry by
    entry while the members wait."""
    c = namesrv_cluster
    proc, container = start_container(c, "container", [c.write_broker_config("a")])
    huge = pack_body({"broker_name": "broker-b", "namesrv": ["127.0.0.1:9876"] * 900_000})
    answer = ask(raw_conn, container, RequestCode.ADD_BROKER, body=huge)
    assert answer.code == ResponseCode.INVALID_ARGUMENT, answer
    assert "a member's settings take at most" in answer.remark
    long_key = pack_body({"x" * 100_000: 1})
    answer = ask(raw_conn, container, RequestCode.ADD_BROKER, body=long_key)
    assert answer.code == ResponseCode.INVALID_ARGUMENT and len(answer.remark) < 1000, answer
    assert proc.alive()


def test_a_member_out_of_disk_leaves_the_other_serving(namesrv_cluster):
    """broker-b's disk is (as far as it can tell) full: its sends are refused with the
    reason, broker-a beside it in the process takes sends and pulls as before, and the
    container stops cleanly with both."""
    c = namesrv_cluster
    a = c.write_broker_config("a")
    full = c.write_broker_config("b", broker_name="broker-b", disk_min_free_bytes=2**62)
    proc, _ = start_container(c, "container", [a, full])
    create_topic(c.namesrv, "OneFull", 1, {"broker-a", "broker-b"})
    with hamq.Producer(c.namesrv) as producer:
        for i in range(3):  # turn about: broker-b refuses, broker-a takes each send
            with pytest.raises(HamqError, match="disk nearly full"):
                producer.send(Message("OneFull", b"b"), MessageQueue("OneFull", "broker-b", 0))
            body = f"a{i}".encode()
            sent = producer.send(Message("OneFull", body), MessageQueue("OneFull", "broker-a", 0))
            assert sent.status is SendStatus.SEND_OK
    assert pull_all(c.namesrv, MessageQueue("OneFull", "broker-a", 0)) == {b"a0", b"a1", b"a2"}
    assert not pull_all(c.namesrv, MessageQueue("OneFull", "broker-b", 0))
    proc.stop()
    assert proc.popen.returncode == 0
