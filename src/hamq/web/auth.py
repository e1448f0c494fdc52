"""Where authentication goes: every ``/api`` route and the console depend on ``authorize``,
so the identities of the security issue plug in here and nowhere else. Until they exist it
lets every request through, which is why the API binds 127.0.0.1 by default and says so at
start (``NO_AUTH_NOTICE``)."""

from __future__ import annotations

from typing import Final

from fastapi import Request

NO_AUTH_NOTICE: Final = (
    "the management API and console at {url} have no authentication yet: "
    "anyone who can reach {listen} can change the cluster; keep it on 127.0.0.1"
)


async def authorize(request: Request) -> None:
    """Every request is allowed (no identities yet)."""
