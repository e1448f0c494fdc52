"""uvicorn inside a loop that already runs (a name server's, or ``hamq web``'s): a task of
that loop with a clean stop. The listening socket is bound here, so a taken port is an
``OSError`` at start rather than uvicorn's ``sys.exit``; uvicorn installs no signal
handlers of its own, so SIGTERM still reaches the process's own stop event."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from hamq.web.access import ClusterAccess
from hamq.web.app import create_app
from hamq.web.auth import NO_AUTH_NOTICE
from hamq.web.http_guard import GuardedH11Protocol

log = logging.getLogger(__name__)
START_TIMEOUT_S = 10.0


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The process that runs this loop owns SIGTERM/SIGINT (run_until_signalled).
        yield


class WebServer:
    """Serves ``app`` on ``listen`` (HOST:PORT, checked by the caller; port 0 picks a free
    one, which ``listen`` then names)."""

    def __init__(self, app: FastAPI, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        self._sock = socket.create_server((host, int(port)))
        self.listen = f"{host}:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(
            app,
            loop="none",
            http=GuardedH11Protocol,
            lifespan="on",
            log_config=None,
            access_log=False,
            ws="none",
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.listen}/"

    async def start(self) -> None:
        """Returns once requests are served (the app's lifespan started)."""
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while not self._server.started:
            if self._task.done():
                self._task.result()  # its error, or
                raise RuntimeError("the web server stopped while starting")
            if asyncio.get_running_loop().time() > deadline:
                await self.stop()
                raise TimeoutError(f"the web server did not start within {START_TIMEOUT_S} s")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish, run the app's shutdown."""
        self._server.should_exit = True
        if self._task is not None:
            await self._task
            self._task = None
        self._sock.close()


async def start_web(access: ClusterAccess, listen: str) -> WebServer:
    """The app for ``access`` served on ``listen``, with the no-authentication notice."""
    server = WebServer(create_app(access), listen)
    await server.start()
    log.warning(NO_AUTH_NOTICE.format(url=server.url, listen=server.listen))
    return server
