"""Timer delivery in one process, over a real store on a virtual clock: a second holding
more timers than a window (4,096), stopped cleanly mid-window, is delivered exactly once
after the restart; killed mid-window (nothing saved), at least once; and the first window
comes in due order."""

from __future__ import annotations

import asyncio
import random

import pytest

from hamq.broker.escape import EscapeBridge
from hamq.broker.role import BrokerRole, RoleState
from hamq.broker.schedule.service import ScheduleMessageService
from hamq.broker.schedule.timer_wheel import WINDOW
from hamq.broker.stored_message import read_messages
from hamq.broker.topics import TopicService
from hamq.config import BrokerConfig
from hamq.protocol.properties import PROPERTY_TIMER_DELIVER_MS
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore

TOPIC = "T"
T0 = 1_700_000_000_000
COUNT = WINDOW + 1904  # two windows in one second
WAIT_S = 30.0


class Broker:
    """The store and the schedule service as the broker wires them, on ``clock``."""

    def __init__(self, root, clock: list[int]) -> None:
        config = BrokerConfig(store_dir=str(root))
        self.store = MessageStore(config, lambda: clock[0])
        role = RoleState(BrokerRole.MASTER, 0)
        topics = TopicService(
            self.store,
            role,
            default_queue_nums=1,
            auto_create=False,
            on_change=lambda: None,
        )
        if self.store.topics.get(TOPIC) is None:
            topics.create(TOPIC, 1, 1, 6, notify=False)
        self.schedule = ScheduleMessageService(
            self.store,
            FlushService(self.store),
            role,
            EscapeBridge(config),
            on_put=lambda topic, queue_id: None,
            after_put=self.store.commit,
            flush_interval_ms=10**6,
        )
        self.schedule.start()
        self.schedule.start_delivery()

    def delivered(self) -> list[str]:
        """Bodies stored in the real topic, in order."""
        found = read_messages(self.store, TOPIC, 0, 0, 2 * COUNT)
        return [m.body.decode() for m in found]

    async def wait_delivered(self, count: int) -> None:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while self.store.max_offset(TOPIC, 0) < count:
            assert asyncio.get_running_loop().time() < deadline, "timers not delivered"
            await asyncio.sleep(0.005)


async def send_and_stop_mid_window(root, clock: list[int], clean: bool) -> dict[str, int]:
    broker = Broker(root, clock)
    rng = random.Random(7)
    dues = {f"m{i}": T0 + 5000 + rng.randrange(1000) for i in range(COUNT)}
    for body, due in dues.items():
        broker.schedule.put_message(
            TOPIC, 0, {PROPERTY_TIMER_DELIVER_MS: str(due)}, body.encode(), 0
        )
    broker.store.commit()
    clock[0] = T0 + 6000  # the whole second is due: delivered 256 per wake-up
    await broker.wait_delivered(1000)
    first = broker.delivered()
    assert [dues[b] for b in first] == sorted(dues[b] for b in first)  # due order
    if clean:
        await broker.schedule.stop()
        broker.store.close()
    else:  # kill -9: nothing saved; the page cache keeps what was written
        broker.schedule.timers.stop()
    return dues


@pytest.mark.parametrize("clean", [True, False])
def test_a_second_of_more_than_a_window_is_delivered_across_a_restart(tmp_path, clean):
    async def scenario() -> None:
        clock = [T0]
        dues = await send_and_stop_mid_window(tmp_path, clock, clean)
        broker = Broker(tmp_path, clock)
        await broker.wait_delivered(COUNT)
        await asyncio.sleep(0.1)  # anything delivered twice would come now
        got = broker.delivered()
        assert set(got) == dues.keys()
        if clean:
            assert len(got) == COUNT  # once
        await broker.schedule.stop()
        broker.store.close()

    asyncio.run(scenario())
