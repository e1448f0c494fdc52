"""CPU time per SEND_MESSAGE (one 1 KiB message) and per PULL answer (32 messages) through the
broker's own handlers and store (async flush, no replication), in one process: what issue 17's
metrics cost on the hot path, measured as thread CPU time (best of rounds) so the other
processes of a loaded machine move it little.

    PYTHONPATH=<tree>/src .venv/bin/python bench/handler_cost.py LABEL

Run it on two source trees in turn (A B A B ...) and compare the medians.
"""

from __future__ import annotations

import sys
import tempfile
import time

from hamq.broker.flow import PublisherFlow
from hamq.broker.pull import PullProcessor
from hamq.broker.role import BrokerRole, RoleState
from hamq.broker.send import SendProcessor
from hamq.broker.topics import TopicService
from hamq.config import BrokerConfig
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame
from hamq.protocol.message import encode_batch, encode_message
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore
from hamq.store.metadata import TopicConfig

SENDS, ROUNDS, READ = 50_000, 7, 64  # READ: sends per socket read, written together


class Publisher:
    publishes = True  # a connection the flow control knows already


def main(label: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        config = BrokerConfig(store_dir=d, disk_min_free_bytes=1)
        store = MessageStore(config)
        store.topics.put(TopicConfig("T", 1, 1), 0)
        topics = TopicService(
            store,
            RoleState(BrokerRole.MASTER, 0),
            default_queue_nums=1,
            auto_create=False,
            on_change=lambda: None,
        )
        send = SendProcessor(
            store,
            topics,
            FlushService(store),
            None,
            None,
            on_put=lambda topic, queue_id: None,
            put_held_back=None,  # type: ignore[arg-type] (no delay messages sent)
            flow=PublisherFlow(config.max_unconfirmed_bytes),
        )
        # the broker's after-write hook (issue 17); a tree before it has none
        after_write = getattr(send, "after_write", lambda: None)
        pull = PullProcessor(store, topics, 0)
        payload, crc = encode_batch([encode_message(b"x" * 1024)])
        conn = Publisher()
        best_send = best_pull = float("inf")
        offset = 0
        for _ in range(ROUNDS):
            ext = {"topic": "T", "queue_id": 0, "count": 1, "crc": crc}
            sends = [
                Frame(RequestCode.SEND_MESSAGE, i, 0, dict(ext), body=payload) for i in range(SENDS)
            ]
            started = time.thread_time()
            for i, frame in enumerate(sends):
                send.send(conn, frame, False)  # type: ignore[arg-type]
                if i % READ == READ - 1:
                    store.commit()
                    after_write()
            store.commit()
            after_write()
            best_send = min(best_send, (time.thread_time() - started) / SENDS)
            pull_ext = {"topic": "T", "queue_id": 0, "max_msgs": 32, "group": "g"}
            pulls = [
                Frame(RequestCode.PULL_MESSAGE, i, 0, {**pull_ext, "queue_offset": offset + 32 * i})
                for i in range(SENDS // 32)
            ]
            started = time.thread_time()
            for frame in pulls:
                pull.pull(conn, frame)  # type: ignore[arg-type]
            best_pull = min(best_pull, (time.thread_time() - started) / len(pulls))
            offset += SENDS
        store.close()
    print(
        f"{label}: send {best_send * 1e6:.2f} us/request, "
        f"pull {best_pull * 1e6:.2f} us/answer of 32"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "hamq")
