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

# Directories whose modules share a session-scoped fixture (one web cluster, one Spark JVM):
# under pytest-xdist they run on one worker, so it is started once, not on each worker.
SESSION_SHARED_DIRS = ("web", "spark")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with the directories above as one unit each (every other module is
    one, so its module-scoped cluster starts once). Not ``loadgroup``: pytest 9 computes
    ``nodeid`` from ``_id``, and xdist 3.8 still marks groups by rewriting ``_nodeid``."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedSessionScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("/", 2)  # tests, directory, the rest
            if len(parts) == 3 and parts[1] in SESSION_SHARED_DIRS:
                return "/".join(parts[:2])
            return super()._split_scope(nodeid)

    return SharedSessionScheduling(config, log)


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
