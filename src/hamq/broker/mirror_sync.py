"""SYNC_QUEUE and GET_MIRROR_STATUS (seed 003's ``sync-queue``, ``cancel-sync-queue`` and
``list-queues``), answered by a mirrored group's master: its HA service knows every
mirror's log start and ack, and the need offset that decides which are synchronised."""

from __future__ import annotations

from hamq.broker.ha.service import HAMaster
from hamq.broker.role import RoleState
from hamq.config import BrokerConfig
from hamq.errors import InvalidArgument, ServiceNotAvailable
from hamq.net.connection import Connection, response_pieces
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, check_int

DEFAULT_BATCH_SIZE = 4096  # RabbitMQ's ha-sync-batch-size default
MAX_BATCH_SIZE = 1 << 20


class MirrorSyncProcessor:
    def __init__(self, config: BrokerConfig, role: RoleState, ha_master: HAMaster) -> None:
        self.config = config
        self.role = role
        self.ha_master = ha_master

    def handlers(self) -> dict:
        return {
            RequestCode.SYNC_QUEUE: self.sync_queue,
            RequestCode.GET_MIRROR_STATUS: self.mirror_status,
        }

    def _master(self) -> HAMaster:
        if not self.config.enable_controller_mode:
            raise InvalidArgument(
                "mirror sync needs a group in controller mode (a mirrored-queue policy's group)"
            )
        if not self.role.is_master:
            raise ServiceNotAvailable("this member is not its group's master; ask the master")
        return self.ha_master

    def sync_queue(self, conn: Connection, frame: Frame) -> list:
        """{cancel: bool, batch_size: int} → {members: broker ids restarted or cancelled}."""
        master = self._master()
        cancel = frame.ext.get("cancel", False)
        if not isinstance(cancel, bool):
            raise InvalidArgument(f"request field 'cancel' must be a boolean, got {cancel!r}")
        batch = check_int(
            "batch_size", frame.ext.get("batch_size", DEFAULT_BATCH_SIZE), 1, MAX_BATCH_SIZE
        )
        members = master.cancel_sync() if cancel else master.sync_mirrors(batch)
        return response_pieces(frame, ext={"members": members})

    def mirror_status(self, conn: Connection, frame: Frame) -> list:
        return response_pieces(frame, ext=self._master().mirror_status(self.config.listen))
