"""``hamq.cli.progress``: a bar on a terminal, and output unchanged when piped or with
--json. The shown case runs under a real pseudo-terminal."""

from __future__ import annotations

import subprocess
import sys

from pty_run import run_in_pty

CHILD = """
import sys, time
from hamq.cli.progress import progress
with progress(5, "copying mirrors", sys.argv[1] == "on") as advance:
    for _ in range(5):
        time.sleep(0.1)
        advance(1)
print("done")
"""
PTY_TIMEOUT_S = 30.0


def run_child(on_or_off: str) -> tuple[int, str]:
    return run_in_pty([sys.executable, "-c", CHILD, on_or_off], PTY_TIMEOUT_S)


def test_bar_is_drawn_on_a_terminal():
    code, drawn = run_child("on")
    assert code == 0
    assert "copying mirrors" in drawn
    assert "5/5" in drawn  # done of total, drawn at the end
    assert "done" in drawn


def test_no_bar_on_a_terminal_when_disabled():
    """--json: even on a terminal nothing but the command's own output."""
    code, drawn = run_child("off")
    assert code == 0
    assert "copying mirrors" not in drawn
    assert drawn.strip() == "done"


def test_no_bar_when_piped():
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "on"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0
    assert done.stdout == "done\n"
    assert done.stderr == ""
