"""Until the security issue brings identities, the management API lets everyone in; a real
``hamq web`` says so when it starts, naming where it listens, before its ready line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from helpers import free_port


def test_hamq_web_says_at_start_that_it_has_no_authentication():
    listen = f"127.0.0.1:{free_port()}"
    web = subprocess.Popen(
        [sys.executable, "-m", "hamq.cli.main", "web", "--listen", listen],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HAMQ_CONTROLLER": f"127.0.0.1:{free_port()}"},
    )
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = web.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("{"):
                break
        assert lines and json.loads(lines[-1])["listen"] == listen, lines
        notices = [line for line in lines if "no authentication yet" in line]
        assert len(notices) == 1, lines
        assert "WARNING" in notices[0] and f"anyone who can reach {listen}" in notices[0]
    finally:
        web.send_signal(signal.SIGINT)
        try:
            web.wait(timeout=30)
        except subprocess.TimeoutExpired:
            web.kill()
            web.wait()
