"""One hamq client per Python worker process for the executors' pulls.

Spark keeps its Python workers between tasks (``spark.python.worker.reuse``), so a client
opened per partition paid a name-server lookup and a broker connection per queue and per
micro-batch: with 200 ms triggers over 16 queues, 80 connections a second. The client here
lives as long as the worker: one per name-server list and timeout, shared by every
partition and thread of the process, dropped (not closed: its event-loop thread stayed in
the parent) in a forked child, closed at interpreter exit. Spark's daemon ends its workers
with ``os._exit``, which runs no exit handler; the kernel closes their sockets then.
"""

from __future__ import annotations

import atexit
import os
import threading

from hamq.client.consumer import AsyncPullConsumer
from hamq.client.sync import PullConsumer
from hamq.spark.options import DEFAULT_GROUP

_lock = threading.Lock()
_clients: dict[tuple[str, float], PullConsumer] = {}
_consumers: dict[tuple[str, float, str], AsyncPullConsumer] = {}


def worker_consumer(
    namesrv: str, timeout_s: float, group: str
) -> tuple[PullConsumer, AsyncPullConsumer]:
    """The process's client for ``namesrv`` (its event loop runs the pulls: ``submit``)
    and a pull consumer of ``group`` on that client's connections."""
    with _lock:
        client = _clients.get((namesrv, timeout_s))
        if client is None:
            client = _clients[(namesrv, timeout_s)] = PullConsumer(
                DEFAULT_GROUP, namesrv, timeout_s
            )
        consumer = _consumers.get((namesrv, timeout_s, group))
        if consumer is None:
            consumer = _consumers[(namesrv, timeout_s, group)] = AsyncPullConsumer(
                group, core=client.async_client.core
            )
        return client, consumer


def close_all() -> None:
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
        _consumers.clear()
    for client in clients:
        client.close()


def _forget_in_child() -> None:
    """A forked child has the parent's clients without their event-loop threads."""
    global _lock
    _lock = threading.Lock()
    _clients.clear()
    _consumers.clear()


atexit.register(close_all)
os.register_at_fork(after_in_child=_forget_in_child)
