"""The process's clocks, in one place, because using the wrong one is a bug that shows only
when the wall clock steps (NTP, a resumed VM, an operator's ``date -s``):

- ``monotonic_s`` / ``monotonic_ms``: timeouts, deadlines, leases, periods — anything
  measured from now. It never steps, so a jump neither lapses every timer at once nor
  keeps a silent peer alive.
- ``wall_ms``: only timestamps that are stored or sent (store and born times, a delay
  message's delivery time, file retention), which must mean the same on another machine and
  after a restart.

The sans-IO cores (``raft/``, ``replication/``) read no clock: their drivers pass
``monotonic_ms()`` in. The store takes its wall clock as an argument (``MessageStore``'s
``clock_ms``) so tests can run it on a virtual one.
"""

from __future__ import annotations

import time

# The builtin itself: a wrapper would cost a call on every request's deadline.
monotonic_s = time.monotonic


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    # time.time_ns is looked up at each call: tests step a server's wall clock by replacing it
    # (tests/integration/shifted_clock).
    return time.time_ns() // 1_000_000
