"""Request bodies are bounded: a body is read into memory and parsed on the loop that also
answers the name server's requests (``web_listen``), and a 300 MB one held a name server's
routes for 3 s. A body over ``MAX_BODY_BYTES`` (a policy or an action is a few hundred
bytes) is a 413 in the API's one error shape: refused before it is read when its
``Content-Length`` says so, or as soon as the bytes streamed in pass the limit.

(FastAPI's own ``max_body_size`` answers plain text from inside each route, past the
API's error handlers.)"""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hamq.protocol.codes import ResponseCode
from hamq.web.errors import error_body

MAX_BODY_BYTES = 1 << 20
_STATUS = 413


class BodyTooLarge(HTTPException):
    """Raised while a route reads a streamed body; the API's handler answers it."""

    def __init__(self) -> None:
        # the rest of the body is never read: the connection cannot carry another request
        super().__init__(
            _STATUS, f"request body over {MAX_BODY_BYTES} bytes", headers={"connection": "close"}
        )


def _declared_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BodyLimit:
    """ASGI middleware: at most ``MAX_BODY_BYTES`` of body per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > MAX_BODY_BYTES:
            reason = f"request body of {declared} bytes, over {MAX_BODY_BYTES}"
            body = error_body(_STATUS, ResponseCode.INVALID_ARGUMENT, reason)
            await JSONResponse(body, _STATUS, headers={"connection": "close"})(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > MAX_BODY_BYTES:
                raise BodyTooLarge
            return message

        await self.app(scope, limited, send)
