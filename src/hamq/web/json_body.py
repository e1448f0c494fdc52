"""RabbitMQ reads every request body of its API as JSON whatever the content type says
(its handlers accept ``'*'``), so ``curl -X PUT -d '{...}'`` without ``-H content-type``
works there; scripts written that way work here too. Bodies of ``/api`` writes are JSON
regardless of the declared type; a body that is not JSON is still a 400."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

_WRITES = frozenset({"PUT", "POST", "PATCH"})
_JSON = (b"content-type", b"application/json")


class JsonBodies:
    """ASGI middleware: ``/api`` writes are read as ``application/json``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in _WRITES:
            if scope["path"].startswith("/api/"):
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*headers, _JSON]}
        await self.app(scope, receive, send)
