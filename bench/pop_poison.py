"""Pop throughput with a poison message present, and what the broker keeps for the acks
behind it (issue 11, item 12).

    hamq dev --mode single &    # any running cluster
    HAMQ_NAMESRV=127.0.0.1:9876 .venv/bin/python bench/pop_poison.py [--count 3000000]

1. topic PopPoison (1 queue): one message "poison", then ``--count`` small messages
   (``hamq bench produce``, 100-byte bodies);
2. a pop consumer (4 pops of 256 in flight, each message acked with ``ack_async``) acks
   everything but the poison message, whose invisible time (60 s) outlasts the run, so it
   pins the queue's consume offset the whole time — the worst case for the broker's state;
3. prints one JSON line: pop+ack msgs/s, and the broker's resident memory (VmRSS of the pid
   from GET_BROKER_RUNTIME_INFO) before and after the acks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hamq import Message
from hamq.client.admin import AsyncAdmin
from hamq.client.producer import AsyncProducer
from hamq.client.simple import AsyncSimpleConsumer

TOPIC = "PopPoison"
POISON = b"poison"
POP_BATCH = 256
RECEIVERS = 4
INVISIBLE_S = 60.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def broker_pid(admin: AsyncAdmin) -> int:
    (addr,) = (await admin.master_addrs()).values()
    return (await admin.broker_runtime_info(addr))["pid"]


async def pop_all_but_poison(namesrv: str, count: int, max_seconds: float) -> tuple[int, float]:
    """Pop until ``count`` messages besides the poison were acked; returns (acked without
    error, seconds)."""
    consumer = AsyncSimpleConsumer(
        f"pop_poison_{int(time.time())}", namesrv, {TOPIC: "*"}, await_duration_s=0
    )
    acked = received = errors = 0
    done = asyncio.Event()

    def on_ack(err) -> None:
        nonlocal acked, errors
        acked += 1
        errors += err is not None
        if acked >= count:
            done.set()

    async def receiver() -> None:
        nonlocal received
        while received < count and not done.is_set():
            for message in await consumer.receive(POP_BATCH, INVISIBLE_S):
                if message.body != POISON:
                    received += 1
                    consumer.ack_async(message, on_ack)
            while received - acked > 8192:  # bounded acks in flight
                await asyncio.sleep(0.001)

    await consumer.start()
    started = time.perf_counter()
    try:
        await asyncio.wait_for(
            asyncio.gather(*(receiver() for _ in range(RECEIVERS)), done.wait()), max_seconds
        )
    finally:
        elapsed = time.perf_counter() - started
        await consumer.close()
    return acked - errors, elapsed


async def main(namesrv: str, count: int, max_seconds: float) -> dict:
    admin = AsyncAdmin(namesrv)
    try:
        await admin.create_topic(TOPIC, 1)
        pid = await broker_pid(admin)
    finally:
        await admin.close()
    producer = AsyncProducer(namesrv)
    try:
        await producer.send(Message(TOPIC, POISON))
    finally:
        await producer.close()
    subprocess.run(  # noqa: ASYNC221 (the bench's last step; nothing else runs)
        [
            sys.executable,
            "-m",
            "hamq.cli.main",
            "bench",
            "produce",
            "--count",
            str(count),
            "--size",
            "100",
            "--queues",
            "1",
            "--topic",
            TOPIC,
            "--max-seconds",
            str(max_seconds),
            "--namesrv",
            namesrv,
            "--json",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    before = rss_mb(pid)
    acked, elapsed = await pop_all_but_poison(namesrv, count, max_seconds)
    await asyncio.sleep(2.0)  # a revive checkpoint or two after the last ack
    return {
        "acked": acked,
        "seconds": round(elapsed, 2),
        "pop_ack_msgs_per_s": round(acked / elapsed),
        "broker_rss_mb_before": round(before),
        "broker_rss_mb_after": round(rss_mb(pid)),
        "poison_message": "never acked",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3_000_000)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    args = parser.parse_args()
    namesrv = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876")
    print(json.dumps(asyncio.run(main(namesrv, args.count, args.max_seconds))))
