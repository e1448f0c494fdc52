"""The asyncio shell around a ``ControllerCore``: ticks, the Ready cycle with its fsync in a
worker thread, the snapshot file, and Raft traffic between peers (CONTROLLER_RAFT_MESSAGE
on the peers' listen ports).

Entries go through ``raft.FileStorage`` under ``<data_dir>/raft``; every Ready is fsynced
before its messages leave and before anything it commits is applied (the core's
``persist``). The snapshot is written atomically (temporary file, fsync, rename) after the
Ready that produced it; losing one only means replaying more of the log at the next start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path

from hamq.broker.dledger.wire import decode_message
from hamq.clock import monotonic_ms
from hamq.config import ControllerSettings
from hamq.config_check import dledger_peers
from hamq.controller.codec import decode_snapshot_at
from hamq.controller.core import ControllerCore, CoreSettings, GroupChanged, Snapshot
from hamq.controller.errors import ControllerCodecError
from hamq.net.raft_transport import RaftTransport
from hamq.net.tasks import PeriodicTask
from hamq.protocol.codes import RequestCode
from hamq.raft import FileStorage, MessageDecodeError, RaftConfig, RaftError
from hamq.store.disk import OS_DISK, atomic_write

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.01
# A Ready whose write failed (a full disk) is written again after this pause; nothing it
# carries leaves or is applied meanwhile.
PERSIST_RETRY_S = 1.0
RAFT_DIR = "raft"
SNAPSHOT_FILE = "snapshot"


def peer_map(settings: ControllerSettings, self_addr: str) -> dict[int, str]:
    """{peer id: listen address}; no ``controller_peers`` means one peer, this one."""
    if not settings.controller_peers:
        return {settings.controller_self_id: self_addr}
    return dledger_peers(settings.controller_peers, "controller_peers")


class ControllerDriver:
    def __init__(
        self,
        settings: ControllerSettings,
        self_addr: str,
        data_dir: Path,
        on_changes: Callable[[list[GroupChanged]], None],
    ) -> None:
        self.node_id = settings.controller_self_id
        self.peers = peer_map(settings, self_addr)
        self.on_changes = on_changes  # notifications and election accounting
        election_ms = settings.controller_election_timeout_ms
        raft_config = RaftConfig(
            self.node_id,
            tuple(sorted(self.peers)),
            election_timeout_ms=election_ms,
            push_timeout_ms=election_ms * 2 // 5,
        )
        data_dir.mkdir(parents=True, exist_ok=True)
        self.snapshot_path = data_dir / SNAPSHOT_FILE
        snapshot = self._read_snapshot()
        self.storage = FileStorage(data_dir / RAFT_DIR)
        try:
            self.core = ControllerCore(
                raft_config,
                self.storage,
                random.Random(os.urandom(8)),
                CoreSettings(
                    settings.controller_heartbeat_timeout_ms,
                    settings.controller_snapshot_interval_entries,
                    settings.enable_elect_unclean_master,
                    settings.node_heartbeat_timeout_ms,
                ),
                monotonic_ms(),
                snapshot,
            )
        except Exception:
            self.storage.close()
            raise
        self.transport = RaftTransport(self.peers, RequestCode.CONTROLLER_RAFT_MESSAGE)
        self._pumping = False
        self._pump_again = False
        self._pump_future: asyncio.Future | None = None
        self._stopping = False
        self._led_term: int | None = None
        self._ticks = PeriodicTask("controller tick", TICK_INTERVAL_S, self._tick)

    def _read_snapshot(self) -> bytes | None:
        """The snapshot file's bytes; None without one, or when it cannot be decoded: the
        log is kept whole, so the state is rebuilt from the log alone."""
        if not self.snapshot_path.exists():
            return None
        data = self.snapshot_path.read_bytes()
        try:
            decode_snapshot_at(data)
        except ControllerCodecError as err:
            log.error("ignoring %s (%s): replaying the whole Raft log", self.snapshot_path, err)
            return None
        return data

    @property
    def leader_addr(self) -> str | None:
        """The Raft leader's listen address, when another peer is known to lead."""
        leader = self.core.leader_id
        return None if leader == self.node_id else self.peers.get(leader)

    def start(self) -> None:
        self._ticks.start()

    async def stop(self) -> None:
        await self._ticks.stop()
        self._stopping = True
        if self._pump_future is not None:  # a Ready may be being written in a thread
            await asyncio.gather(self._pump_future, return_exceptions=True)
        self.core.fail_all("the controller peer is stopping; the outcome is unknown")
        await self.transport.close()
        self.storage.close()

    def step(self, body: bytes, sender: str) -> None:
        try:
            self.core.step(decode_message(body))
        except (MessageDecodeError, RaftError) as err:
            log.warning("dropping controller Raft message from %s: %s", sender, err)
        self.schedule_pump()

    # -- the Ready cycle -------------------------------------------------------------------------
    def _tick(self) -> None:
        self.core.tick(monotonic_ms())
        self.schedule_pump()

    def schedule_pump(self) -> None:
        if self._stopping:
            return
        if self._pumping:
            self._pump_again = True
        elif self.core.node.has_ready():
            self._pumping = True
            self._pump_future = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        core = self.core
        try:
            while not self._stopping and (ready := core.start_cycle()) is not None:
                while True:
                    try:
                        await asyncio.to_thread(core.persist, ready)
                        break
                    except OSError as err:
                        if self._stopping:  # nothing of this Ready left or was applied
                            return
                        log.error(
                            "writing the controller Raft log failed: %s; retrying in %.0f s",
                            err,
                            PERSIST_RETRY_S,
                        )
                        await asyncio.sleep(PERSIST_RETRY_S)
                out = core.finish_cycle(ready, monotonic_ms())
                self.transport.send(out.messages)
                if out.changes:
                    self.on_changes(out.changes)
                if out.snapshot is not None:
                    await self._write_snapshot(out.snapshot)
                self._pump_again = False
        except Exception:
            log.exception("controller Ready cycle failed")
            raise
        finally:
            self._pumping = False
        self._log_role()
        if self._pump_again:
            self._pump_again = False
            self.schedule_pump()

    def _log_role(self) -> None:
        led_term = self.core.node.term if self.core.is_leader else None
        if led_term != self._led_term:
            self._led_term = led_term
            log.info(
                "controller peer %d is now %s (term %d)",
                self.node_id,
                "the LEADER" if led_term is not None else "a follower",
                self.core.node.term,
            )

    async def _write_snapshot(self, snapshot: Snapshot) -> None:
        try:
            await asyncio.to_thread(atomic_write, OS_DISK, self.snapshot_path, snapshot.data)
        except OSError as err:  # the log is kept whole: a restart replays more of it
            log.error(
                "writing the controller snapshot at index %d failed: %s",
                snapshot.applied_index,
                err,
            )
