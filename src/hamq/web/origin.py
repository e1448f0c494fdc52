"""Browsers must not be a way into the API while it has no login (it trusts whoever reaches
127.0.0.1). Two attacks need no credentials at all:

- cross-site request forgery: any page the operator opens can make the browser POST to
  127.0.0.1 with a body the API reads as JSON (a form, or ``fetch`` with ``text/plain``: no
  preflight asks first; the API reads any content type, as RabbitMQ's does, for curl). A
  browser names the page's origin in ``Origin`` on every such write, so a write whose
  ``Origin`` is not this server is refused; scripts send no ``Origin`` and are unaffected.
- DNS rebinding: a name the attacker controls re-pointed at 127.0.0.1 makes the API the
  attacker page's own origin, so it could read and write freely. Its requests carry that
  name in ``Host``; only an IP address, ``localhost`` or this machine's name is served."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from hamq.protocol.codes import ResponseCode
from hamq.web.errors import error_body

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_STATUS = 403


def _host_name(host: str) -> str:
    """``Host``'s name without its port (``[::1]:80`` -> ``::1``)."""
    return (urlsplit(f"//{host}").hostname or "").lower()


def trusted_host(host: str) -> bool:
    """A ``Host`` no DNS-rebinding page can send: an IP address, ``localhost`` (and its
    subdomains, which browsers resolve to loopback themselves) or this machine's name."""
    name = _host_name(host)
    if name in ("localhost", socket.gethostname().lower()) or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def refusal(method: str, headers: dict[str, str]) -> str | None:
    """Why a request (``headers`` with lower-case names) is refused, or None to serve it."""
    host = headers.get("host", "")
    if host and not trusted_host(host):
        return (
            f"Host {host!r} is not an address of this server: open the console by its IP "
            "address or localhost (another name could be a DNS-rebinding page)"
        )
    origin = headers.get("origin")
    if method in _SAFE_METHODS or origin is None:
        return None
    if urlsplit(origin).netloc.lower() != host.lower():
        return (
            f"cross-origin {method} from {origin!r} refused: the API takes writes from its own "
            "console and from clients that send no Origin (curl, scripts)"
        )
    return None


class SameOrigin:
    """ASGI middleware: answers 403 NO_PERMISSION for what ``refusal`` refuses."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        reason = refusal(scope["method"], headers)
        if reason is None:
            await self.app(scope, receive, send)
            return
        answer = JSONResponse(error_body(_STATUS, ResponseCode.NO_PERMISSION, reason), _STATUS)
        await answer(scope, receive, send)
