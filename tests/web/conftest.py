"""One real cluster for the web tests: ``hamq dev --mode cluster --nodes 3`` (three name
servers embedding the controller peers, nodes ``hamq@node1..3``: the chaos suite's
``MirroredCluster``) and a standalone ``hamq web`` process in front of it, started as a
user starts it. Starting one takes about 10 s of a loaded CI machine, so every module
shares the session's (``web_cluster``); the fuzzer, which writes random policies, has its
own (``own_web_cluster``). Everything is stopped by PID at the end.

Sharing asks each module to keep to its own objects, so that no order of modules changes
an answer: its own topic, policy, vhost and consumer-group names (a prefix such as
``rk.``, ``console.``), no policy pattern matching another module's topics, and no exact
comparison of a cluster-wide list, count or total (compare with a reading taken first). A
test that breaks the cluster restores it (``controllers_revived``)."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

sys.path.insert(0, str(Path(__file__).parent.parent / "chaos"))  # mirrored_cluster
from mirrored_cluster import MirroredCluster

from hamq.client.admin import AsyncAdmin
from harness import Proc
from helpers import free_port, pid_alive, wait_for

HTTP_TIMEOUT_S = 30.0
REVIVE_TIMEOUT_S = 60.0  # a quorum again, every group whole, every name server routing
CHROMIUM = "/usr/bin/chromium"  # Debian's (`make browser`): Playwright's own cannot download here
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


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
    revived: list[Proc] = field(default_factory=list)  # controller peers started again

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

    def revive_controllers(self) -> None:
        """Every killed controller peer (a name server embedding one) started again from
        the config ``hamq dev`` wrote, until the cluster is as a fresh one: the controllers
        answer, every group is whole and every name server routes every broker."""
        revived = []
        for peer in self.ready["controllers"]:
            if pid_alive(peer["pid"]):
                continue
            name = f"namesrv-{peer['id']}"
            config = self.mc.root / "data" / f"{name}.toml"
            proc = Proc(name, ["namesrv", "-c", str(config)], self.mc.root / f"{name}.log")
            self.revived.append(proc.start())
            peer["pid"] = proc.pid  # stopped by this pid at the end, like the others
            revived.append(peer["address"])
        if not revived:
            return

        def whole() -> bool:
            if self.request("GET", "api/policies").status != 200:
                return False
            groups = self.request("GET", "api/groups")
            return groups.status == 200 and all(
                not g["controller_error"] and all(m["alive"] and m["in_sync"] for m in g["members"])
                for g in groups.body
            )

        wait_for(whole, REVIVE_TIMEOUT_S, "a controller quorum and every group whole")
        first = self.namesrv.split(";")[0]
        wait_for(
            lambda: all(_brokers(addr) == _brokers(first) for addr in revived),
            REVIVE_TIMEOUT_S,
            "the revived name servers routing every broker",
        )


def _brokers(namesrv: str) -> dict:
    """The broker address table one name server holds."""

    async def read() -> dict:
        admin = AsyncAdmin([namesrv])
        try:
            return (await admin.cluster_info())["broker_addr_table"]
        finally:
            await admin.close()

    return asyncio.run(read())


@contextmanager
def started_web_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebCluster]:
    root = tmp_path_factory.mktemp("web")
    mc = MirroredCluster.start(root)
    try:
        listen = f"127.0.0.1:{free_port()}"
        args = ["web", "--namesrv", mc.namesrv, "--controller", mc.controllers]
        web = Proc("web", [*args, "--listen", listen], root / "web.log").start()
        cluster = WebCluster(mc, web, web.ready["url"])
        try:
            yield cluster
        finally:
            web.stop()
            for proc in cluster.revived:
                proc.stop()
    finally:
        mc.stop()


@pytest.fixture(scope="session")
def web_cluster(tmp_path_factory) -> Iterator[WebCluster]:
    with started_web_cluster(tmp_path_factory) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def own_web_cluster(tmp_path_factory) -> Iterator[WebCluster]:
    """A cluster for one module alone, for one whose writes no other module could bear."""
    with started_web_cluster(tmp_path_factory) as cluster:
        yield cluster


@pytest.fixture
def controllers_revived(web_cluster) -> Iterator[None]:
    """For a test that kills controller peers by their ready-line pids: after it, the
    shared cluster is whole again for the tests that follow."""
    yield
    web_cluster.revive_controllers()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium for one module. Not one per session: Playwright's sync API keeps
    an event loop running in this thread while it is open, and every ``asyncio.run`` of a
    later module (the CLI's ``hamq admin``, the admin client) would then fail."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
