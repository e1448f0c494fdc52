"""Runs a command on a real pseudo-terminal, as a person at a terminal would (progress bars
are drawn only there)."""

from __future__ import annotations

import os
import pty
import subprocess
import time

from hamq.cli.common import readable


def run_in_pty(args: list[str], timeout_s: float, env: dict | None = None) -> tuple[int, str]:
    """``args`` with stdout and stderr on one pseudo-terminal: (exit code, all it wrote).
    Killed (by its PID) if it outlives ``timeout_s``."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", **(env or {})},
    )
    os.close(follower)
    seen = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not readable(leader, 0.1):
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
        if proc.poll() is None and time.monotonic() >= deadline:
            proc.kill()
    return proc.wait(timeout_s), seen.decode(errors="replace")
