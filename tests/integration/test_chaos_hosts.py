"""The chaos suite's hosts on real namespaces: real processes, real sockets, real cuts.

A TCP echo server runs inside host A on A's address; clients in other hosts and in the
root namespace (where the runner's clients live) talk to it before, during and after a
partition and an isolation, and after ``close`` nothing of the run is left in ``ip``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from hamq.chaos.hosts import HostsError, NetnsHosts, make_hosts, netns_available, remove_stale
from helpers import wait_for

pytestmark = pytest.mark.skipif(not netns_available(), reason="needs `ip netns` (root)")

PORT = 7000
CONNECT_TIMEOUT_S = 1.5
ECHO = textwrap.dedent("""
    import socket, sys, threading
    server = socket.create_server((sys.argv[1], int(sys.argv[2])))
    def echo(conn):
        while data := conn.recv(1024):
            conn.sendall(data)
    while True:
        threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
""")
# One round trip on a new connection; exit 0 when echoed, 1 with the error otherwise.
PROBE = textwrap.dedent("""
    import socket, sys
    try:
        address, timeout = (sys.argv[1], int(sys.argv[2])), float(sys.argv[3])
        with socket.create_connection(address, timeout=timeout) as c:
            c.sendall(b"ping")
            sys.exit(0 if c.recv(4) == b"ping" else 1)
    except OSError as exc:
        print(type(exc).__name__, exc)
        sys.exit(1)
""")
# Holds one connection open: a round trip whenever a line arrives on stdin.
HOLD = textwrap.dedent("""
    import socket, sys
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    for _ in sys.stdin:
        try:
            c.sendall(b"ping")
            print("ok" if c.recv(4) == b"ping" else "bad", flush=True)
        except OSError as exc:
            print(type(exc).__name__, flush=True)
""")


@pytest.fixture
def hosts():
    made = make_hosts("test-chaos-hosts")
    assert isinstance(made, NetnsHosts)
    yield made
    made.close()


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def reaches(argv_prefix: list[str], address: str) -> bool:
    done = subprocess.run(
        [*argv_prefix, sys.executable, "-c", PROBE, address, str(PORT), str(CONNECT_TIMEOUT_S)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


def root_reaches(address: str) -> bool:
    try:
        with socket.create_connection((address, PORT), timeout=CONNECT_TIMEOUT_S) as conn:
            conn.sendall(b"ping")
            return conn.recv(4) == b"ping"
    except OSError:
        return False


def owned_names(prefix: str) -> list[str]:
    text = subprocess.run(
        "ip netns list; ip -o link show", shell=True, capture_output=True, text=True, check=True
    ).stdout
    return [word for word in text.split() if prefix in word]


def test_partition_cuts_hosts_both_ways_but_not_the_runner_or_bystanders(hosts, processes):
    a, b, c = hosts.add("a"), hosts.add("b"), hosts.add("c")
    assert len({a.address, b.address, c.address, hosts.client_address}) == 4
    with pytest.raises(HostsError, match="two sides"):
        hosts.partition([{"a", "b"}, {"b"}])
    with pytest.raises(HostsError, match="no host 'z'"):
        hosts.partition([{"a"}, {"z"}])
    server = [sys.executable, "-c", ECHO, a.address, str(PORT)]
    processes.append(subprocess.Popen(hosts.command("a", server)))
    wait_for(lambda: root_reaches(a.address), 20, "the echo server in host a")
    assert reaches(hosts.command("b", []), a.address)
    hold = subprocess.Popen(
        hosts.command("b", [sys.executable, "-c", HOLD, a.address, str(PORT), "2"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    processes.append(hold)
    hold.stdin.write("\n")
    hold.stdin.flush()
    assert hold.stdout.readline().strip() == "ok"

    hosts.partition([{"a"}, {"b"}])
    assert not reaches(hosts.command("b", []), a.address)  # a new connect times out
    hold.stdin.write("\n")
    hold.stdin.flush()
    assert hold.stdout.readline().strip() == "TimeoutError"  # the open one stalls
    assert reaches(hosts.command("c", []), a.address)  # a host on no side keeps its links
    assert root_reaches(a.address)  # the runner's clients reach every host

    hosts.heal()
    assert reaches(hosts.command("b", []), a.address)

    hosts.isolate("a")
    assert not root_reaches(a.address)
    assert not reaches(hosts.command("c", []), a.address)
    hosts.heal()
    wait_for(lambda: root_reaches(a.address), 10, "host a back after the isolation")


def test_close_leaves_nothing_and_a_killed_runs_leftovers_are_removed(hosts):
    hosts.add("a")
    assert owned_names(hosts.prefix)
    hosts.close()
    hosts.close()  # idempotent
    assert owned_names(hosts.prefix) == []

    # A run SIGKILLed after making its hosts cannot clean up; the next run does.
    child = subprocess.Popen([sys.executable, "-c", CRASHED_RUN], stdout=subprocess.PIPE, text=True)
    prefix = child.stdout.readline().strip()
    try:
        assert prefix and owned_names(prefix)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    remove_stale()
    assert owned_names(prefix) == []


CRASHED_RUN = textwrap.dedent("""
    import time
    from hamq.chaos.hosts import NetnsHosts
    hosts = NetnsHosts("crashed")
    hosts.add("a")
    print(hosts.prefix, flush=True)
    time.sleep(60)
""")
