"""Plain helpers shared by test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import time
import urllib.request
from collections.abc import Iterable

import hamq
from hamq.errors import TopicNotExist

_HANDED_OUT: set[int] = set()  # ports free_port gave this process
# Ports are handed out below Linux's ephemeral range (32768 up), where outgoing connections
# take their local ports (one took a server's port between the check and its bind), in one
# slice per pytest-xdist worker (PYTEST_XDIST_WORKER = gw0, gw1, ...; a run without xdist
# has the first), so the workers never pick the same port.
QUIET_PORTS = range(10000, 32768)
PORT_SLICES = 5
_RANDOM = random.Random()  # not the global one, which tests seed


def _port_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") else 0
    width = len(QUIET_PORTS) // PORT_SLICES
    start = QUIET_PORTS.start + index % PORT_SLICES * width
    return range(start, start + width)


def free_port(headroom: int = 0) -> int:
    """A port free right now that this process was not given before (with ``headroom``
    ports above it still in this process's slice): a cluster's ports are all picked before
    its servers bind them, and one port given twice once failed a config check."""
    ports = _port_slice()
    for _ in range(1000):
        port = _RANDOM.randrange(ports.start, ports.stop - headroom)
        if port not in _HANDED_OUT and _bindable(port):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no port left in {ports} that this process was not given before")


def free_port_base(offsets: Iterable[int] = ()) -> int:
    """A port B such that B and B + each offset can be bound on 127.0.0.1 right now
    (``hamq dev`` lays its servers out from its --port-base)."""
    offsets = list(offsets)
    for _ in range(100):
        base = free_port(headroom=max(offsets, default=0))
        if all(_bindable(base + offset) for offset in offsets):
            return base
    raise RuntimeError(f"no free port base for offsets {sorted(offsets)}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def accepts(address: str) -> bool:
    """Something listens on ``address`` (HOST:PORT)."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


def wait_for(predicate, timeout_s: float, what: str):
    """Poll ``predicate`` until it returns something truthy (returned), or fail naming
    ``what``; bounded, so a broken cluster fails the test instead of hanging it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def until(predicate, timeout_s: float, what: str) -> None:
    """``wait_for`` inside an event loop: poll ``predicate`` until true, or fail naming
    ``what``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


def topic_routed(admin: hamq.Admin, topic: str) -> bool:
    """Whether the name servers route ``topic`` yet (a predicate for ``wait_for``)."""
    try:
        return bool(admin.topic_route(topic).read_queues)
    except TopicNotExist:
        return False


def send_and_pull(namesrv: str, topic: str) -> None:
    """A real producer and consumer still work end to end (after a server faced abuse)."""
    with hamq.Producer(namesrv) as producer:
        result = producer.send(hamq.Message(topic, b"still served"))
    with hamq.PullConsumer("g-check", namesrv) as consumer:
        pulled = consumer.pull(result.queue, result.queue_offset, 1)
    assert [m.body for m in pulled.messages] == [b"still served"]


def scrape_metrics(addr: str) -> dict[str, float]:
    """The samples a server's ``metrics_listen`` serves, by name."""
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def dev_console_overview(ready: dict) -> dict:
    """The web console a ``hamq dev`` ready line names is its first name server's, at port
    base + WEB_PORT_OFFSET, and answers ``GET /api/overview`` with 200 and JSON (returned)."""
    from hamq.cli.dev_web import WEB_PORT_OFFSET

    port_base = int(ready["namesrv"].split(";")[0].rpartition(":")[2])
    listen = f"127.0.0.1:{port_base + WEB_PORT_OFFSET}"
    assert ready["web"] == {"url": f"http://{listen}/", "listen": listen}
    with urllib.request.urlopen(f"{ready['web']['url']}api/overview", timeout=10) as response:
        assert response.status == 200
        assert response.headers.get_content_type() == "application/json"
        return json.loads(response.read())


def read_queue(store, topic: str, queue_id: int = 0) -> dict[int, bytes]:
    """Every message a store serves from one queue, by queue offset (for recovery tests)."""
    from hamq.protocol.message import decode_records
    from hamq.store.message_store import GetStatus

    offset, got = store.min_offset(topic, queue_id), {}
    while True:
        r = store.get_messages(topic, queue_id, offset, 32, 1 << 20)
        if r.status is not GetStatus.FOUND:
            return got
        got.update(
            decode_records(r.records, offset, lambda h, index, off, props, body: (off, body))
        )
        offset = r.next_begin_offset


def assert_config_refused(result, expected: str) -> None:
    """A ``hamq`` command refused its config as the user must see it: exit code 2, one line
    ``config error: <expected>`` on stderr, no traceback, nothing on stdout."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [f"config error: {expected}"], result.stderr
    assert result.stdout == ""
