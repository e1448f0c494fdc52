"""Master–slave HA transport (seed 000): the store-side steps of both roles, and the
asyncio shells around them.

The master listens on its HA port; a slave connects and handshakes (HA_HANDSHAKE, one or
more rounds, see ``replication/slave.py``) until both agree where their logs stop being
identical; the slave cuts its log there and then receives raw log ranges (HA_TRANSFER,
one-way frames) which it appends unchanged, answering each write with its ack offset
(HA_ACK, also sent as a heartbeat every ``ha_send_heartbeat_interval_ms``). Sync-master
sends wait on the acks through the core's ordered waiters; no task per message.

``MasterLink`` and ``SlaveLink`` are everything HA does to a store, with no sockets, tasks
or clocks: ``HAMaster`` / ``HASlave`` drive them over TCP, the simulator
(``sim/master_slave.py``) over its virtual network.

Epochs (controller mode, seed 001): every handshake request carries the master epoch the
slave knows, its epoch entries and its log end; every answer carries the master's epoch
and entries. A slave refuses a master older than the epoch it knows; a master that hears
of a newer epoch than its own was deposed and acknowledges nothing more. Past the
consistent point of the two epoch lists (``replication/consistent_point.py``) the master
vouches for no record, so the record comparison above attaches the slave at or before
it: the slave cuts its commit log, consume queues and what the store's ``after_cut``
listeners clamp there, and the record checksums stay a second check below it. As data
arrives the slave's epoch file takes the master's entries whose start it has reached.
Members with no epochs (master–slave mode) compare records only, in as many rounds.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from bisect import bisect_left
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence

from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.need_offset import GroupNeed, group_need
from hamq.clock import monotonic_ms
from hamq.config import BrokerConfig
from hamq.errors import (
    CrcMismatch,
    HamqError,
    InSyncReplicasNotEnough,
    RequestCodeNotSupported,
    ServiceNotAvailable,
)
from hamq.net.connection import Connection, connect, response_pieces
from hamq.net.counts import COUNTS
from hamq.net.server import Server
from hamq.net.tasks import PeriodicTask
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, require
from hamq.protocol.limits import MAX_TOPIC_LENGTH
from hamq.protocol.message import RECORD_HEADER_BYTES, parse_record_header
from hamq.replication.consistent_point import EpochEntry, epoch_ends, find_consistent_point
from hamq.replication.master import (
    AckCallback,
    HAConnectionState,
    MasterReplication,
    Probe,
    ReplicaStatus,
    Restart,
    SlaveAttached,
    epochs_from_wire,
    epochs_to_wire,
)
from hamq.replication.quorum import QuorumConfig
from hamq.replication.slave import (
    Attached,
    CompareRequest,
    HandshakeRequest,
    SlaveHandshake,
    parse_request,
)
from hamq.replication.sync_state_set import SyncStateSet
from hamq.store.flush import FlushService
from hamq.store.message_store import UNCAPPED, MessageStore

log = logging.getLogger(__name__)

_WAITER_SWEEP_S = 0.02
# A moved confirm offset no transfer carries is shipped this long after (an empty
# transfer, once for every move within it): one-at-a-time sends carry it in their next
# transfer instead of costing every slave one more frame per send.
CONFIRM_SHIP_DELAY_S = 0.01
_HEADER_PEEK_BYTES = RECORD_HEADER_BYTES + MAX_TOPIC_LENGTH
SLAVE_RECONNECT_DELAY_S = 0.5


def quorum_of(config: BrokerConfig) -> QuorumConfig:
    return QuorumConfig(
        config.total_replicas,
        config.in_sync_replicas,
        config.min_in_sync_replicas,
        config.enable_auto_in_sync_replicas,
        config.ha_max_gap_not_in_sync,
    )


class StoreRecords:
    """The ``RecordLog`` the HA cores compare: record boundaries from the consume queues
    (in memory), record headers read from the commit log."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    @property
    def min_offset(self) -> int:
        return self.store.commitlog.min_offset

    @property
    def max_offset(self) -> int:
        return self.store.commitlog.max_offset

    def probe(self, offset: int) -> Probe | None:
        commitlog = self.store.commitlog
        end = commitlog.max_offset
        if offset < commitlog.min_offset or offset + RECORD_HEADER_BYTES > end:
            return None
        head = commitlog.read_range(offset, min(end, offset + _HEADER_PEEK_BYTES))
        try:
            h = parse_record_header(head)
        except CrcMismatch:
            return None
        if h.physical_offset != offset or offset + h.total_size > end:
            return None
        return Probe(offset, offset + h.total_size, zlib.crc32(head[: h.payload_start]))

    def record_starts(self, lo: int, hi: int) -> Sequence[int]:
        starts: list[int] = []
        for cq in self.store.queues.values():
            phys = cq.phys
            starts += phys[bisect_left(phys, lo) : bisect_left(phys, hi)]
        starts.sort()
        return starts

    def last_record_start(self) -> int | None:
        return max((cq.phys[-1] for cq in self.store.queues.values() if len(cq)), default=None)

    def records_end(self, start: int, end: int, records: int) -> int:
        """Where the ``records``-th record after ``start`` ends, at most ``end`` (a
        transfer of a slave syncing in batches; a ``start`` inside a record counts that
        record's rest as the first)."""
        starts = self.record_starts(start + 1, end)
        return starts[records - 1] if len(starts) >= records else end


class MasterDeposed(ServiceNotAvailable):
    """A peer knows a newer master epoch than this master's: another member was elected.
    ``failed`` are the waiting sends, ended by the deposition (the shell answers them)."""

    def __init__(self, message: str, failed: list[tuple[AckCallback, ReplicaStatus]]) -> None:
        super().__init__(message)
        self.failed = failed


class MasterLink:
    """The master's HA steps over its store: handshake rounds, what to ship, acks."""

    def __init__(self, core: MasterReplication, store: MessageStore) -> None:
        self.core = core
        self.store = store
        self.records = StoreRecords(store)
        core.start_epoch(store.epochs.last_epoch())  # this member's last, from its file

    def handshake(self, key: Hashable, ext: dict, now_ms: int) -> tuple[dict, SlaveAttached | None]:
        """Answer one handshake round; ``SlaveAttached`` once the slave is registered.
        ``MasterDeposed`` when the slave knows a newer master epoch than ours."""
        broker_id = require(ext, "broker_id", int)
        epochs = "master_epoch" in ext
        limit = self._consistent_point(ext) if epochs else None
        request = parse_request(ext)
        ours = (
            {"epoch": self.core.epoch, "epochs": epochs_to_wire(self.store.epochs.entries())}
            if epochs
            else {}
        )
        if epochs:
            self._check_own_epoch_kept(ext, request)
        if isinstance(request, CompareRequest):
            return {"matches": self.core.compare(self.records, request.probes, limit), **ours}, None
        attached = self.core.attach(
            key,
            broker_id,
            request.offset,
            request.proof,
            self.records,
            now_ms,
            limit,
            log_start=require(ext, "log_start", int) if "log_start" in ext else None,
            tail=ext.get("join") == "tail",
        )
        return {"start_offset": attached.start if attached else None, **ours}, attached

    def _consistent_point(self, ext: dict) -> int | None:
        """How far the slave's log can agree with ours by the two epoch lists (None: we
        have no epochs, records alone decide). ``MasterDeposed`` if the slave knows a
        newer master epoch than ours (named in the request, or in its own history: an
        epoch it holds records of had a master)."""
        theirs = epochs_from_wire(ext.get("epochs"))
        slave_epoch = max(require(ext, "master_epoch", int), theirs[-1].epoch if theirs else 0)
        failed = self.core.learn_epoch(slave_epoch)
        if self.core.highest_epoch > self.core.epoch:
            raise MasterDeposed(
                f"a slave follows master epoch {slave_epoch}, newer than this master's "
                f"{self.core.epoch}: another member was elected; this one acknowledges "
                "no more sends",
                failed,
            )
        ours = self.store.epochs.entries()
        if not ours:
            return None
        return find_consistent_point(
            ours, self.store.commitlog.max_offset, theirs, require(ext, "log_end", int)
        )

    def _check_own_epoch_kept(self, ext: dict, request: HandshakeRequest) -> None:
        """``MasterDeposed`` when a slave holds records of this master's own epoch that
        this log does not: past its end, or different from ours at the same offset. Only
        this master shipped that epoch's records, so its log lost them (a power loss, then
        a restart that kept the epoch), and they may have been acknowledged: the slave
        must not cut them, and a member holding them must lead. (A slave's unreadable
        record is never a probe, so its own damage cannot depose a master.)"""
        epoch = self.core.epoch
        entries = epochs_from_wire(ext.get("epochs"))
        start = next((e.start_offset for e in entries if e.epoch == epoch), None)
        if start is None:
            return
        end = epoch_ends(entries, require(ext, "log_end", int))[epoch]
        ours = self.records
        if isinstance(request, CompareRequest):
            probes: Sequence[Probe] = request.probes
        else:
            probes = () if request.proof is None else (request.proof,)
        differing = [
            p
            for p in probes
            if start <= p.offset and ours.min_offset <= p.offset and ours.probe(p.offset) != p
        ]
        if end <= ours.max_offset and not differing:
            return
        lost_from = min([ours.max_offset] + [p.offset for p in differing])
        failed = self.core.lose_records()
        raise MasterDeposed(
            f"this master lost records of its epoch {epoch} that slave {ext['broker_id']} "
            f"holds (from offset {lost_from}; the slave's copy of the epoch ends at {end}, "
            f"this log at {ours.max_offset}): they may have been acknowledged, so the "
            "slave keeps them and this member acknowledges no more sends; elect a member "
            "that holds them (hamq admin elect-master --broker-name ... --broker-id ...)",
            failed,
        )

    def transfers(self, key: Hashable, now_ms: int) -> Iterator[tuple[int, bytearray]]:
        """The log ranges a slave may receive now (its window), as (offset, bytes).
        ``HamqError`` when retention removed what it needs next: end the session, and its
        next handshake restarts it at our first byte."""
        commitlog = self.store.commitlog
        clip = self.records.records_end
        while (
            span := self.core.next_transfer(key, commitlog.written_offset, now_ms, clip)
        ) is not None:
            if span[0] < commitlog.min_offset:
                raise HamqError(
                    f"slave needs the log from offset {span[0]}, but retention "
                    f"removed everything below {commitlog.min_offset}"
                )
            yield span[0], commitlog.read_range(*span)

    def on_ack(
        self, key: Hashable, ext: dict, now_ms: int
    ) -> list[tuple[AckCallback, ReplicaStatus]]:
        ack_offset = require(ext, "ack_offset", int)
        received = require(ext, "received_offset", int) if "received_offset" in ext else None
        log_start = require(ext, "log_start", int) if "log_start" in ext else None
        return self.core.on_ack(key, ack_offset, now_ms, received, log_start)


class SlaveLink:
    """The slave's HA steps over its store: the handshake, the cut it decides, the appends.
    Bytes are accepted only once a handshake attached, so the log never extends a range
    the master did not vouch for."""

    def __init__(self, store: MessageStore, broker_id: int, join_tail: bool = False) -> None:
        """``join_tail``: an empty log asks to start at the master's end (``ha_join``)."""
        self.store = store
        self.broker_id = broker_id
        self.join_tail = join_tail
        self.records = StoreRecords(store)
        self.attached = False
        self.last_cut: dict | None = None  # offset and bytes of the last diverged suffix cut
        self._handshake: SlaveHandshake | None = None
        # The newest master epoch this member has heard of (from a master, or from the
        # controller through ``HASlave.follow_epoch``): an older master is refused.
        self.known_master_epoch = store.epochs.last_epoch()
        # The master's epoch entries (from its handshake answers), and those this log
        # has not reached yet, oldest first.
        self._master_epochs: tuple[EpochEntry, ...] = ()
        self._epochs_ahead: list[EpochEntry] = []
        # Under sync flush an ack vouches for fsynced records only: the master counts it as
        # this member holding them (all-ack, quorum, the SyncStateSet), so they must survive
        # a power loss here too. Under async flush it vouches for written records (they
        # survive a crash of the process, not a power loss of the whole group).
        self.durable_acks = store.config.flush_disk_type == "sync"
        self.flush_waiting = False  # a wait for an fsync is pending (one at a time)

    @property
    def ack_offset(self) -> int:
        """Whole records held: written (async flush) or fsynced (sync flush). The master
        compares it with a send's end offset, so a durable point inside a record would only
        count for the records wholly below it."""
        commitlog = self.store.commitlog
        if self.durable_acks:
            return min(commitlog.max_offset, commitlog.flushed_offset)
        return commitlog.max_offset

    def ack(self) -> dict:
        """An HA_ACK's fields: the whole records held (what quorum counts) and the bytes
        received, a partial last record included (what the master's window counts: it is
        never held back by an fsync)."""
        return {
            "ack_offset": self.ack_offset,
            "received_offset": self.store.replica_offset,
            "log_start": self.store.commitlog.min_offset,
        }

    def flush_target(self) -> int | None:
        """Under sync flush, the log end to wait for an fsync of before acknowledging it
        again; None when nothing waits for one or a wait is already pending (group commit:
        what arrives meanwhile goes with the next fsync, never one fsync per record). The
        shell calls ``flushed`` when that fsync completes, then acks."""
        end = self.store.commitlog.max_offset
        if not self.durable_acks or self.flush_waiting or self.ack_offset >= end:
            return None
        self.flush_waiting = True
        return end

    def flushed(self) -> None:
        """The fsync ``flush_target`` asked for completed (or gave up): ack, then ask again."""
        self.flush_waiting = False

    def begin(self) -> dict:
        """The first handshake request of a new session. Under sync flush the log is
        fsynced first (once per session): from the attach on, the master counts this member
        as holding its log up to where the two agree."""
        if self.durable_acks:
            self.store.commitlog.flush()
        self.attached = False
        self._master_epochs, self._epochs_ahead = (), []
        self._handshake = SlaveHandshake(self.records)
        return self._request(self._handshake.first())

    def on_handshake_reply(self, ext: dict) -> dict | None:
        """The next handshake request, or None once attached (the log cut to match)."""
        if self._handshake is None:
            raise HamqError("handshake reply without a handshake in progress")
        if "epochs" in ext:
            self._check_master_epoch(ext)
        if "matches" in ext:
            step = self._handshake.on_compare_reply(ext["matches"])
        else:
            step = self._handshake.on_attach_reply(ext.get("start_offset"))
        if not isinstance(step, Attached):
            return self._request(step)
        self._handshake = None
        self._cut(step)
        held = self.store.epochs.entries()
        last = held[-1] if held else EpochEntry(0, 0)
        ahead = [entry for entry in self._master_epochs if entry.epoch > last.epoch]
        if ahead and ahead[0].start_offset < last.start_offset:
            raise HamqError(
                f"the master's epoch history {epochs_to_wire(self._master_epochs)} starts "
                f"epoch {ahead[0].epoch} below this member's epoch {last.epoch} at offset "
                f"{last.start_offset}: the two histories contradict each other; not following"
            )
        self.attached = True
        self._epochs_ahead = ahead
        self._follow_epochs()
        return None

    def _check_master_epoch(self, ext: dict) -> None:
        """Refuse a master older than the epoch this member knows; keep its entries, the
        history this log follows once attached."""
        epoch = require(ext, "epoch", int)
        known = max(self.known_master_epoch, self.store.epochs.last_epoch())
        if epoch < known:
            raise HamqError(
                f"master's epoch {epoch} is older than epoch {known} this member knows: "
                "it was deposed; not following it"
            )
        self.known_master_epoch = epoch
        self._master_epochs = epochs_from_wire(ext["epochs"])

    def on_transfer(self, offset: int, data: bytes | memoryview) -> list[tuple[str, int]]:
        """Append shipped bytes; raises ``HamqError`` on a gap or a corrupt record."""
        if not self.attached:
            raise HamqError("log bytes arrived before the handshake attached")
        arrived = self.store.append_replicated(offset, data)
        if (
            self._epochs_ahead
            and self._epochs_ahead[0].start_offset <= self.store.commitlog.max_offset
        ):
            self._follow_epochs()
        return arrived

    def _follow_epochs(self) -> None:
        """Record the master's epochs whose start this log has reached: it matches the
        master's up to there, so it holds that epoch's history (a promoted slave then
        answers the consistent-point question correctly)."""
        end = self.store.commitlog.max_offset
        while self._epochs_ahead and self._epochs_ahead[0].start_offset <= end:
            entry = self._epochs_ahead.pop(0)
            self.store.epochs.append(entry.epoch, entry.start_offset)

    def _request(self, step) -> dict:
        return {
            "broker_id": self.broker_id,
            "master_epoch": self.known_master_epoch,
            "epochs": epochs_to_wire(self.store.epochs.entries()),
            "log_end": self.store.commitlog.max_offset,
            "log_start": self.store.commitlog.min_offset,
            **({"join": "tail"} if self.join_tail else {}),
            **step.to_wire(),
        }

    def _cut(self, attached: Attached) -> None:
        end = self.store.replica_offset
        if attached.start != attached.agreed:
            log.warning(
                "restarting this slave's log at %d (the master keeps nothing older, or "
                "this member joins at its tail or syncs from there); %d bytes dropped",
                attached.start,
                end - self.store.commitlog.min_offset,
            )
        elif attached.agreed < self.store.commitlog.max_offset:
            cut = self.store.commitlog.max_offset - attached.agreed
            self.last_cut = {"offset": attached.agreed, "bytes": cut}
            log.error(
                "this slave's commit log differs from its master's after offset %d: "
                "cutting %d bytes of commit log and their consume-queue entries",
                attached.agreed,
                cut,
            )
        self.store.reset_log(attached.agreed, attached.start)


class HAMaster:
    """The master's HA service. In controller mode (the broker <-> HA contract of issue 14)
    the broker calls, all synchronously on the event loop:

    - ``start_epoch(epoch, broker_id)`` when it becomes master, before ``start``;
    - ``set_sync_state_set(ids, epoch)`` with what the controller applied;
    - ``sync_state_set_change(now_ms)`` every ``check_sync_state_set_period_ms``: a set to
      propose to the controller (CONTROLLER_ALTER_SYNC_STATE_SET), or None;
    - ``sync_state_set_refused()`` when the controller refused a proposal for a reason
      other than a stale epoch;
    - ``confirm_offset`` for its heartbeat; pull reads it through ``MessageStore.read_cap``.

    A newer master epoch deposes it through a slave's handshake (``MasterLink``); the
    broker learning one from the controller turns this member into a slave instead.
    """

    def __init__(self, config: BrokerConfig, store: MessageStore, members: MemberGroup) -> None:
        self.config = config
        self.store = store
        self.members = members
        self.controller_mode = config.enable_controller_mode
        self.core = MasterReplication(
            quorum_of(config),
            config.ha_window_bytes,
            config.ha_transfer_batch_bytes,
            self._new_sync_state_set(config.broker_id, 0) if self.controller_mode else None,
            all_ack=self.controller_mode and config.all_ack_in_sync_state_set,
        )
        self.link = MasterLink(self.core, store)
        # Only an async master answers before its slaves have a send. A slave promoted at
        # runtime is a sync master, as RocketMQ 5 makes every new master (ReplicasManager.
        # changeToMaster): its in_sync_replicas decide the copies a send needs (1: none).
        self.sync = config.broker_role != "async_master"
        self.server = Server(self, config)
        self.server.on_connection_closed.append(self._closed)
        self._conns: dict[Connection, int] = {}  # attached sessions -> broker id
        self._deposed_logged = False
        self._confirm_shipped: dict[Connection, int] = {}  # controller mode
        self._confirm_timer: asyncio.TimerHandle | None = None  # see CONFIRM_SHIP_DELAY_S
        self._housekeeping = PeriodicTask(
            "HA waiter and session sweep", _WAITER_SWEEP_S, self._sweep
        )
        # topic -> the consumer groups known to consume it (the broker sets it): a group
        # with no offset on a queue yet needs the whole queue (broker/need_offset.py)
        self.known_consumers: Callable[[], Mapping[str, Collection[str]]] = dict
        self._need_refresh_pending = False

    # -- controller mode ----------------------------------------------------------------------
    def _new_sync_state_set(self, broker_id: int, floor: int) -> SyncStateSet:
        return SyncStateSet(broker_id, self.config.ha_max_time_slave_not_catchup_ms, floor)

    def start_epoch(self, epoch: int, broker_id: int | None = None) -> None:
        """Lead master epoch ``epoch`` as member ``broker_id`` (default: the configured
        id): the epoch file gets (epoch, log end), fsynced, before this returns, so before
        any send of the epoch is acknowledged. The same epoch again continues it (only a
        process that began it: a restarted member never continues an epoch, see
        ``ReplicasManager``); an older one raises ``EpochOrderError``.
        Sessions of the older epoch close (their slaves handshake again and learn it);
        the SyncStateSet starts as this member alone until ``set_sync_state_set``."""
        last = self.store.epochs.last_epoch()
        if epoch != last:
            self.store.epochs.append(epoch, self.store.commitlog.max_offset)
        self.core.start_epoch(epoch)
        self._deposed_logged = False
        if self.controller_mode:
            master_id = self.core.sync_state_set.master_id if broker_id is None else broker_id
            # what this member knew confirmed as a slave, every old member held
            floor = min(self.store.read_cap, self.store.commitlog.max_offset)
            self.core.sync_state_set = self._new_sync_state_set(master_id, floor)
            self.refresh_need()
            self._update_read_cap()
        for conn in list(self._conns):
            conn.close()

    def _deposed(self, why: str, failed: list[tuple[AckCallback, ReplicaStatus]]) -> None:
        if failed or not self._deposed_logged:  # once, and whenever sends fail by it
            log.error("%s; %d waiting sends failed", why, len(failed))
            self._deposed_logged = True
        _run(failed)

    def set_sync_state_set(self, ids: frozenset[int], epoch: int) -> None:
        """The controller applied SyncStateSet ``ids`` at sync-state-set ``epoch`` (an
        older epoch than the one held is ignored). A shrink takes effect here."""
        _run(self.core.apply_sync_state_set(frozenset(ids), epoch))
        self._update_read_cap()
        for conn, broker_id in list(self._conns.items()):
            if broker_id in self.core.restarts:
                self._restart_session(conn, broker_id)

    def sync_state_set_change(self, now_ms: int) -> frozenset[int] | None:
        """The SyncStateSet to propose now (the seed's expand and shrink), or None. A
        joining member counts for all-ack and the confirm offset from now on."""
        sss = self.core.sync_state_set
        if sss is None or self.core.deposed:
            return None
        self.refresh_need()
        proposal = sss.change(now_ms, self.store.commitlog.max_offset)
        self._update_read_cap()
        return proposal

    def sync_state_set_refused(self) -> None:
        """The controller refused the proposed SyncStateSet at the epoch this master holds
        (not CONTROLLER_FENCED_*: those mean a newer set or master, re-read it): the
        members only that proposal added stop counting for all-ack and the read cap."""
        if self.core.sync_state_set is not None:
            _run(self.core.refuse_sync_state_set())
            self._update_read_cap()

    # -- mirrors (seed 003) -------------------------------------------------------------------
    def refresh_need(self) -> GroupNeed:
        """Compute the group's need offset (O(queues × consumer groups)) and gate the
        SyncStateSet on it: every check period, and whenever it is read (a sync, a status)
        so that nothing acts on a stale one."""
        need = group_need(self.store, self.known_consumers())
        if self.core.sync_state_set is not None:
            self.core.sync_state_set.set_need_offset(need.offset)
        return need

    def refresh_need_soon(self) -> None:
        """A consumer offset moved back or a group started on a queue: the need offset may
        have dropped, so it is computed again at the end of this event-loop turn (once for
        every commit of the turn) rather than at the next check period, where a tail member
        catching up meanwhile would join the SyncStateSet under the old, higher one."""
        if self._need_refresh_pending or self.core.sync_state_set is None or self.core.deposed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a commit outside the event loop (a tool on a stopped store)
            self.refresh_need()
            return
        self._need_refresh_pending = True
        loop.call_soon(self._refresh_need_now)

    def _refresh_need_now(self) -> None:
        self._need_refresh_pending = False
        self.refresh_need()

    def sync_mirrors(self, batch_records: int) -> list[int]:
        """sync-queue: every attached slave whose log starts above the need offset (and is
        not syncing already) restarts its log there and refills, ``batch_records`` records
        per transfer; producers and consumers go on meanwhile. Its session closes now (a
        member still in the SyncStateSet: once the shrink is applied), and its next
        handshake restarts it. The broker ids restarted."""
        need = self.refresh_need().offset
        restarted = []
        for conn, broker_id in list(self._conns.items()):
            progress = self.core.slaves.get(conn)
            if progress is None or progress.log_start <= need or progress.sync_start is not None:
                continue
            self.core.restart(broker_id, Restart(need, batch_records))
            log.info(
                "slave %d syncs from offset %d (its log starts at %d)",
                broker_id,
                need,
                progress.log_start,
            )
            restarted.append(broker_id)
            self._restart_session(conn, broker_id)
        return restarted

    def _restart_session(self, conn: Connection, broker_id: int) -> None:
        """Close the session of a slave with a pending restart, so that its next handshake
        restarts it; a member the controller may still elect keeps its session (and its
        log) until the shrink that drops it is applied (``set_sync_state_set``)."""
        if not self.core.may_be_elected(broker_id):
            conn.close()

    def cancel_sync(self) -> list[int]:
        """cancel-sync-queue: slaves syncing and not yet synchronised go back to the tail
        (their log restarts at our end) and stay unsynchronised. The broker ids."""
        self.refresh_need()
        cancelled = sorted(self.core.syncing())
        for broker_id in cancelled:
            if self.core.may_be_elected(broker_id):
                del self.core.restarts[broker_id]  # not begun: its log is as it was
            else:
                self.core.restart(broker_id, Restart(None))
        for conn, broker_id in list(self._conns.items()):
            if broker_id in cancelled:
                self._restart_session(conn, broker_id)
        return cancelled

    @property
    def sync_state_set(self) -> frozenset[int]:
        """The effective SyncStateSet (applied ∪ proposed)."""
        sss = self.core.sync_state_set
        return sss.effective if sss is not None else frozenset()

    @property
    def confirm_offset(self) -> int:
        """What every member of the effective SyncStateSet holds; the master's own max
        offset counts for itself."""
        return self.core.confirm_offset(self.store.commitlog.max_offset)

    @property
    def epoch(self) -> int:
        return self.core.epoch

    @property
    def deposed(self) -> bool:
        return self.core.deposed

    @property
    def attached_broker_ids(self) -> set[int]:
        """The slaves whose handshake completed (they receive the log): pre-online waits
        for them."""
        return set(self._conns.values())

    def _update_read_cap(self) -> None:
        sss = self.core.sync_state_set
        if sss is None:
            return
        least = sss.min_member_ack()
        cap = UNCAPPED if least is None else least
        if cap != self.store.read_cap:
            self.store.set_read_cap(cap)
            if self._conns:
                self._ship_confirm_later()

    def _ship_confirm_later(self) -> None:
        if self._confirm_timer is None:
            self._confirm_timer = asyncio.get_running_loop().call_later(
                CONFIRM_SHIP_DELAY_S, self._ship_confirms
            )

    def _ship_confirms(self) -> None:
        self._confirm_timer = None
        for conn in list(self._conns):
            self._ship_confirm(conn)

    def _ship_confirm(self, conn: Connection) -> None:
        """Tell a slave the confirm offset when it moved and no data carried it (an empty
        transfer), so reads there are capped as here. With bytes in flight its ack pumps
        again, and either what is shipped then carries the newest one or it comes back
        here."""
        progress = self.core.slaves.get(conn)
        if progress is None or conn.is_closed or progress.sent_offset > progress.received_offset:
            return
        confirm = self.confirm_offset
        if self._confirm_shipped.get(conn) != confirm:
            self._confirm_shipped[conn] = confirm
            conn.oneway(
                RequestCode.HA_TRANSFER, {"offset": progress.sent_offset, "confirm": confirm}, b""
            )

    async def start(self) -> None:
        """Listen on the HA port (again, after a stop: a member that became master)."""
        await self.server.start(self.config.ha_address)
        self._housekeeping.start()

    async def stop(self) -> None:
        """Close every slave's session and answer the sends still waiting for acks."""
        await self._housekeeping.stop()
        if self._confirm_timer is not None:
            self._confirm_timer.cancel()
            self._confirm_timer = None
        _run(self.core.fail_all())
        await self.server.close()

    # -- the send path --------------------------------------------------------------------
    def check_quorum(self) -> int:
        """Before a send is stored: how many replicas it needs (1 = answer at once), or
        ``InSyncReplicasNotEnough``. Only a sync master waits for slaves."""
        if self.core.lost_records:
            raise ServiceNotAvailable(
                f"this master lost records of its epoch {self.core.epoch} that a slave "
                "holds: it acknowledges no more sends until a member holding them leads"
            )
        if self.core.deposed:
            raise ServiceNotAvailable(
                f"this member led master epoch {self.core.epoch}, but epoch "
                f"{self.core.highest_epoch} has begun: another member is master now"
            )
        if self.core.all_ack:
            # every send waits: the set may grow before it is stored (the core decides)
            return max(2, len(self.sync_state_set))
        if not self.sync:
            return 1
        decision = self.core.decide(self.members.alive_replicas, self.store.commitlog.max_offset)
        if not decision.enough:
            raise InSyncReplicasNotEnough(
                f"send needs {decision.need_ack_nums} replicas in sync but only "
                f"{decision.in_sync_replicas} are (alive members "
                f"{self.members.alive_replicas}, in-sync slaves "
                f"{decision.in_sync_replicas - 1}; in_sync_replicas="
                f"{self.config.in_sync_replicas}, enable_auto_in_sync_replicas="
                f"{self.config.enable_auto_in_sync_replicas})"
            )
        return decision.need_ack_nums

    def wait_for_acks(self, end_offset: int, need_ack_nums: int, callback: AckCallback) -> None:
        if not self._housekeeping.running:
            # stopped (this member became a slave) while the send waited for its fsync:
            # no slave will ack it and no sweep would ever time it out
            callback(ReplicaStatus.SLAVE_NOT_AVAILABLE)
            return
        self.core.wait_for_acks(
            end_offset, need_ack_nums, monotonic_ms(), self.config.sync_flush_timeout_ms, callback
        )

    def new_data(self) -> None:
        """After a commit-log write: ship it to every slave with window room."""
        for conn in list(self._conns):  # a failed pump closes its session
            self._pump(conn)

    # -- RequestHandler (the HA port) -------------------------------------------------------
    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code == RequestCode.HA_ACK:
            _run(self.link.on_ack(conn, frame.ext, monotonic_ms()))
            sss = self.core.sync_state_set
            if sss is not None:
                broker_id = self._conns.get(conn)
                if broker_id is not None and sss.maybe_expand(
                    broker_id, self.store.commitlog.max_offset
                ):
                    log.info("slave %d caught up: it joins the SyncStateSet", broker_id)
                self._update_read_cap()
            self._pump(conn)
            return None
        if frame.code == RequestCode.HA_HANDSHAKE:
            return self._handshake(conn, frame)
        raise RequestCodeNotSupported(f"HA port does not serve request code {frame.code}")

    def after_batch(self) -> None:
        pass

    def _handshake(self, conn: Connection, frame: Frame) -> list:
        try:
            reply, attached = self.link.handshake(conn, frame.ext, monotonic_ms())
        except MasterDeposed as deposed:
            self._deposed(deposed.message, deposed.failed)
            raise
        if attached is not None:
            broker_id = self.core.slaves[conn].broker_id
            for stale in attached.replaced:  # a half-open session of a slave that came back
                log.warning(
                    "slave %d reconnected from %s; closing its older session from %s",
                    broker_id,
                    conn.peer,
                    stale.peer,
                )
                self._conns.pop(stale, None)
                stale.close()
            log.info(
                "slave %d from %s replicates from offset %d", broker_id, conn.peer, attached.start
            )
            self._conns[conn] = broker_id
            self._update_read_cap()
            asyncio.get_running_loop().call_soon(self._pump, conn)
        return response_pieces(frame, ext=reply)

    def _closed(self, conn: Connection) -> None:
        if self._conns.pop(conn, None) is not None:
            log.warning("slave connection from %s closed", conn.peer)
        self._confirm_shipped.pop(conn, None)
        _run(self.core.disconnect(conn))
        self._update_read_cap()

    def _pump(self, conn: Connection) -> None:
        try:
            for offset, data in self.link.transfers(conn, monotonic_ms()):
                if conn.is_closed:
                    return
                ext = {"offset": offset}
                if self.controller_mode:
                    ext["confirm"] = self._confirm_shipped[conn] = self.confirm_offset
                conn.oneway(RequestCode.HA_TRANSFER, ext, data)
            if self.controller_mode and self._confirm_shipped.get(conn) != self.confirm_offset:
                self._ship_confirm_later()
        except HamqError as err:
            log.warning("closing the session of slave %s: %s", conn.peer, err.message)
            conn.close()

    def _sweep(self) -> None:
        housekeeping_ms = self.config.ha_housekeeping_interval_ms
        now = monotonic_ms()
        _run(self.core.expire_waiters(now))
        for conn in self.core.expire_silent(now, housekeeping_ms):
            log.warning("slave %s silent for %d ms; closing", conn.peer, housekeeping_ms)
            conn.close()

    def status(self) -> dict:
        master_offset = self.store.commitlog.max_offset
        sss = self.core.sync_state_set
        controller = (
            {
                "sync_state_set": sorted(sss.applied),
                "sync_state_set_epoch": sss.epoch,
                "effective_sync_state_set": sorted(sss.effective),
                "confirm_offset": self.confirm_offset,
            }
            if sss is not None
            else {}
        )
        return {
            "role": "master",
            "epoch": self.core.epoch,
            "deposed": self.core.deposed,
            **controller,
            "in_sync_slaves": self.core.in_sync_slave_nums(master_offset),
            "slaves": [
                {
                    "broker_id": s.broker_id,
                    "state": s.state.name,
                    "ack_offset": s.ack_offset,
                    "received_offset": s.received_offset,
                    "behind_bytes": master_offset - s.ack_offset,
                }
                for s in self.core.slaves.values()
            ],
        }


class HASlave:
    """Keeps one connection to the master's HA port and appends what it ships."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        members: MemberGroup,
        on_arrival: Callable[[list[tuple[str, int]]], None],
        flush: FlushService | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.members = members
        self.on_arrival = on_arrival
        self.link = SlaveLink(store, config.broker_id, join_tail=config.ha_join == "tail")
        if self.link.durable_acks and flush is None:
            raise ValueError(
                "a slave under sync flush acks fsynced records: it needs the FlushService"
            )
        self.flush = flush
        self.state = HAConnectionState.READY
        self.master_addr: str | None = None
        self._conn: Connection | None = None  # the session with the master, while one is open
        self._ack_due: Connection | None = None  # transfers arrived in this read
        self._task: asyncio.Task | None = None
        # a returning master's HA address and until when (monotonic ms) it is followed
        # while the name servers know no master (``follow_announced``)
        self._announced: tuple[str, int] | None = None

    def follow_announced(self, ha_addr: str, hold_ms: int) -> None:
        """A returning master announced itself (EXCHANGE_BROKER_HA_INFO, pre-online): it
        is isolated, so the name servers do not know it yet. Follow it for ``hold_ms``
        while they know no master; a master they know always comes first."""
        self._announced = (ha_addr, monotonic_ms() + hold_ms)

    @property
    def master_ha_addr(self) -> str | None:
        """The master to follow: the name servers', else one that announced itself."""
        known = self.members.master_ha_addr
        if known is not None or self._announced is None:
            return known
        addr, until_ms = self._announced
        if monotonic_ms() >= until_ms:
            self._announced = None
            return None
        return addr

    def start(self) -> None:
        """Follow the master (again, after a stop: a member that became a slave)."""
        self.state = HAConnectionState.READY
        if self.config.enable_controller_mode:
            # Reads stop at the confirm offset the master ships. Until it does, at what
            # this member knew confirmed as master, or nothing after a start: its tail may
            # be an old epoch's that the new master cuts.
            cap = self.store.read_cap
            self.store.set_read_cap(
                0 if cap == UNCAPPED else min(cap, self.store.commitlog.max_offset)
            )
        self._task = asyncio.create_task(self._run())

    def follow_epoch(self, epoch: int) -> None:
        """The controller says the group's master epoch is ``epoch``: refuse any master
        older than it from the next handshake on."""
        self.link.known_master_epoch = max(self.link.known_master_epoch, epoch)

    async def stop(self) -> None:
        self.state = HAConnectionState.SHUTDOWN
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code != RequestCode.HA_TRANSFER:
            raise HamqError(f"slave HA connection does not serve request code {frame.code}")
        try:
            arrived = self.link.on_transfer(require(frame.ext, "offset", int), frame.body)
            confirm = frame.ext.get("confirm")
            if type(confirm) is int and self.config.enable_controller_mode:
                self.store.set_read_cap(confirm)
        except HamqError as err:  # a gap or a corrupt record: handshake again
            log.error(
                "replication stream from %s rejected: %s; reconnecting", conn.peer, err.message
            )
            conn.close()
            return None
        self.on_arrival(arrived)
        self._ack_due = conn
        return None

    def after_batch(self) -> None:
        """One ack per read of the master's stream, however many transfers it held: the
        window moves at once; under sync flush the records count after their fsync."""
        conn, self._ack_due = self._ack_due, None
        if conn is not None and not conn.is_closed:
            conn.oneway(RequestCode.HA_ACK, self.link.ack())
            self._wait_flushed()

    def _wait_flushed(self) -> None:
        """Under sync flush: ack again once the flush service's next group commit covers
        what arrived (one wait at a time; transfers keep arriving meanwhile)."""
        target = self.link.flush_target()
        if target is not None and self.flush is not None:
            self.flush.wait_flushed(target, self._flushed)

    def _flushed(self, ok: bool) -> None:
        self.link.flushed()
        conn = self._conn
        if conn is None or conn.is_closed or not self.link.attached:
            return
        conn.oneway(RequestCode.HA_ACK, self.link.ack())
        if ok:  # (not after a timeout or the service's stop: the next transfer asks again)
            self._wait_flushed()

    async def _run(self) -> None:
        while self.state is not HAConnectionState.SHUTDOWN:
            addr = self.master_ha_addr
            if addr is None:
                self.state = HAConnectionState.READY
                await asyncio.sleep(SLAVE_RECONNECT_DELAY_S)
                continue
            try:
                await self._session(addr)
            except HamqError as err:
                log.warning("HA session with master %s ended: %s", addr, err.message)
            except Exception:  # a bug, or an address the name server let through: retry
                COUNTS.internal_errors += 1
                log.exception(
                    "HA session with master %r failed; reconnecting in %.1f s",
                    addr,
                    SLAVE_RECONNECT_DELAY_S,
                )
            if self.state is not HAConnectionState.SHUTDOWN:
                self.state = HAConnectionState.READY
                await asyncio.sleep(SLAVE_RECONNECT_DELAY_S)

    async def _session(self, addr: str) -> None:
        conn = await connect(addr, self)
        self._conn = conn
        try:
            self.state = HAConnectionState.HANDSHAKE
            self.master_addr = addr
            self._ask(conn, self.link.begin())
            interval_s = self.config.ha_send_heartbeat_interval_ms / 1000
            while not conn.is_closed and self.master_ha_addr == addr:
                if self.state is HAConnectionState.TRANSFER:
                    conn.oneway(RequestCode.HA_ACK, self.link.ack())
                try:
                    await asyncio.wait_for(asyncio.shield(conn.closed), interval_s)
                except TimeoutError:
                    pass
        finally:
            self._conn = None
            conn.close()

    def _ask(self, conn: Connection, ext: dict) -> None:
        # Replies are handled in the callback, before any frame that follows them on the
        # connection: the log is cut before the first shipped bytes are appended.
        conn.request_cb(
            RequestCode.HA_HANDSHAKE, lambda frame, err: self._answered(conn, frame, err), ext
        )

    def _answered(self, conn: Connection, frame: Frame | None, err: HamqError | None) -> None:
        if err is None and frame.code != ResponseCode.SUCCESS:
            err = HamqError.for_code(frame.code, frame.remark)
        if err is None:
            try:
                following = self.link.on_handshake_reply(frame.ext)
            except HamqError as exc:
                err = exc
        if err is not None:
            log.warning("handshake with master %s failed: %s", conn.peer, err.message)
            conn.close()
        elif following is not None:
            self._ask(conn, following)
        else:
            self.state = HAConnectionState.TRANSFER
            log.info(
                "attached to master %s at offset %d", conn.peer, self.store.commitlog.max_offset
            )
            conn.oneway(RequestCode.HA_ACK, self.link.ack())
            self._wait_flushed()  # a log the cut left partly unfsynced

    def status(self) -> dict:
        return {
            "role": "slave",
            "state": self.state.name,
            "master_ha_addr": self.master_addr,
            "replica_offset": self.store.replica_offset,
            "last_cut": self.link.last_cut,
            "master_epoch": self.link.known_master_epoch,
            "epochs": epochs_to_wire(self.store.epochs.entries()),
        }


def _run(done: list[tuple[AckCallback, ReplicaStatus]]) -> None:
    for callback, status in done:
        callback(status)
