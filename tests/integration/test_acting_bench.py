"""``hamq bench acting-master`` on a tiny backlog: it starts its own servers, kills A's
master, reports every measurement, finds each backlog message escaped to B exactly once,
and leaves no server running."""

from __future__ import annotations

import json

import pytest

from helpers import accepts, free_port_base

BACKLOG = 20
PORT_OFFSETS = (0, 10, 11, 20, 21, 30, 31)  # the name server, then each broker and its HA


@pytest.mark.slow
def test_acting_master_bench_measures_a_small_backlog(hamq_cli, tmp_path):
    base = free_port_base(PORT_OFFSETS)
    done = hamq_cli(
        "bench",
        "acting-master",
        "--escape-backlog",
        str(BACKLOG),
        "--port-base",
        str(base),
        "--data",
        str(tmp_path / "bench"),
        "--max-seconds",
        "60",
        "--broker-not-active-timeout-ms",
        "2000",
        "--scan-not-active-broker-interval-ms",
        "300",
        "--json",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)
    assert r["bench"] == "acting_master"
    assert r["acting_in_routes_ms"] is not None and r["acting_in_routes_ms"] > 0, r
    assert r["first_lock_ms"] is not None, r
    assert r["first_escaped_delay_ms"] is not None, r
    e = r["escape"]
    assert (e["stored_in_b"], e["distinct"], e["repeated"]) == (BACKLOG, BACKLOG, 0), r
    assert not any(accepts(f"127.0.0.1:{base + offset}") for offset in PORT_OFFSETS)
