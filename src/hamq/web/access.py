"""How the API reaches the cluster: the same admin clients the CLI uses, one of each per
app (their connection pools are shared by every request), opened on first use and closed
when the app stops."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from hamq.client.admin import AsyncAdmin, AsyncControllerAdmin
from hamq.protocol.codes import ResponseCode
from hamq.web.errors import ApiError


@dataclass
class ClusterAccess:
    """``controllers`` may be empty (a name server without an embedded controller): the
    routes that need one answer 503."""

    namesrv: list[str]
    controllers: list[str] = field(default_factory=list)
    _admin: AsyncAdmin | None = field(default=None, init=False, repr=False)
    _controller_admin: AsyncControllerAdmin | None = field(default=None, init=False, repr=False)

    def admin(self) -> AsyncAdmin:
        if self._admin is None:
            self._admin = AsyncAdmin(self.namesrv)
        return self._admin

    def controller_admin(self) -> AsyncControllerAdmin:
        if not self.controllers:
            raise ApiError(503, ResponseCode.SERVICE_NOT_AVAILABLE, "no controller configured")
        if self._controller_admin is None:
            self._controller_admin = AsyncControllerAdmin(self.controllers)
        return self._controller_admin

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
        if self._controller_admin is not None:
            await self._controller_admin.close()
            self._controller_admin = None


def cluster_access(request: Request) -> ClusterAccess:
    """FastAPI dependency: the app's access to its cluster."""
    access: ClusterAccess = request.app.state.access
    return access
