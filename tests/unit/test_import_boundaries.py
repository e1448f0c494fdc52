"""The sans-IO parts load without the asyncio shell: the simulator and tools import them
alone, and a core that pulled in an event loop would stop being sans-IO unnoticed."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hamq


@pytest.mark.parametrize(
    "module",
    [
        "hamq.broker.dledger.wire",
        "hamq.controller.apply",
        "hamq.controller.codec",
        "hamq.controller.core",
        "hamq.controller.decide",
        "hamq.controller.liveness",
        "hamq.protocol.address",
        "hamq.protocol.controller",
        "hamq.protocol.frame",
        "hamq.protocol.message",
        "hamq.raft",
        "hamq.replication.consistent_point",
        "hamq.replication.master",
        "hamq.replication.slave",
    ],
)
def test_sans_io_module_loads_without_asyncio(module):
    probe = (
        f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('asyncio')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", f"{module} loads asyncio: {out.stdout}"


def test_the_client_facade_still_loads_on_first_use():
    from hamq import Message, SendStatus

    assert hamq.Producer.__module__ == "hamq.client.sync"
    assert Message.__module__ == "hamq.client.message" and SendStatus.SEND_OK
    assert "Producer" in dir(hamq) and set(hamq.__all__) <= set(dir(hamq))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = hamq.Nope
