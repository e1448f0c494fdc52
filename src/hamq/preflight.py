"""What only this machine can tell about a good config, asked before a server creates
anything: every address it listens on can be bound now (a port in use, a host that does not
resolve or is not this machine's) and every directory it creates can be (no file in the
way). Otherwise the server would fail half-started, its store already on disk, with a
traceback instead of one line naming the key (a ``ConfigError``, as for a bad value)."""

from __future__ import annotations

import socket
from pathlib import Path

from hamq import config_check as check
from hamq.config import BrokerConfig, ControllerConfig, NamesrvConfig


def check_can_start(config: BrokerConfig | NamesrvConfig | ControllerConfig) -> None:
    if isinstance(config, BrokerConfig):
        can_create("store_dir", config.store_dir)
        binds = check.broker_binds(config)
    elif isinstance(config, ControllerConfig):
        can_create("data_dir", config.data_dir)
        binds = check.controller_binds(config)
    else:
        can_create("data_dir", config.data_dir)
        binds = check.namesrv_binds(config)
    for key, value in binds.items():
        can_bind(key, value)


def can_create(key: str, directory: str) -> None:
    """The nearest part of the path that exists is a directory."""
    path = Path(directory).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        raise check.bad(key, directory, f"cannot be created: {path} is not a directory")


def can_bind(key: str, value: str) -> None:
    """Bind as asyncio's server will (every address the host resolves to, SO_REUSEADDR,
    IPv6 only on an IPv6 socket) and let go at once."""
    host, port = check.address(key, value)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, sockaddr in infos:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(sockaddr)
    except OSError as exc:
        raise check.bad(key, value, f"cannot listen there: {exc.strerror or exc}") from None
