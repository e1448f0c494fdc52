"""Sync throughput of a new mirror (issue 16, seed 003): how fast SYNC_QUEUE copies a
group's history to a mirror that joined at the tail, while a producer keeps sending.

    .venv/bin/python bench/mirror_sync.py [--mb 200] [--batch-size 4096] [--per-record 64]

1. a name server with the controller embedded and member m1 (controller mode, all-ack);
   ``--mb`` of 1 KiB messages published to topic MirrorSync (batches of ``--per-record``
   messages: one record each), no consumer group: the whole history is needed;
2. member m2 joins with ``ha_join = "tail"`` (unsynchronised); a producer starts sending
   1 KiB messages one at a time; SYNC_QUEUE {batch_size} to m1;
3. prints one JSON line once m2 is synchronised: bytes synced, seconds from the request
   (the mirror reconnects 0.5 s after it, counted), MB/s, and the producer's sends per
   second during the sync, the mirror's CPU seconds per GB synced, the 1-minute load
   average before and after it. Processes run
   on 127.0.0.1 under a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))  # the test harness

import hamq
from hamq import Message, SendStatus
from hamq.client.producer import AsyncProducer
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode
from harness import Cluster

TOPIC = "MirrorSync"
BODY = bytes(1024)
IN_FLIGHT = 32  # batches awaiting their answer
MEMBER = {
    "broker_name": "mirror-bench",
    "enable_controller_mode": True,
    "all_ack_in_sync_state_set": True,
    "controller_heartbeat_interval_ms": 300,
    "broker_heartbeat_interval_ms": 300,
    "sync_broker_metadata_period_ms": 500,
    "check_sync_state_set_period_ms": 200,
    "flush_disk_type": "async",
}


async def preload(namesrv: str, messages: int, per_record: int) -> None:
    producer = AsyncProducer(namesrv)
    await producer.warm_up(TOPIC)
    room = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        try:
            await producer.send_batch([Message(TOPIC, BODY)] * per_record)
        finally:
            room.release()

    tasks = []
    for _ in range(messages // per_record):
        await room.acquire()
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    await producer.close()


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far (user + system): what the mirror spends per byte synced,
    which, unlike MB/s, the other work on a shared machine does not change much."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--per-record", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        c = Cluster(Path(root))
        try:
            c.start_namesrv(enable_controller_in_namesrv=True)
            c.start_broker("m1", controller_addr=c.namesrv_addrs, **MEMBER)
            run(c, args)
        finally:
            c.stop_all()


def run(c: Cluster, args: argparse.Namespace) -> None:
    with hamq.Admin(c.namesrv) as admin:

        def ask(code: int, ext: dict | None = None) -> dict:
            core = admin.async_client.core
            return admin.submit(core.invoke(c.broker_addr("m1"), code, ext)).result(30).ext

        deadline = time.monotonic() + 60
        while True:
            try:
                admin.create_topic(TOPIC, 4)
                ask(RequestCode.GET_MIRROR_STATUS)
                break
            except HamqError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        asyncio.run(preload(c.namesrv, args.mb * 1024 * 1024 // len(BODY), args.per_record))
        m2 = c.start_broker("m2", controller_addr=c.namesrv_addrs, ha_join="tail", **MEMBER)
        while len(ask(RequestCode.GET_MIRROR_STATUS)["members"]) < 2:
            time.sleep(0.2)

        sent, stop = [0], threading.Event()

        def produce() -> None:
            with hamq.Producer(c.namesrv) as producer:
                while not stop.is_set():
                    try:
                        if producer.send(Message(TOPIC, BODY)).status is SendStatus.SEND_OK:
                            sent[0] += 1
                    except HamqError:
                        time.sleep(0.01)

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        time.sleep(1)  # the producer at its pace before the sync begins
        status = ask(RequestCode.GET_MIRROR_STATUS)
        load_before = os.getloadavg()[0]  # other work on the machine skews the figures
        need, sent_before, begun = status["need_offset"], sent[0], time.monotonic()
        cpu_before = cpu_seconds(m2.pid)
        assert ask(RequestCode.SYNC_QUEUE, {"batch_size": args.batch_size})["members"]
        while True:
            status = ask(RequestCode.GET_MIRROR_STATUS)
            mirror = status["members"][1] if len(status["members"]) > 1 else None
            if mirror and mirror["synchronised"] and mirror["in_sync_state_set"]:
                break
            time.sleep(0.05)
        seconds = time.monotonic() - begun
        mirror_cpu = cpu_seconds(m2.pid) - cpu_before
        sends = sent[0] - sent_before
        stop.set()
        thread.join(10)
    synced = status["master_end"] - need
    print(
        json.dumps(
            {
                "synced_bytes": synced,
                "seconds": round(seconds, 2),
                "mb_per_s": round(synced / seconds / 1e6, 1),
                "producer_sends_per_s_during_sync": round(sends / seconds),
                "batch_size": args.batch_size,
                "messages_per_record": args.per_record,
                "mirror_cpu_s_per_gb": round(mirror_cpu / synced * 1e9, 2),
                "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            }
        )
    )


if __name__ == "__main__":
    main()
