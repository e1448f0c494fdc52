"""Every error the API answers is one JSON shape carrying the wire protocol's code, so a
script reads the same codes over HTTP as a client reads on the wire:
``{"error", "reason", "code", "name", "field"}``. Bad input is a 4xx naming the field;
nothing a caller sends can make a 500."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPMethod, HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import Match

from hamq.errors import ConnectionLost, HamqError, RequestTimeout
from hamq.protocol.codes import ResponseCode

# Wire codes a cluster answers with, as HTTP says them; any other cluster answer is 502.
STATUS_OF_CODE: dict[ResponseCode, int] = {
    ResponseCode.INVALID_ARGUMENT: 400,
    ResponseCode.CONTROLLER_INVALID_REQUEST: 400,  # the catalogue refused (a limit, "/")
    ResponseCode.MESSAGE_ILLEGAL: 400,
    ResponseCode.NO_PERMISSION: 403,
    ResponseCode.TOPIC_NOT_EXIST: 404,
    ResponseCode.QUERY_NOT_FOUND: 404,
    ResponseCode.BROKER_NOT_FOUND: 404,
    ResponseCode.QUEUE_NOT_EXIST: 404,
    ResponseCode.TOPIC_EXIST_ALREADY: 409,
    ResponseCode.NOT_LEADER: 503,
    ResponseCode.CONTROLLER_NOT_LEADER: 503,
    ResponseCode.SERVICE_NOT_AVAILABLE: 503,
    ResponseCode.SYSTEM_BUSY: 503,
    ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE: 503,
}
# What HTTP says for a status the API gives without a cluster answer behind it.
CODE_OF_STATUS: dict[int, ResponseCode] = {
    400: ResponseCode.INVALID_ARGUMENT,
    404: ResponseCode.QUERY_NOT_FOUND,
    405: ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
    413: ResponseCode.INVALID_ARGUMENT,
    415: ResponseCode.INVALID_ARGUMENT,
}


class ErrorBody(BaseModel):
    """An error answer (OpenAPI documents it on every route)."""

    error: str
    reason: str
    code: int
    name: str
    field: str | None = None


class ApiError(Exception):
    """Raised by a route: the status, the wire code and the reason the caller reads."""

    def __init__(
        self, status: int, code: ResponseCode, reason: str, field: str | None = None
    ) -> None:
        super().__init__(reason)
        self.status, self.code, self.reason, self.field = status, code, reason, field


def _utf8(text: str) -> str:
    """``text`` as UTF-8 can carry it: a JSON body may hold a lone surrogate (``"\\ud800"``)
    that a reason or field echoes, and the answer must still encode."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(
    status: int, code: ResponseCode, reason: str, field: str | None = None
) -> dict[str, Any]:
    """The one error shape: ``error`` is HTTP's reason phrase in snake_case."""
    error = HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    body = ErrorBody(
        error=error,
        reason=_utf8(reason),
        code=int(code),
        name=code.name,
        field=None if field is None else _utf8(field),
    )
    return body.model_dump()


def _answer(status: int, code: ResponseCode, reason: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, code, reason, field), status_code=status)


def status_of(err: HamqError) -> int:
    """A cluster's refusal as HTTP: an unreachable cluster is 503, an unknown answer 502."""
    if isinstance(err, (ConnectionLost, RequestTimeout)):
        return 503
    return STATUS_OF_CODE.get(err.code, 502)


def _field(loc: tuple[int | str, ...]) -> str | None:
    """pydantic's location without where it came from (``body``, ``path``, ``query``)."""
    parts = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "path", "query") else []
    return ".".join(parts) or None


async def _on_api_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, ApiError)
    return _answer(err.status, err.code, err.reason, err.field)


async def _on_hamq_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, HamqError)
    return _answer(status_of(err), err.code, err.message)


async def _on_validation(request: Request, err: Exception) -> JSONResponse:
    """The first problem pydantic found, naming its field (``definition.ha-mode``)."""
    assert isinstance(err, RequestValidationError)
    first = err.errors()[0] if err.errors() else {"loc": (), "msg": "invalid request"}
    # a body that is no JSON at all has no field to name (pydantic gives its byte position)
    invalid_json = first.get("type") == "json_invalid"
    field = None if invalid_json else _field(tuple(first.get("loc", ())))
    reason = f"{field}: {first['msg']}" if field else str(first["msg"])
    return _answer(400, ResponseCode.INVALID_ARGUMENT, reason, field)


def _allowed_methods(request: Request) -> str:
    """The methods some route serves at this path, found by asking the router for each.
    Starlette's 405 named only the methods of the first route whose path matched, and
    FastAPI makes one route per method, so ``Allow`` said ``GET`` where ``PUT`` and
    ``DELETE`` were served too."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in sorted(HTTPMethod)
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    )


async def _on_http_error(request: Request, err: Exception) -> JSONResponse:
    """Starlette's own answers (no such route, method not allowed) in the same shape."""
    assert isinstance(err, HTTPException)
    code = CODE_OF_STATUS.get(err.status_code, ResponseCode.SYSTEM_ERROR)
    headers = dict(err.headers or {})
    if err.status_code == HTTPStatus.METHOD_NOT_ALLOWED:
        headers["Allow"] = _allowed_methods(request)
    return JSONResponse(
        error_body(err.status_code, code, str(err.detail)),
        status_code=err.status_code,
        headers=headers,
    )


async def _on_unexpected(request: Request, err: Exception) -> JSONResponse:
    """A fault of the API itself is still the one error shape (the traceback is logged)."""
    return _answer(500, ResponseCode.SYSTEM_ERROR, f"internal error: {type(err).__name__}")


def _without_unused_422(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """``app.openapi`` without FastAPI's 422 ``HTTPValidationError``, which this API never
    answers (bad input is 400 with ``ErrorBody``), so clients generated from the schema
    read the error shape they get."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for operations in schema["paths"].values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
        return app.openapi_schema  # type: ignore[return-value]

    return openapi


def install(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(HamqError, _on_hamq_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.openapi = _without_unused_422(app)  # type: ignore[method-assign]


# Declared on routes so the OpenAPI schema names the error shape for each status.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (400, 403, 404, 409, 413, 502, 503)
}
