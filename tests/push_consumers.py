"""Push consumers for tests: settings that make rebalances, heartbeats and commits happen
within a second, and a one-call start."""

from __future__ import annotations

import hamq

FAST = dict(
    heartbeat_interval_s=0.5,
    rebalance_interval_s=1.0,
    persist_offset_interval_s=0.5,
    pull_suspend_ms=500,
    consume_from_where="first",
)


def start_consumer(
    namesrv: str, group: str, topic: str, listener, expression: str = "*", **kw
) -> hamq.PushConsumer:
    consumer = hamq.PushConsumer(group, namesrv, **{**FAST, **kw})
    consumer.subscribe(topic, expression)
    consumer.register_message_listener(listener)
    consumer.start()
    return consumer
