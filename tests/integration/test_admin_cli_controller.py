"""Controller mode as an operator meets it (issue 14 scope 7): ``hamq dev`` (its default,
``--mode controller``: three members, the controller peers embedded in the name servers)
prints one ready line naming every member's role, epoch, address and pid, the controller
peers and the web console, which answers; ``hamq admin sync-state-set``,
``controller-metadata``, ``elect-master`` and ``clean-broker-metadata`` answer from the
real controller, as text and as JSON, and a refusal is its CONTROLLER_* name and remark
with exit code 1; ``hamq bench failover`` times kill -9s of the master and reads every
acknowledged message back."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

import hamq
from hamq import Message
from hamq.cli.common import readable
from hamq.cli.dev_web import WEB_PORT_OFFSET
from helpers import dev_console_overview, free_port_base, pid_alive, wait_for

READY_TIMEOUT_S = 120.0  # three members register, elect and fill the SyncStateSet
# hamq dev: name servers and controllers from port-base up, the web console at +1000;
# member i listens on port-base + 1035 + 10 * i, its HA port one above
DEV_PORT_OFFSETS = [
    *range(5),
    WEB_PORT_OFFSET,
    *(1035 + 10 * i + j for i in range(3) for j in (0, 1)),
]
HAMQ_DEV = [sys.executable, "-m", "hamq.cli.main", "dev"]
TOPIC = "AdminT"
REFUSAL = re.compile(r"CONTROLLER_[A-Z_]+: \S")


def ready_pids(ready: dict) -> list[int]:
    return [p["pid"] for p in ready.get("controllers", []) + ready.get("brokers", [])] + [
        ready.get("namesrv_pid", 0)
    ]


@contextlib.contextmanager
def dev_controller(root, *args: str):
    """``hamq dev *args`` running; yields (Popen, ready line). Whatever is still alive at
    the end is killed by PID."""
    proc = subprocess.Popen(
        [
            *HAMQ_DEV,
            "--data",
            str(root / "dev"),
            "--port-base",
            str(free_port_base(DEV_PORT_OFFSETS)),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=open(root / "dev.stderr", "wb"),  # noqa: SIM115 (the child holds it)
        start_new_session=True,
        env={**os.environ, "HAMQ_LOG_LEVEL": "WARNING"},
    )
    ready: dict = {}
    try:
        line = proc.stdout.readline() if readable(proc.stdout, READY_TIMEOUT_S) else b""
        assert line, f"hamq dev not ready: {(root / 'dev.stderr').read_text()[-3000:]}"
        ready = json.loads(line)
        yield proc, ready
    finally:
        for pid in [proc.pid, *ready_pids(ready)]:
            if pid and pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """One cluster for the admin tests, ``hamq dev``'s default: three name servers embedding
    the controller, a group of three."""
    with dev_controller(tmp_path_factory.mktemp("embedded")) as (_, ready):
        with hamq.Admin(ready["namesrv"]) as admin:
            admin.create_topic(TOPIC, 1)
        yield ready


def check_ready_line(ready: dict, embedded: bool) -> None:
    assert ready["event"] == "ready" and ready["mode"] == "controller"
    brokers = ready["brokers"]
    assert len(brokers) == 3
    assert [b["role"] for b in brokers].count("master") == 1
    assert {b["role"] for b in brokers} == {"master", "slave"}
    master = next(b for b in brokers if b["role"] == "master")
    assert master["epoch"] == ready["master_epoch"] >= 1
    assert sorted(ready["sync_state_set"]) == sorted(b["broker_id"] for b in brokers)
    assert len({b["address"] for b in brokers}) == 3
    controllers = ready["controllers"]
    assert [c["id"] for c in controllers] == [1, 2, 3]
    assert [c["leader"] for c in controllers].count(True) == 1
    assert all(c["embedded"] is embedded for c in controllers)
    namesrvs = ready["namesrv"].split(";")
    if embedded:  # the name servers are the controller peers
        assert namesrvs == [c["address"] for c in controllers]
    else:
        assert len(namesrvs) == 1 and namesrvs[0] not in {c["address"] for c in controllers}
    assert all(pid_alive(pid) for pid in ready_pids(ready))


def test_dev_default_is_a_controller_group_of_three_with_its_console(embedded):
    """What ``make run`` shows a user evaluating hamq: a group of three with an elected
    master (the ready line says so) and the console, served by the first name server."""
    check_ready_line(embedded, embedded=True)
    [group] = dev_console_overview(embedded)["groups"]
    members = {m["address"] for m in group["members"]}
    assert members == {b["address"] for b in embedded["brokers"]}
    assert group["master_address"] in members  # the other tests of this module may elect


def test_console_nodes_are_the_broker_processes_without_controller_nodes(embedded):
    """The default cluster has no nodes for the controller to place on: /api/nodes lists
    the three broker processes (a RabbitMQ user reads it as the cluster's processes), and
    the overview counts them."""
    rows = console_get(embedded, "api/nodes")
    by_address = {b["address"]: b for b in embedded["brokers"]}
    assert sorted(r["address"] for r in rows) == sorted(by_address)
    assert all(r["running"] and r["pid"] == by_address[r["address"]]["pid"] for r in rows)
    assert sorted(r["role"] for r in rows) == ["master", "slave", "slave"]
    assert {(m["broker_name"], m["address"]) for r in rows for m in r["members"]} == {
        ("broker-a", a) for a in by_address
    }
    assert console_get(embedded, "api/overview")["node_count"] == 3


def console_get(ready: dict, path: str):
    """``GET path`` of the console the ready line names, answered 200 with JSON."""
    with urllib.request.urlopen(ready["web"]["url"] + path, timeout=10) as response:
        assert response.status == 200
        return json.loads(response.read())


def test_dev_standalone_controllers_ready_line_and_sigterm(tmp_path):
    with dev_controller(
        tmp_path, "--mode", "controller", "--standalone", "--replicas", "3", "--controllers", "3"
    ) as (proc, ready):
        check_ready_line(ready, embedded=False)
        # the name server serving the console does not embed the controller: its controller
        # routes reach the standalone peers (web_controllers), not a 503
        group = console_get(ready, "api/groups/broker-a")
        assert (group["mode"], group["master_epoch"]) == ("controller", ready["master_epoch"])
        assert "/" in {v["name"] for v in console_get(ready, "api/vhosts")}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        wait_for(
            lambda: not any(pid_alive(pid) for pid in ready_pids(ready)),
            10.0,
            "hamq dev to stop every server it started",
        )


def admin(hamq_cli, ready: dict, *args: str) -> subprocess.CompletedProcess:
    """``hamq admin ...`` with a name server's address as the controller address (each one
    embeds a peer)."""
    return hamq_cli("admin", *args, "--controller", ready["namesrv"].split(";")[-1])


def group_state(hamq_cli, ready: dict) -> dict:
    done = admin(hamq_cli, ready, "sync-state-set", "--broker-name", "broker-a", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def working_group(hamq_cli, ready: dict, *in_sync: int) -> dict:
    """The group's state once a send went through and the members ``in_sync`` (default:
    all) are in the SyncStateSet. The tests read the set of a group that takes writes: a
    slave stays in it by catching up with what the master ships."""
    with hamq.Producer(ready["namesrv"]) as producer:
        producer.send(Message(TOPIC, b"keep the slaves catching up"))
    wanted = set(in_sync or (b["broker_id"] for b in ready["brokers"]))

    def in_set() -> dict | None:
        group = group_state(hamq_cli, ready)
        return group if wanted <= set(group["sync_state_set"]) else None

    return wait_for(in_set, 30.0, f"members {sorted(wanted)} in the SyncStateSet")


def test_sync_state_set_and_controller_metadata(embedded, hamq_cli):
    group = working_group(hamq_cli, embedded)
    master = next(b for b in embedded["brokers"] if b["role"] == "master")
    assert (group["master_id"], group["master_addr"]) == (master["broker_id"], master["address"])
    assert group["cluster_name"] == "DevCluster"
    assert sorted(group["sync_state_set"]) == sorted(b["broker_id"] for b in embedded["brokers"])
    assert all(m["alive"] for m in group["members"])
    text = admin(hamq_cli, embedded, "sync-state-set", "--broker-name", "broker-a")
    assert text.returncode == 0, text.stderr
    assert f"master {master['broker_id']} at {master['address']}" in text.stdout
    assert all(b["address"] in text.stdout for b in embedded["brokers"])

    done = admin(hamq_cli, embedded, "controller-metadata", "--json")
    assert done.returncode == 0, done.stderr
    meta = json.loads(done.stdout)
    peers = {c["id"]: c["address"] for c in embedded["controllers"]}
    assert dict(meta["peers"]) == peers
    assert meta["leader_id"] in peers and meta["leader_addr"] == peers[meta["leader_id"]]
    assert meta["term"] >= 1
    text = admin(hamq_cli, embedded, "controller-metadata")
    assert text.returncode == 0, text.stderr
    assert f"Raft leader {meta['leader_id']} at {meta['leader_addr']}" in text.stdout
    assert "(leader)" in text.stdout


def test_refusals_name_the_controller_code_and_exit_1(embedded, hamq_cli):
    """A member id the group does not have, and a living member to forget without
    --clean-living-broker: refused, nothing changed."""
    before = group_state(hamq_cli, embedded)
    slave = next(b for b in embedded["brokers"] if b["role"] == "slave")
    for args in (
        ("elect-master", "--broker-name", "broker-a", "--broker-id", "99"),
        (
            "clean-broker-metadata",
            "--broker-name",
            "broker-a",
            "--broker-ids",
            str(slave["broker_id"]),
        ),
    ):
        done = admin(hamq_cli, embedded, *args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert REFUSAL.search(done.stderr), (args, done.stderr)
        assert "Traceback" not in done.stderr
    after = group_state(hamq_cli, embedded)
    assert (after["master_id"], after["master_epoch"], len(after["members"])) == (
        before["master_id"],
        before["master_epoch"],
        len(before["members"]),
    )
    unknown = admin(hamq_cli, embedded, "sync-state-set", "--broker-name", "nobody")
    assert unknown.returncode == 1 and "nobody" in unknown.stderr


def elect(hamq_cli, ready: dict, broker_id: int, *args: str) -> subprocess.CompletedProcess:
    return admin(
        hamq_cli, ready, "elect-master", "-b", "broker-a", "--broker-id", str(broker_id), *args
    )


def test_elect_master_moves_mastership_and_back(embedded, hamq_cli):
    """To a slave (JSON), refused for the master it already is, and back to the first
    master once that one rejoined the SyncStateSet (text)."""
    before = working_group(hamq_cli, embedded)
    first = next(m for m in before["members"] if m["broker_id"] == before["master_id"])
    chosen = next(m for m in before["members"] if m["broker_id"] != before["master_id"])
    done = elect(hamq_cli, embedded, chosen["broker_id"], "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert (info["master_id"], info["master_addr"]) == (chosen["broker_id"], chosen["address"])
    assert info["master_epoch"] > before["master_epoch"]

    again = elect(hamq_cli, embedded, chosen["broker_id"])
    assert again.returncode == 1 and "CONTROLLER_MASTER_STILL_EXIST: " in again.stderr

    working_group(hamq_cli, embedded, first["broker_id"])  # it rejoined as a slave
    back = elect(hamq_cli, embedded, first["broker_id"])
    assert back.returncode == 0, back.stderr
    assert f"master {first['broker_id']} at {first['address']}" in back.stdout
    after = group_state(hamq_cli, embedded)
    assert after["master_id"] == first["broker_id"]
    assert after["master_epoch"] == info["master_epoch"] + 1


def test_clean_broker_metadata_forgets_a_dead_member(embedded, hamq_cli):
    """Last: it kills a slave for good."""
    group = group_state(hamq_cli, embedded)
    victim = next(m for m in group["members"] if m["broker_id"] != group["master_id"])
    pid = next(b["pid"] for b in embedded["brokers"] if b["address"] == victim["address"])
    os.kill(pid, signal.SIGKILL)

    def dead() -> bool:
        now = group_state(hamq_cli, embedded)
        return not next(m for m in now["members"] if m["broker_id"] == victim["broker_id"])["alive"]

    wait_for(dead, 30.0, "the controller to see the killed member dead")
    done = admin(
        hamq_cli,
        embedded,
        "clean-broker-metadata",
        "--broker-name",
        "broker-a",
        "--broker-ids",
        str(victim["broker_id"]),
    )
    assert done.returncode == 0, done.stderr
    assert f"forgot members {victim['broker_id']}" in done.stdout
    after = group_state(hamq_cli, embedded)
    assert victim["broker_id"] not in {m["broker_id"] for m in after["members"]}


def processes_under(path) -> list[int]:
    """PIDs of processes whose command line names ``path`` (servers started on it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as fh:
                if str(path).encode() in fh.read():
                    pids.append(int(entry))
    return pids


def test_bench_failover_times_each_kill_and_reads_every_ack_back(tmp_path, hamq_cli):
    """``hamq bench failover`` on its own ``hamq dev --mode controller``: one sample per
    kill -9 of the master, every acknowledged message read back at its offset, and no
    process left behind."""
    data = tmp_path / "bench"
    port_base = str(free_port_base(DEV_PORT_OFFSETS))
    done = hamq_cli(
        "bench", "failover", "--kills", "2", "--size", "128", "--data", str(data),
        "--port-base", port_base, "--json",
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["kills"] == 2 and len(result["samples_ms"]) == 2
    f = result["failover_ms"]
    assert 0 < f["min"] <= f["median"] <= f["max"] < 30_000
    assert result["acked"] > 0 and result["missing"] == 0 and result["mismatched"] == 0
    assert result["elections"] >= 2
    assert result["params"]["data"] == str(data)
    wait_for(lambda: not processes_under(data), 10.0, "the bench to stop what it started")


def test_bad_or_unreachable_controller_address_is_one_line(hamq_cli):
    """A malformed --controller is a usage error (exit 2); a controller nobody answers on
    is the client's error (exit 1); never a traceback."""
    dead = f"127.0.0.1:{free_port_base()}"
    for controllers, code, says in (
        ("nohost", 2, "must be HOST:PORT"),
        (" , ", 2, "at least one controller address"),
        (f"{dead},127.0.0.1:99999", 2, "must be HOST:PORT"),
        (dead, 1, "ConnectionLost"),
    ):
        done = hamq_cli("admin", "controller-metadata", "--controller", controllers)
        assert done.returncode == code, (controllers, done.stderr)
        assert says in done.stderr and "Traceback" not in done.stderr, (controllers, done.stderr)
