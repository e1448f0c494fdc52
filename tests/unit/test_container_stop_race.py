"""A member asked for while the container stops (an ADD_BROKER read before the port
closed, waiting for the member being stopped) is refused, not started after every other
member stopped and the shared connections closed: nothing would ever stop it, and its
ports and store lock stayed taken for the rest of the process."""

from __future__ import annotations

import asyncio

import pytest

from hamq.broker.container import BrokerContainer
from hamq.config import BrokerConfig, ContainerConfig
from hamq.errors import HamqError
from helpers import free_port


def test_an_add_queued_behind_the_stop_is_refused(tmp_path):
    namesrv = f"127.0.0.1:{free_port()}"  # none listens: registration is retried meanwhile
    container = BrokerContainer(
        ContainerConfig(listen=f"127.0.0.1:{free_port()}", namesrv=(namesrv,))
    )
    member = BrokerConfig(
        broker_name="late",
        listen=f"127.0.0.1:{free_port()}",
        namesrv=(namesrv,),
        store_dir=str(tmp_path / "late"),
    )

    async def scenario() -> None:
        await container.start([])
        async with container._changing:  # a member is being stopped: both wait for it
            stop = asyncio.ensure_future(container.stop())
            await asyncio.sleep(0.1)  # the stop closed the port and waits its turn
            add = asyncio.ensure_future(container.add(member))
            await asyncio.sleep(0.1)
        await asyncio.wait_for(stop, 30)
        with pytest.raises(HamqError, match="stop"):
            await asyncio.wait_for(add, 30)
        assert container.brokers == {}

    asyncio.run(scenario())
