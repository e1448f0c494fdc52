"""A controller peer as one service: driver, request processor, master-timeout scan,
notifications and election accounting, wired together. ``hamq controller`` serves it on
its own port (``serve_controller``); a name server with ``enable_controller_in_namesrv``
hands it the CONTROLLER_* codes it receives on its port."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from hamq.clock import monotonic_ms
from hamq.config import ControllerConfig, ControllerSettings
from hamq.controller.core import Applied, GroupChanged, Outcome, Request
from hamq.controller_server.driver import ControllerDriver
from hamq.controller_server.elections import ElectionStats
from hamq.controller_server.notify import RoleNotifier
from hamq.controller_server.placement import PlacementDriver
from hamq.controller_server.processor import ControllerProcessor
from hamq.errors import HamqError
from hamq.net.metrics import gauge, serve_metrics
from hamq.net.server import Server
from hamq.net.tasks import PeriodicTask

log = logging.getLogger(__name__)


class ControllerService:
    def __init__(self, settings: ControllerSettings, listen: str, data_dir: Path) -> None:
        self.settings = settings
        self.elections = ElectionStats()
        self.notifier = RoleNotifier()
        self.driver = ControllerDriver(settings, listen, data_dir, self._on_changes)
        self.processor = ControllerProcessor(self.driver, self.elections)
        self.placement = PlacementDriver(self)
        self._scan = PeriodicTask(
            "controller master-timeout scan",
            settings.controller_scan_interval_ms / 1000,
            self._scan_once,
        )

    def start(self) -> None:
        self.driver.start()
        self._scan.start()
        self.placement.start()

    async def stop(self) -> None:
        await self.placement.stop()
        await self._scan.stop()
        await self.driver.stop()
        await self.notifier.close()

    def register_metrics(self) -> None:
        core, stats = self.driver.core, self.elections
        gauge(
            "hamq_controller_is_leader", "1 on the controller's Raft leader", lambda: core.is_leader
        )
        gauge("hamq_controller_term", "The controller peer's Raft term", lambda: core.node.term)
        gauge(
            "hamq_controller_commit_index",
            "Raft entries committed (as this peer knows)",
            lambda: core.node.committed_index,
        )
        gauge(
            "hamq_controller_last_index",
            "Raft entries this peer holds",
            lambda: core.node.log.ledger_end_index,
        )
        gauge(
            "hamq_controller_elections",
            "Master elections applied while leading (those that found no master too)",
            lambda: stats.elections,
        )
        gauge(
            "hamq_controller_failed_elections",
            "Elections applied while leading that found no member to be master",
            lambda: stats.failed_elections,
        )
        gauge(
            "hamq_controller_unclean_elections",
            "Masters elected from outside the SyncStateSet while leading (may lose messages)",
            lambda: stats.unclean_elections,
        )
        gauge(
            "hamq_controller_unclean_lost_bytes",
            "Commit-log bytes old masters held past their unclean successors' ends",
            lambda: stats.unclean_lost_bytes,
        )

    async def propose(self, request: Request) -> Applied:
        """Decide and replicate ``request`` on this peer as a client's request would be
        (the placement driver's way to change the state): the applied outcome, or the
        refusal raised as ``HamqError`` (CONTROLLER_NOT_LEADER when this peer is not the
        serving leader, or lost leadership before the event committed)."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

        def done(outcome: Outcome) -> None:
            if not future.done():  # the caller may have been cancelled meanwhile
                future.set_result(outcome)

        self.driver.core.submit(request, monotonic_ms(), done)
        self.driver.schedule_pump()
        outcome = await future
        if isinstance(outcome, Applied):
            return outcome
        raise HamqError.for_code(outcome.code, outcome.remark)

    def _on_changes(self, changes: list[GroupChanged]) -> None:
        for change in changes:
            self.elections.record(change)
            if self.settings.notify_broker_role_changed:
                self.notifier.notify(change)

    def _scan_once(self) -> None:
        for request in self.driver.core.scan(monotonic_ms()):
            log.warning(
                "master of group %s/%s stopped reporting for %d ms: electing another",
                request.cluster_name,
                request.broker_name,
                self.settings.controller_heartbeat_timeout_ms,
            )
        self.driver.schedule_pump()


async def serve_controller(config: ControllerConfig, stop: asyncio.Event) -> None:
    """``hamq controller``: one standalone controller peer until ``stop`` is set."""
    service = ControllerService(config, config.listen, Path(config.data_dir))
    server = Server(service.processor, config)
    await server.start(config.listen)
    service.start()
    metrics = serve_metrics(config.metrics_listen)
    if metrics is not None:
        service.register_metrics()
    log.info("controller peer %d listening on %s", config.controller_self_id, config.listen)
    ready = {
        "event": "ready",
        "role": "controller",
        "listen": config.listen,
        "self_id": config.controller_self_id,
        "peers": [f"{i}@{addr}" for i, addr in sorted(service.driver.peers.items())],
    }
    print(json.dumps(ready), flush=True)
    await stop.wait()
    await server.close()
    await service.stop()
    if metrics is not None:
        metrics.shutdown()
