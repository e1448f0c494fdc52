"""Clock jumps for the processes of one test host, through libfaketime.

A process started with ``env(host)`` has libfaketime preloaded and reads its wall-clock
offset from the host's faketime file on every time call (``FAKETIME_NO_CACHE=1``), so
``jump`` takes effect at once in every running process of that host. Only the wall clock
moves: ``CLOCK_MONOTONIC`` is left alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as a real
NTP step leaves it, so what the nemesis tests is hamq's use of wall time (store
timestamps, timers derived from them), not a broken kernel. The histories' clock is the
runner's own monotonic clock, which no jump touches.
"""

from __future__ import annotations

import os
from pathlib import Path

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
FAKETIME_FILE = "faketime"  # in the host's directory, beside its processes' logs


class ClockFaults:
    """The faketime file of every host of one run (``hosts/<host>/faketime``)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)

    def path(self, host: str) -> Path:
        return self.run_dir / "hosts" / host / FAKETIME_FILE

    def env(self, host: str) -> dict[str, str]:
        """libfaketime's variables for a process of ``host``. The preload itself comes from
        ``DiskFaults.env(host, clock=True)``: libfaketime, and before it the disk-fault shim,
        whose ``clock_nanosleep`` keeps ``time.sleep`` working (see fsync_shim.c)."""
        if not LIBFAKETIME.exists():
            raise FileNotFoundError(
                f"{LIBFAKETIME} is missing: install libfaketime (make chaos-deps) "
                "to run the clock nemesis"
            )
        path = self.path(host)
        if not path.exists():
            self.reset(host)
        return {
            "FAKETIME_TIMESTAMP_FILE": str(path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            # on by default for this glibc, the "monotonic fix" makes libfaketime's
            # pthread_cond_timedwait miss its wake-ups: a hand-off to a worker thread
            # (asyncio.to_thread, every fsync) took 60-170 ms instead of 0.3
            "FAKETIME_FORCE_MONOTONIC_FIX": "0",
        }

    def jump(self, host: str, seconds: float) -> None:
        """Set ``host``'s wall clock ``seconds`` away from the real time (negative: back)."""
        # libfaketime's relative offset: a sign, a number of seconds ("." is the decimal
        # point in the C locale the processes keep for numbers), and an optional unit
        self._write(host, f"{seconds:+g}s")

    def reset(self, host: str) -> None:
        self._write(host, "+0s")

    def _write(self, host: str, spec: str) -> None:
        path = self.path(host)
        path.parent.mkdir(parents=True, exist_ok=True)
        # write-then-rename: a process reading the file mid-write would see no offset
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(spec + "\n")
        os.replace(tmp, path)
