"""The ``hamq`` command as a user runs it: ``hamq dev --mode single`` starts a local cluster
and prints one JSON ready line naming its web console, which answers; topic create, produce
from stdin, consume and bench work against it; SIGTERM stops ``hamq dev`` together with its
children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hamq.cli.common import readable
from hamq.cli.dev_web import WEB_PORT_OFFSET
from helpers import dev_console_overview, free_port_base, pid_alive

READY_TIMEOUT_S = 60.0  # the name server starts the web console too (FastAPI): slow when loaded
BROKER_PORT_OFFSET = 1035  # hamq dev: the broker listens on port-base + 1035
BENCH_KEYS = {"msgs_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "params"}


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


@pytest.fixture
def dev_cluster(tmp_path):
    """``hamq dev`` running; yields (Popen, ready dict). Everything it started is killed
    by PID at the end, whatever the test did."""
    base = free_port_base([WEB_PORT_OFFSET, BROKER_PORT_OFFSET, BROKER_PORT_OFFSET + 1])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hamq.cli.main",
            "dev",
            "--mode",
            "single",
            "--data",
            str(tmp_path / "dev"),
            "--port-base",
            str(base),
        ],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "dev.stderr", "wb"),  # noqa: SIM115 (the child holds it)
        start_new_session=True,
        env={**os.environ, "HAMQ_LOG_LEVEL": "WARNING"},
    )
    ready: dict = {}
    try:
        assert readable(proc.stdout, READY_TIMEOUT_S), "hamq dev printed nothing in time"
        ready = json.loads(proc.stdout.readline())
        assert ready["namesrv"] == f"127.0.0.1:{base}"
        yield proc, ready
    finally:
        children = [ready.get("namesrv_pid")] + [b.get("pid") for b in ready.get("brokers", [])]
        for pid in [proc.pid] + [p for p in children if p]:
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait(10)


def test_dev_topic_produce_consume_bench_and_sigterm(dev_cluster, hamq_cli):
    proc, ready = dev_cluster
    assert ready["event"] == "ready"
    [broker] = ready["brokers"]
    assert broker["address"].endswith(str(int(ready["namesrv"].split(":")[1]) + 1035))
    child_pids = [ready["namesrv_pid"], broker["pid"]]
    assert all(pid_alive(p) for p in child_pids)
    [group] = dev_console_overview(ready)["groups"]
    assert group["broker_name"] == "broker-a" and group["master_address"] == broker["address"]
    ns = ["--namesrv", ready["namesrv"]]

    created = hamq_cli("topic", "create", "CliT", "--queues", "2", "--json", *ns)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {"topic": "CliT", "queues": 2, "brokers": ["broker-a"]}

    produced = hamq_cli("produce", "CliT", "--json", *ns, input="hello\nworld\n")
    assert produced.returncode == 0, produced.stderr
    sends = [json.loads(line) for line in produced.stdout.splitlines()]
    assert [s["status"] for s in sends] == ["SEND_OK", "SEND_OK"]

    consumed = hamq_cli(
        "consume",
        "CliT",
        "--group",
        "g",
        "--from-beginning",
        "--max",
        "2",
        "--timeout",
        "20",
        "--json",
        *ns,
    )
    assert consumed.returncode == 0, consumed.stderr
    messages = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert sorted(m["body"] for m in messages) == ["hello", "world"]
    assert all(m["topic"] == "CliT" for m in messages)

    bench = hamq_cli(
        "bench",
        "produce",
        "--count",
        "2000",
        "--size",
        "100",
        "--batch",
        "50",
        "--topic",
        "BenchT",
        "--max-seconds",
        "30",
        "--json",
        *ns,
    )
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout)
    assert result.keys() >= BENCH_KEYS
    assert result["messages"] == 2000 and result["errors"] == 0
    assert result["msgs_per_s"] > 0 and result["p50_ms"] <= result["p99_ms"] <= result["p999_ms"]
    assert result["params"]["count"] == 2000

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert wait_gone(child_pids, 5.0) == [], "hamq dev left children running"


@pytest.mark.parametrize("count", [2000, 10])
def test_bench_produce_sends_exactly_count_messages(cluster, hamq_cli, count):
    """--count is a number of messages, whatever the batch size."""
    bench = hamq_cli(
        "bench",
        "produce",
        "--count",
        str(count),
        "--size",
        "10",
        "--json",
        "--max-seconds",
        "30",
        "--namesrv",
        cluster.namesrv,
    )
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["messages"] == count


def test_cluster_shows_each_members_role_services(cluster, hamq_cli):
    """``hamq cluster status`` names the master's running role services and its epoch, so an
    operator sees that a role change took effect."""
    result = hamq_cli("cluster", "status", "--namesrv", cluster.namesrv, timeout=30)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if " id=0 " in line)
    assert "role=master" in line or "role=sync_master" in line or "role=async_master" in line
    assert "epoch=" in line and "services=" in line
    assert "delay_delivery" in line and "transaction_check" in line, line


def test_tool_errors_are_one_clear_line_and_exit_1(cluster, hamq_cli):
    """An unknown topic or an unreachable name server: exit code 1 and the error class with
    its message on stderr, never a traceback."""
    dead = ["--namesrv", f"127.0.0.1:{free_port_base()}"]
    cases = [
        (("produce", "NoSuchTopic", "--namesrv", cluster.namesrv), "TopicNotExist"),
        (("consume", "NoSuchTopic", "-g", "g", "--namesrv", cluster.namesrv), "TopicNotExist"),
        (("topic", "create", "T", *dead), "ConnectionLost"),
        (("bench", "produce", "--count", "10", *dead), "ConnectionLost"),
    ]
    for args, error in cases:
        result = hamq_cli(*args, input="x\n", timeout=30)
        assert result.returncode == 1, (args, result.stderr)
        assert error in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
