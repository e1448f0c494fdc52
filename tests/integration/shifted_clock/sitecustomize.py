"""Loaded at start-up by a server process started with this directory on PYTHONPATH: its
wall clock (``time.time``) runs ``HAMQ_TEST_CLOCK_SHIFT_FILE``'s seconds ahead, read on
every call, so a test can step the clock of a running server as NTP would. Monotonic
clocks are left alone."""

import os
import time

_SHIFT_FILE = os.environ.get("HAMQ_TEST_CLOCK_SHIFT_FILE")

if _SHIFT_FILE:
    _real_time, _real_time_ns = time.time, time.time_ns

    def _shift_s() -> float:
        try:
            with open(_SHIFT_FILE) as f:
                return float(f.read() or 0)
        except (OSError, ValueError):
            return 0.0

    time.time = lambda: _real_time() + _shift_s()
    time.time_ns = lambda: _real_time_ns() + int(_shift_s() * 1e9)
