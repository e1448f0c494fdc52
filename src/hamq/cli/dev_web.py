"""Where ``hamq dev`` serves the management HTTP API and the web console: the first name
server serves both (``web_listen``) in every mode, on a port of the dev layout that no other
server of it takes, checked free before anything starts so a taken port is one config line
naming ``--web-port`` rather than a name server that exits half-started."""

from __future__ import annotations

from hamq.config_check import bad
from hamq.preflight import can_bind

# Port base + 1000: above the name servers and controller peers (port base and up), below
# the containers (+1001 and up) and the members (+1035 and up, their HA ports one above).
WEB_PORT_OFFSET = 1000
WEB_HOST = "127.0.0.1"  # no login yet (the security issue brings identities): local only


def web_listen(port_base: int, web_port: int | None) -> str:
    """The console's HOST:PORT: ``--web-port``, else port base + ``WEB_PORT_OFFSET``."""
    return f"{WEB_HOST}:{port_base + WEB_PORT_OFFSET if web_port is None else web_port}"


def web_ready(listen: str) -> dict:
    """The ready line's ``web`` entry."""
    return {"url": f"http://{listen}/", "listen": listen}


def check_web_listen(listen: str, taken: dict[str, str]) -> None:
    """``listen`` is none of the layout's other addresses (``taken``: owner -> HOST:PORT;
    a member binds its port only after the console runs, so a bind test alone would pass)
    and can be bound now. Raises ``ConfigError`` keyed ``--web-port``."""
    for owner, addr in taken.items():
        if addr == listen:
            raise bad("--web-port", listen, f"is {owner} too")
    can_bind("--web-port", listen)
