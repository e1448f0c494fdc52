"""Shared fixtures: real hamq processes on loopback with ports chosen at run time.

Every process a test starts is stopped by its PID (SIGTERM, then SIGKILL) when the test
ends, whatever happened in it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # test modules import helpers.py, harness.py
from harness import Cluster


@pytest.fixture
def cluster_factory(tmp_path):
    """An empty cluster: the test starts what it needs; everything is stopped afterwards."""
    clusters: list[Cluster] = []

    def make() -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(clusters)}")
        c.root.mkdir()
        clusters.append(c)
        return c

    yield make
    for c in clusters:
        c.stop_all()


@pytest.fixture
def cluster(cluster_factory) -> Cluster:
    """One name server and one broker (async flush) with fast liveness settings."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    c.start_broker()
    return c
