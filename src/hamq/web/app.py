"""The management app: the RabbitMQ-shaped and RocketMQ-shaped API routers, the console
and its static files, behind the one auth hook; a history sampler runs while it serves.
OpenAPI (generated from the routes' pydantic models) is at ``/api/openapi.json``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from importlib.metadata import version

from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from hamq.web import api_docs, console, errors, rabbit, rocket
from hamq.web.access import ClusterAccess
from hamq.web.auth import authorize
from hamq.web.body_limit import BodyLimit
from hamq.web.history import History, sample_forever
from hamq.web.json_body import JsonBodies
from hamq.web.origin import SameOrigin


def create_app(access: ClusterAccess, *, sample_interval_s: float = 2.0) -> FastAPI:
    history = History(sample_interval_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sampler = asyncio.create_task(sample_forever(history, access.admin()))
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await access.close()

    app = FastAPI(
        title="hamq management API",
        version=version("hamq"),
        openapi_url="/api/openapi.json",
        docs_url=None,  # api_docs serves it from vendored files
        redoc_url=None,
        lifespan=lifespan,
        dependencies=[Depends(authorize)],
    )
    app.state.access = access
    app.state.history = history
    errors.install(app)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit)
    app.add_middleware(SameOrigin)  # no cross-site writes, no DNS-rebinding Host
    for router in (rabbit.router, rocket.router, console.router, api_docs.router):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=console.STATIC_DIR), name="static")
    return app
