"""``hamq container``: broker members of different groups in one process (seed 004's
BrokerContainer), added and removed at runtime with ``hamq admin container``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import hamq
from hamq import Message
from hamq.cli.common import readable
from hamq.cli.dev_web import WEB_PORT_OFFSET
from hamq.client.consumer import PullStatus
from hamq.client.message import MessageQueue
from hamq.config import dump_toml
from harness import Cluster, Proc
from helpers import accepts, free_port, free_port_base, pid_alive, scrape_metrics, wait_for

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_escape import (
    ACTING,
    DELAY_LEVEL,
    DELAY_TOPIC,
    WAIT_S,
    commitlog_end,
    master_of,
    read_group,
)


def write_container(c: Cluster, name: str, members: list[Path], **settings) -> Path:
    cfg = c.root / f"{name}.toml"
    values = {
        "listen": f"127.0.0.1:{free_port()}",
        "namesrv": c.namesrv_addrs,
        "brokers": [str(m) for m in members],
        **settings,
    }
    cfg.write_text(dump_toml(values))
    return cfg


def start_container(c: Cluster, name: str, members: list[Path], **settings) -> tuple[Proc, str]:
    cfg = write_container(c, name, members, **settings)
    proc = Proc(name, ["container", "-c", str(cfg)], c.root / f"{name}.log").start()
    c.procs[name] = proc
    return proc, c.broker_addr(name)  # the container file's listen


def produce_and_consume(namesrv: str, topic: str, count: int = 20) -> set[str]:
    """Every message sent is pulled back; returns the broker names that stored them."""
    sent = {f"m{i}".encode() for i in range(count)}
    with hamq.Producer(namesrv) as producer:
        brokers = {producer.send(Message(topic, body)).queue.broker_name for body in sent}
    got = set()
    with hamq.PullConsumer("g-container", namesrv) as consumer:
        for mq in consumer.fetch_message_queues(topic):
            offset = consumer.min_offset(mq)
            while (result := consumer.pull(mq, offset, 100)).status is PullStatus.FOUND:
                got |= {m.body for m in result.messages}
                offset = result.next_begin_offset
    assert got == sent
    return brokers


def member_names(namesrv: str) -> dict[str, dict[int, str]]:
    with hamq.Admin(namesrv) as admin:
        table = admin.cluster_info()["broker_addr_table"]
    return {name: {int(i): a for i, a in e["broker_addrs"].items()} for name, e in table.items()}


def acting_groups(c: Cluster, **settings) -> dict[str, Path]:
    """A name server that routes acting masters, and the configs of two groups of a sync
    master and a slave with slave acting master on ("a-master", "a-slave", "b-master",
    "b-slave"), ``settings`` over ``ACTING``: the tests place them in containers."""
    c.start_namesrv(
        scan_not_active_broker_interval_ms=300,
        broker_not_active_timeout_ms=2000,
        support_acting_master=True,
    )
    roles = {"master": ("sync_master", 0), "slave": ("slave", 1)}
    configs = {}
    for name in ("a-master", "a-slave", "b-master", "b-slave"):
        group, role = name.split("-")
        configs[name] = c.write_broker_config(
            name,
            broker_name=f"broker-{group}",
            broker_role=roles[role][0],
            broker_id=roles[role][1],
            total_replicas=2,
            **{**ACTING, **settings},
        )
    return configs


def create_topic(namesrv: str, topic: str, queues: int, groups: set[str]) -> None:
    """``topic`` on every master once each group's master is registered (a master
    registers once its pre-online is done, which may be after its ready line)."""
    with hamq.Admin(namesrv) as admin:
        wait_for(lambda: groups <= set(admin.master_addrs()), WAIT_S, f"masters of {groups}")
        admin.create_topic(topic, queues)


@pytest.fixture
def namesrv_cluster(cluster_factory) -> Cluster:
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    return c


def test_container_serves_two_groups_with_labelled_metrics_and_stops_them_all(namesrv_cluster):
    c = namesrv_cluster
    a = c.write_broker_config("a", broker_name="broker-a")
    b = c.write_broker_config("b", broker_name="broker-b")
    metrics = f"127.0.0.1:{free_port()}"
    proc, container = start_container(c, "container", [a, b], metrics_listen=metrics)
    assert proc.ready == {
        "event": "ready",
        "role": "container",
        "listen": container,
        "pid": proc.pid,
        "brokers": [
            {
                "broker_name": n,
                "broker_id": 0,
                "listen": c.broker_addr(f),
                "ha_listen": tomllib.loads((c.root / f"{f}.toml").read_text())["ha_listen"],
                "role": "master",
            }
            for n, f in (("broker-a", "a"), ("broker-b", "b"))
        ],
    }
    create_topic(c.namesrv, "Hosted", 2, {"broker-a", "broker-b"})
    with hamq.Admin(c.namesrv) as admin:
        info = [admin.broker_runtime_info(c.broker_addr(n)) for n in ("a", "b")]
    assert {i["pid"] for i in info} == {proc.pid}  # one process serves both
    assert produce_and_consume(c.namesrv, "Hosted") == {"broker-a", "broker-b"}

    # one /metrics, one series per member (no gauge of one overwriting the other's)
    m = scrape_metrics(metrics)
    for name in ("broker-a", "broker-b"):
        assert m[f'hamq_commitlog_max_offset{{broker_id="0",broker_name="{name}"}}'] > 0
    assert m["hamq_messages_in_total"] == 20  # process-wide: both members' sends

    proc.stop()
    assert proc.popen.returncode == 0
    assert not pid_alive(proc.pid)
    assert not any(accepts(c.broker_addr(n)) for n in ("a", "b", "container"))
    wait_for(lambda: not member_names(c.namesrv), 10, "both members deregistered")


def test_name_server_notifications_reach_the_member_of_their_group(namesrv_cluster):
    """The members share one connection to the name server; its reverse notifications
    (NOTIFY_MIN_BROKER_ID_CHANGE) go to the member of the group they name. Polls are an
    hour apart here, so only a notification can tell a master its slave came and went."""
    c = namesrv_cluster
    no_polls = {"sync_broker_member_group_period_ms": 3_600_000}
    a = c.write_broker_config("a", broker_name="broker-a", **no_polls)
    b = c.write_broker_config("b", broker_name="broker-b", **no_polls)
    start_container(c, "container", [a, b])

    def alive_replicas() -> dict[str, int]:
        with hamq.Admin(c.namesrv) as admin:
            return {n: admin.broker_runtime_info(c.broker_addr(n))["alive_replicas"] for n in "ab"}

    wait_for(lambda: alive_replicas() == {"a": 1, "b": 1}, 10, "each master alone")
    slave = c.start_broker(
        "a-slave", broker_name="broker-a", broker_id=1, broker_role="slave", **no_polls
    )
    wait_for(lambda: alive_replicas() == {"a": 2, "b": 1}, 10, "broker-a told of its slave")
    slave.stop()
    wait_for(lambda: alive_replicas() == {"a": 1, "b": 1}, 10, "broker-a told it left")


def test_add_and_remove_brokers_at_runtime(namesrv_cluster, hamq_cli):
    c = namesrv_cluster
    a = c.write_broker_config("a", broker_name="broker-a")
    proc, container = start_container(c, "container", [a], store_root=str(c.root))
    b = c.write_broker_config(
        "b", broker_name="broker-b", namesrv="127.0.0.1:1"
    )  # the container's wins

    added = hamq_cli(
        "admin", "container", "add-broker", "--container", container, "-c", str(b), "--json"
    )
    assert added.returncode == 0, added.stderr
    members = json.loads(added.stdout)["members"]
    assert {(m["broker_name"], m["broker_id"]) for m in members} == {
        ("broker-a", 0),
        ("broker-b", 0),
    }
    create_topic(c.namesrv, "Added", 2, {"broker-a", "broker-b"})
    assert produce_and_consume(c.namesrv, "Added") == {"broker-a", "broker-b"}

    again = hamq_cli("admin", "container", "add-broker", "--container", container, "-c", str(b))
    assert again.returncode == 1
    assert "broker broker-b id 0 is already a member of this container" in again.stderr

    unknown = hamq_cli(
        "admin", "container", "remove-broker", "--container", container, "-b", "broker-c", "-i", "0"
    )
    assert unknown.returncode == 1
    assert "broker broker-c id 0 is not a member of this container" in unknown.stderr

    removed = hamq_cli(
        "admin", "container", "remove-broker", "--container", container,
        "--broker-name", "broker-b", "--broker-id", "0", "--json",
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    assert [m["broker_name"] for m in json.loads(removed.stdout)["members"]] == ["broker-a"]
    assert not accepts(c.broker_addr("b"))  # stopped as its own process would be
    wait_for(lambda: "broker-b" not in member_names(c.namesrv), 10, "broker-b deregistered")
    assert proc.alive()
    assert produce_and_consume(c.namesrv, "Added") == {"broker-a"}

    # its store was let go: the member comes back with what it stored
    back = hamq_cli("admin", "container", "add-broker", "--container", container, "-c", str(b))
    assert back.returncode == 0, back.stderr


def test_a_member_that_cannot_start_leaves_the_container_serving(namesrv_cluster, hamq_cli):
    c = namesrv_cluster
    a = c.write_broker_config("a", broker_name="broker-a")
    proc, container = start_container(c, "container", [a], store_root=str(c.root))
    taken = c.write_broker_config("taken", broker_name="broker-b", listen=c.broker_addr("a"))
    refused = hamq_cli(
        "admin", "container", "add-broker", "--container", container, "-c", str(taken)
    )
    assert refused.returncode == 1
    assert f"listen = '{c.broker_addr('a')}': cannot listen there" in refused.stderr
    metered = c.write_broker_config("metered", broker_name="broker-b", metrics_listen="127.0.0.1:1")
    refused = hamq_cli(
        "admin", "container", "add-broker", "--container", container, "-c", str(metered)
    )
    assert refused.returncode == 1
    assert "metrics_listen = '127.0.0.1:1': must be empty for a container member" in refused.stderr
    assert proc.alive()
    create_topic(c.namesrv, "StillServed", 1, {"broker-a"})
    assert produce_and_consume(c.namesrv, "StillServed") == {"broker-a"}


@pytest.mark.parametrize(
    ("members", "settings", "expected"),
    [
        ([], {"brokres": ["x.toml"]}, "unknown key 'brokres' (did you mean 'brokers'?)"),
        ([], {"namesrv": []}, "namesrv = []: must name at least one name server"),
        (["a", "a2"], {}, "broker broker-a id 0 is already a member of this container"),
        (["a", "same_store"], {}, "is already the store of member broker-a id 0"),
        (["missing"], {}, "cannot read config file"),
    ],
)
def test_bad_container_config_is_refused_clearly(
    namesrv_cluster, hamq_cli, members, settings, expected
):
    c = namesrv_cluster
    configs = {
        "a": c.write_broker_config("a"),
        "a2": c.write_broker_config("a2"),
        "same_store": c.write_broker_config(
            "same_store", broker_name="broker-b", store_dir=str(c.root / "a")
        ),
        "missing": c.root / "missing.toml",
    }
    cfg = write_container(c, "container", [configs[m] for m in members], **settings)
    result = hamq_cli("container", "-c", str(cfg), timeout=60)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


# hamq dev --mode container's ports, from --port-base: name server, web console, containers,
# members (+HA)
DEV_PORT_OFFSETS = [
    0,
    WEB_PORT_OFFSET,
    1001,
    1002,
    *(1035 + 10 * i + ha for i in range(4) for ha in (0, 1)),
]
DEV_READY_TIMEOUT_S = 90.0


@pytest.fixture
def dev_containers(tmp_path):
    """``hamq dev --mode container`` running; yields (Popen, ready dict); every process it
    started is killed by PID at the end."""
    base = free_port_base(DEV_PORT_OFFSETS)
    args = ["dev", "--mode", "container", "--data", str(tmp_path / "dev"), "--port-base", str(base)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hamq.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "dev.stderr", "wb"),  # noqa: SIM115 (the child holds it)
        start_new_session=True,
    )
    ready: dict = {}
    try:
        assert readable(proc.stdout, DEV_READY_TIMEOUT_S), "hamq dev printed nothing in time"
        ready = json.loads(proc.stdout.readline())
        yield proc, ready
    finally:
        pids = [ready.get("namesrv_pid"), *(c["pid"] for c in ready.get("containers", []))]
        for pid in [proc.pid, *filter(None, pids)]:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)


def test_dev_mode_container_hosts_two_groups_crosswise(dev_containers):
    proc, ready = dev_containers
    assert ready["event"] == "ready" and ready["mode"] == "container"
    hosts = {c["name"]: c["brokers"] for c in ready["containers"]}
    assert hosts == {
        "container-1": ["broker-a-0", "broker-b-1"],
        "container-2": ["broker-b-0", "broker-a-1"],
    }
    pid_of = {c["name"]: c["pid"] for c in ready["containers"]}
    by_name = {b["name"]: b for b in ready["brokers"]}
    assert by_name["broker-a-0"]["pid"] == by_name["broker-b-1"]["pid"] == pid_of["container-1"]
    assert by_name["broker-b-0"]["pid"] == by_name["broker-a-1"]["pid"] == pid_of["container-2"]
    groups = member_names(ready["namesrv"])
    assert {n: sorted(ids) for n, ids in groups.items()} == {"broker-a": [0, 1], "broker-b": [0, 1]}
    create_topic(ready["namesrv"], "DevHosted", 2, {"broker-a", "broker-b"})
    assert produce_and_consume(ready["namesrv"], "DevHosted") == {"broker-a", "broker-b"}

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    for pid in [ready["namesrv_pid"], *pid_of.values()]:
        wait_for(lambda pid=pid: not pid_alive(pid), 10, f"pid {pid} exited")


@pytest.mark.parametrize(
    ("layout", "how"),
    [
        # seed 004's picture: broker-a's slave shares a process with broker-b's master
        ({"c1": ["a-master", "b-slave"], "c2": ["b-master", "a-slave"]}, "locally"),
        # the masters together, the slaves together: nothing to escape into beside it
        ({"c1": ["a-master", "b-master"], "c2": ["a-slave", "b-slave"]}, "remotely"),
    ],
)
def test_acting_master_escapes_into_a_master_in_its_own_process_first(
    cluster_factory, hamq_cli, layout, how
):
    """broker-a's master is removed from its container: its slave acts, and the delay
    message waiting in broker-a falls due and goes to broker-b's master, through the
    master beside it when there is one (local escape), else over the network."""
    c = cluster_factory()
    configs = acting_groups(c, enable_remote_escape=how == "remotely")
    metrics = f"127.0.0.1:{free_port()}"
    start_container(c, "c1", [configs[n] for n in layout["c1"]])
    start_container(c, "c2", [configs[n] for n in layout["c2"]], metrics_listen=metrics)
    create_topic(c.namesrv, DELAY_TOPIC, 1, {"broker-a", "broker-b"})
    with hamq.Admin(c.namesrv) as admin:
        wait_for(
            lambda: (
                master_of(admin, DELAY_TOPIC, "broker-a")
                and master_of(admin, DELAY_TOPIC, "broker-b")
            ),
            WAIT_S,
            "the topic routed on both groups",
        )
        with hamq.Producer(c.namesrv) as producer:
            producer.send(
                Message(DELAY_TOPIC, b"late", keys="delayed", delay_level=DELAY_LEVEL),
                MessageQueue(DELAY_TOPIC, "broker-a", 0),
            )
        slave = c.broker_addr("a-slave")
        wait_for(
            lambda: (
                commitlog_end(c.namesrv, slave)
                == commitlog_end(c.namesrv, c.broker_addr("a-master"))
            ),
            WAIT_S,
            "broker-a's slave caught up",
        )
        removed = hamq_cli(
            "admin", "container", "remove-broker", "--container", c.broker_addr("c1"),
            "-b", "broker-a", "-i", "0",
        )  # fmt: skip
        assert removed.returncode == 0, removed.stderr
        wait_for(
            lambda: admin.broker_runtime_info(slave)["acting_master"]["acting"],
            WAIT_S,
            "broker-a's slave acting",
        )
        log_end = commitlog_end(c.namesrv, slave)

    # due during the outage: delivered once, into broker-b's master
    assert read_group(c.namesrv, DELAY_TOPIC, "broker-b", 1, WAIT_S) == ["delayed"]
    assert read_group(c.namesrv, DELAY_TOPIC, "broker-b", 2, 2.0) == ["delayed"]
    samples = scrape_metrics(metrics)  # container 2's process: the acting master's
    local, remote = samples["hamq_escaped_local_total"], samples["hamq_escaped_remote_total"]
    assert (local, remote) == ((1, 0) if how == "locally" else (0, 1))
    assert f"escaped 1 message(s) {how} into broker-b's master" in (c.root / "c2.log").read_text()
    assert commitlog_end(c.namesrv, slave) == log_end  # the acting master never appends
