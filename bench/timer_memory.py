"""Broker memory with many pending timer messages (issue 11, item 13).

    hamq dev --mode single --port-base 19976 &    # any running cluster
    HAMQ_NAMESRV=127.0.0.1:19976 .venv/bin/python bench/timer_memory.py [--count 1000000]

1. topic TimerMemory (1 queue): ``--count`` timer messages (``deliver_time_ms``) of 100
   bytes, due spread evenly from one hour to three days (RocketMQ's timerMaxDelaySec)
   ahead, so none is delivered during the run: all of them are pending;
2. prints one JSON line: send rate, and the broker's resident memory (VmRSS of the pid from
   GET_BROKER_RUNTIME_INFO) before the sends and after them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from pop_poison import broker_pid, rss_mb  # bench/ is the script's directory

from hamq import Message
from hamq.client.admin import AsyncAdmin
from hamq.client.producer import AsyncProducer

TOPIC = "TimerMemory"
IN_FLIGHT = 2048  # sends awaiting their answer
BODY = b"x" * 100
FIRST_DUE_MS = 3600 * 1000
LAST_DUE_MS = 3 * 24 * 3600 * 1000 - 60 * 1000  # a minute of slack under the 3-day limit


async def send_timers(namesrv: str, count: int) -> tuple[int, float]:
    """Send ``count`` timer messages; returns (sent without error, seconds)."""
    producer = AsyncProducer(namesrv)
    await producer.warm_up(TOPIC)
    sent = answered = errors = 0
    done = asyncio.Event()
    room = asyncio.Event()
    room.set()

    def on_sent(_result, err) -> None:
        nonlocal answered, errors
        answered += 1
        errors += err is not None
        if answered >= count:
            done.set()
        if sent - answered < IN_FLIGHT // 2:
            room.set()

    started = time.perf_counter()
    now = int(time.time() * 1000)
    step = (LAST_DUE_MS - FIRST_DUE_MS) / max(1, count)
    try:
        while sent < count:
            if sent - answered >= IN_FLIGHT:
                room.clear()
                await room.wait()
            due = now + FIRST_DUE_MS + int(sent * step)
            producer.send_async(Message(TOPIC, BODY, deliver_time_ms=due), on_sent)
            sent += 1
            if sent % 512 == 0:
                await asyncio.sleep(0)  # let answers in
        await done.wait()
    finally:
        elapsed = time.perf_counter() - started
        await producer.close()
    return answered - errors, elapsed


async def main(namesrv: str, count: int) -> dict:
    admin = AsyncAdmin(namesrv)
    try:
        await admin.create_topic(TOPIC, 1)
        pid = await broker_pid(admin)
        before = rss_mb(pid)
        sent, elapsed = await send_timers(namesrv, count)
        await asyncio.sleep(2.0)  # anything the broker does after the last answer
        after = rss_mb(pid)
    finally:
        await admin.close()
    return {
        "pending_timers": sent,
        "seconds": round(elapsed, 2),
        "send_msgs_per_s": round(sent / elapsed),
        "broker_rss_mb_before": round(before),
        "broker_rss_mb_after": round(after),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    args = parser.parse_args()
    print(
        json.dumps(asyncio.run(main(os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876"), args.count)))
    )
