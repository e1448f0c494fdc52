"""Timeouts are measured on the monotonic clock (``hamq.clock``): a step of a server's wall
clock (NTP, a resumed VM) changes no timeout. The server's ``time.time`` is stepped through
``shifted_clock`` while it runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import hamq
from helpers import wait_for

NS_TIMEOUT_MS = 3000


def test_a_silent_broker_expires_on_time_after_the_name_servers_clock_steps_back(
    cluster_factory, tmp_path, monkeypatch
):
    """The name server's wall clock steps 60 s back just after a broker hangs: the broker is
    dropped after broker_not_active_timeout_ms (liveness on the wall clock kept it for the
    60 s of the step on top)."""
    shift = tmp_path / "clock_shift"
    shift.write_text("0")
    c = cluster_factory()
    with monkeypatch.context() as env:  # only the name server's clock is shifted
        env.setenv(
            "PYTHONPATH",
            os.pathsep.join(
                [str(Path(__file__).with_name("shifted_clock")), os.environ.get("PYTHONPATH", "")]
            ),
        )
        env.setenv("HAMQ_TEST_CLOCK_SHIFT_FILE", str(shift))
        c.start_namesrv(
            scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=NS_TIMEOUT_MS
        )
    broker = c.start_broker()
    with hamq.Admin(c.namesrv) as admin:

        def registered() -> bool:
            return bool(admin.cluster_info()["broker_addr_table"])

        wait_for(registered, 15, "the broker registered")
        os.kill(broker.pid, signal.SIGSTOP)  # hung: its connection stays open, no heartbeats
        try:
            shift.write_text("-60")
            wait_for(
                lambda: not registered(),
                NS_TIMEOUT_MS / 1000 + 10,
                "the hung broker dropped by the name server",
            )
        finally:
            os.kill(broker.pid, signal.SIGCONT)
