"""SYNC_QUEUE and GET_MIRROR_STATUS (seed 003's ``sync-queue``, ``cancel-sync-queue`` and
``list-queues``), answered by a mirrored group's master: its HA service knows every
mirror's log start and ack, and the need offset that decides which are synchronised."""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
        return response_pieces(frame, ext=mirror_status(self._master(), self.config.broker_addr))


@dataclass(frozen=True)
class MirrorMember:
    """One member in GET_MIRROR_STATUS (``list-queues`` reads its pid, slave_pids and
    synchronised_slave_pids columns from these)."""

    broker_id: int
    address: str
    log_start: int
    ack_offset: int
    in_sync_state_set: bool
    synchronised: bool
    syncing: bool
    sync_progress: float  # 0.0 .. 1.0 of the history a syncing member still lacked
    sync_batches: int = 0  # transfers a sync's batch of records cut short (batches taken)


def mirror_status(master: HAMaster, own_addr: str) -> dict:
    """GET_MIRROR_STATUS: the need offset, what consumers may still need, and each
    member's log start, ack, place in the SyncStateSet and sync progress."""
    commitlog, core = master.store.commitlog, master.core
    end = commitlog.max_offset
    sss = core.sync_state_set
    applied = sss.applied if sss is not None else frozenset()
    need = master.refresh_need()  # before ``syncing``, which reads it
    syncing = core.syncing()
    master_id = sss.master_id if sss is not None else master.config.broker_id
    members = [MirrorMember(master_id, own_addr, commitlog.min_offset, end, True, True, False, 1.0)]
    for s in sorted(core.slaves.values(), key=lambda s: s.broker_id):
        synchronised = s.broker_id in applied and s.log_start <= need.offset
        if synchronised:
            progress = 1.0
        elif s.broker_id in syncing and end > (begun := min(s.log_start, s.ack_offset)):
            progress = min(1.0, (s.ack_offset - begun) / (end - begun))
        else:
            progress = 0.0
        members.append(
            MirrorMember(
                s.broker_id,
                master.members.broker_addrs.get(s.broker_id, ""),
                s.log_start,
                s.ack_offset,
                s.broker_id in applied,
                synchronised,
                s.broker_id in syncing,
                progress,
                s.sync_batches,
            )
        )
    return {
        "master_end": end,
        "need_offset": need.offset,
        "messages": need.messages,
        "members": [asdict(member) for member in members],
    }
