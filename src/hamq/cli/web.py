"""``hamq web``: the management HTTP API and web console on their own, for a cluster whose
name servers do not serve them (``web_listen``). It prints one JSON ready line like the
other servers and stops cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import json
import os
from typing import TYPE_CHECKING

import click

from hamq.cli.admin import controller_option, host_port
from hamq.cli.common import namesrv_option, setup_logging
from hamq.net.server import run_until_signalled

if TYPE_CHECKING:
    from hamq.web.access import ClusterAccess

# RabbitMQ's management port: a RabbitMQ user's scripts find the API where they expect it.
DEFAULT_WEB_LISTEN = "127.0.0.1:15672"


async def serve_web(access: ClusterAccess, listen: str, stop: asyncio.Event) -> None:
    from hamq.web.server import start_web  # FastAPI loads only for the command that serves it

    server = await start_web(access, listen)
    print(
        json.dumps({"event": "ready", "role": "web", "listen": server.listen, "url": server.url}),
        flush=True,
    )
    await stop.wait()
    await server.stop()


@click.command()
@namesrv_option
@controller_option
@click.option(
    "--listen",
    default=DEFAULT_WEB_LISTEN,
    show_default=True,
    callback=host_port,
    help="HOST:PORT to serve on. There is no authentication yet: keep it on 127.0.0.1.",
)
def web(namesrv: str, controllers: list[str], listen: str) -> None:
    """Serve the management HTTP API (/api, OpenAPI at /api/openapi.json) and the console (/)."""
    from hamq.web.access import ClusterAccess

    setup_logging()
    access = ClusterAccess([a.strip() for a in namesrv.split(";") if a.strip()], controllers)
    try:
        run_until_signalled(lambda stop: serve_web(access, listen, stop))
    except OSError as err:
        why = os.strerror(err.errno) if err.errno else str(err)
        raise click.ClickException(f"cannot serve on {listen}: {why}") from None
