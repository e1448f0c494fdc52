"""The synchronous facade: each object runs its asyncio twin on a private event-loop
thread and exposes the same methods as plain blocking calls.

``Producer.send_async(message, callback)`` stays non-blocking; its callback runs on that
event-loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from typing import Any

from hamq.client.admin import AsyncAdmin
from hamq.client.consumer import AsyncPullConsumer
from hamq.client.message import Message
from hamq.client.producer import AsyncProducer, SendCallback
from hamq.client.push import AsyncPushConsumer
from hamq.client.simple import AckCallback, AsyncSimpleConsumer, PopMessageExt


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class _SyncFacade:
    """Turns every coroutine method of the wrapped object into a blocking call."""

    _async_cls: type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = _new_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name=f"hamq-{type(self).__name__}"
        )
        self._thread.start()
        self._async = self._async_cls(*args, **kwargs)
        self._closed = False

    def _run(self, coro: Any) -> Any:
        return self.submit(coro).result()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        """Start a coroutine of the wrapped object without waiting (prefetching)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    @property
    def async_client(self) -> Any:
        return self._async

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._async, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **kw: self._run(attr(*a, **kw))
        return attr

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._run(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> _SyncFacade:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Producer(_SyncFacade):
    _async_cls = AsyncProducer

    def send_async(self, message: Message, callback: SendCallback) -> None:
        self._loop.call_soon_threadsafe(self._async.send_async, message, callback)


class PullConsumer(_SyncFacade):
    _async_cls = AsyncPullConsumer


class Admin(_SyncFacade):
    _async_cls = AsyncAdmin


class PushConsumer(_SyncFacade):
    """``listener(messages)`` runs on a pool of consume threads and returns a
    ``ConsumeConcurrentlyStatus`` (or ``ConsumeOrderlyStatus`` when orderly)."""

    _async_cls = AsyncPushConsumer
    shutdown = _SyncFacade.close


class SimpleConsumer(_SyncFacade):
    """Pop consumption: ``receive``, ``ack``, ``change_invisible_duration`` block;
    ``ack_async`` does not (its callback runs on the event-loop thread)."""

    _async_cls = AsyncSimpleConsumer

    def ack_async(self, message: PopMessageExt, callback: AckCallback | None = None) -> None:
        self._loop.call_soon_threadsafe(self._async.ack_async, message, callback)
