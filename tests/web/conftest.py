"""One real cluster per test module for the web tests: ``hamq dev --mode cluster --nodes 3``
(three name servers embedding the controller peers, nodes ``hamq@node1..3``: the chaos
suite's ``MirroredCluster``) and a standalone ``hamq web`` process in front of it, started
as a user starts it. Everything is stopped by PID when the module ends."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "chaos"))  # mirrored_cluster
from mirrored_cluster import MirroredCluster

from harness import Proc
from helpers import free_port

HTTP_TIMEOUT_S = 30.0


@dataclass
class HttpAnswer:
    status: int
    body: Any  # parsed JSON, or None for an empty body
    headers: dict[str, str]


@dataclass
class WebCluster:
    mc: MirroredCluster  # the cluster (its CLI helpers: admin, declare, placed, ...)
    web: Proc  # the ``hamq web`` process
    url: str  # base URL of the API and console, ending in "/"

    @property
    def namesrv(self) -> str:
        return self.mc.namesrv

    @property
    def controllers(self) -> str:
        return self.mc.controllers

    @property
    def ready(self) -> dict:
        """``hamq dev``'s ready line."""
        return self.mc.ready

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> HttpAnswer:
        """``method path`` (relative to ``url``) with a JSON ``body`` (or ``raw`` bytes);
        an HTTP error status is an answer, not an exception."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        sent = {"content-type": "application/json"} if body is not None else {}
        req = urllib.request.Request(
            self.url + path.lstrip("/"), data=data, method=method, headers=sent | (headers or {})
        )
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
                status, payload, got = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as err:
            status, payload, got = err.code, err.read(), dict(err.headers)
        return HttpAnswer(status, json.loads(payload) if payload else None, got)

    def get(self, path: str) -> Any:
        """The JSON of a GET that must succeed."""
        answer = self.request("GET", path)
        assert answer.status == 200, (path, answer)
        return answer.body


@pytest.fixture(scope="module")
def web_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("web")
    mc = MirroredCluster.start(root)
    try:
        listen = f"127.0.0.1:{free_port()}"
        args = ["web", "--namesrv", mc.namesrv, "--controller", mc.controllers]
        web = Proc("web", [*args, "--listen", listen], root / "web.log").start()
        try:
            yield WebCluster(mc, web, web.ready["url"])
        finally:
            web.stop()
    finally:
        mc.stop()
