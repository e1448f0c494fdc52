"""Plain helpers shared by test modules (fixtures live in conftest.py)."""
from __future__ import annotations

import socket
import time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
