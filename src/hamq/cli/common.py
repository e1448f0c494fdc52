"""Shared CLI plumbing: output as text or JSON, errors as one clear line and exit code 1
(a bad configuration: exit code 2, as for any other bad usage)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import selectors
import sys
from collections.abc import Callable
from typing import IO, Any

import click

from hamq.errors import HamqError
from hamq.net.server import install_uvloop

DEFAULT_NAMESRV = "127.0.0.1:9876"

namesrv_option = click.option(
    "--namesrv",
    "-n",
    default=lambda: os.environ.get("HAMQ_NAMESRV", DEFAULT_NAMESRV),
    show_default="$HAMQ_NAMESRV or 127.0.0.1:9876",
    help="Name server address(es), HOST:PORT separated by ';'.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def config_file_option(help_text: str) -> Callable:
    """A required ``-c/--config FILE``."""
    return click.option(
        "-c",
        "--config",
        "config_path",
        required=True,
        type=click.Path(dir_okay=False),
        help=help_text,
    )


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=os.environ.get("HAMQ_LOG_LEVEL", level),
        stream=sys.stderr,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )


def emit(obj: Any, as_json: bool, text: Callable[[Any], str] | None = None) -> None:
    if as_json:
        click.echo(json.dumps(obj, sort_keys=True, default=str))
    else:
        click.echo(text(obj) if text else json.dumps(obj, indent=2, sort_keys=True, default=str))


class BadConfig(click.ClickException):
    """A ``ConfigError`` as the user sees it: ``config error: <key> = <value>: <allowed>``,
    one line on stderr, no traceback."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"config error: {self.message}", err=True)


def run_async(fn: Callable) -> Callable:
    """Run an async command body on uvloop; hamq errors become one line on stderr, exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        install_uvloop()
        try:
            return asyncio.run(fn(*args, **kwargs))
        except HamqError as err:
            raise click.ClickException(f"{type(err).__name__}: {err.message}") from None
        except KeyboardInterrupt:
            raise SystemExit(130) from None

    return wrapper


def readable(stream: IO[bytes] | int, timeout_s: float) -> bool:
    """Whether ``stream`` (a child's stdout pipe, or a descriptor) has data or its end within
    ``timeout_s``. By epoll: ``select.select`` refuses a descriptor numbered 1024 or more,
    which a long-lived process that has started many children (a pytest worker) reaches."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        return bool(selector.select(max(0.0, timeout_s)))
