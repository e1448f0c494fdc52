"""One controller peer, sans-IO: the Raft member, the replicated state it applies, the
proposals waiting for their answer, the members' soft state and the master-timeout scan.

The real driver (``controller_server/driver.py``) and the simulator run this same object;
everything it does leaves as an output — the Ready to persist, then the messages to send,
the group changes to notify and the snapshot bytes to write — and time comes in as an
argument. The cycle, as etcd's: ``start_cycle`` hands out a Ready, ``persist`` writes it
(hard state, entries, checkpoint, fsync; a driver may run it in a worker thread), and
``finish_cycle`` applies the committed entries, answers the proposals and advances.

Requests are decided on the Raft leader only (``decide.py``, against the applied state)
and answered once their event is committed *and* applied; ``apply`` re-checks the epochs,
so a decision made stale by a concurrent one is refused, on every peer alike. A new
leader serves only after it applied everything up to its own term's first entry: before
that its state may lack events committed under the previous leader.

Heartbeats are soft state (``liveness.py``), never replicated: every peer records them,
but only the leader declares a master dead, and only once it has led for a whole
heartbeat timeout, since the reports it holds from before may be partial (DESIGN §5).
Registrations are soft state too: the serving leader notes when it handled each one, on
its own clock, and forgets them when a new term begins; a registration at the recorded
address changes nothing replicated and is answered from the state, with no Raft entry.

Snapshots: every ``snapshot_interval_entries`` applied entries the state is encoded with
its applied index; a restart loads it and applies only later entries. ``raft/`` has no
log compaction or InstallSnapshot, so the log itself is kept whole: a restarted peer
replays the log after its snapshot, and a fresh peer gets the whole log from the leader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from hamq.controller.apply import apply_event
from hamq.controller.catalog import decide_catalog
from hamq.controller.codec import decode_event, decode_snapshot_at, encode_event, encode_snapshot_at
from hamq.controller.decide import (
    decide_alter_sync_state_set,
    decide_apply_broker_id,
    decide_clean_broker_data,
    decide_elect_master,
    decide_register_broker,
)
from hamq.controller.elect import unclean_allowed
from hamq.controller.errors import (
    ControllerCode,
    ControllerCodecError,
    ControllerError,
    ControllerRecoveryError,
)
from hamq.controller.events import (
    GROUP_EVENTS,
    AlterSyncStateSet,
    ApplyBrokerId,
    CatalogEvent,
    CleanBrokerData,
    ElectMaster,
    Event,
    RegisterBroker,
)
from hamq.controller.liveness import BrokerLiveness
from hamq.controller.nodes import NodeHeartbeat, NodeLiveness
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    BrokerHeartbeat,
    BrokerShutdown,
    CleanBrokerDataRequest,
    ElectMasterRequest,
    ElectTrigger,
    RegisterBrokerRequest,
)
from hamq.controller.state import BrokerGroup, ControllerState, GroupKey
from hamq.policy.placement import rules_for_group
from hamq.raft import (
    EMPTY_INDEX,
    Entry,
    EntryId,
    FailureReason,
    LogStorage,
    Message,
    RaftConfig,
    RaftError,
    RawNode,
    Ready,
    Rng,
    Role,
)
from hamq.raft.storage import persist

log = logging.getLogger(__name__)

GroupRequest = (
    ApplyBrokerIdRequest
    | RegisterBrokerRequest
    | ElectMasterRequest
    | AlterSyncStateSetRequest
    | CleanBrokerDataRequest
)
GROUP_REQUESTS = (
    ApplyBrokerIdRequest,
    RegisterBrokerRequest,
    ElectMasterRequest,
    AlterSyncStateSetRequest,
    CleanBrokerDataRequest,
)
# A catalog request is the event it asks for (``catalog.py``).
Request = GroupRequest | CatalogEvent


@dataclass(frozen=True)
class Applied:
    """A request's event, committed and applied; ``group`` is its group afterwards (None
    once cleaned away, and for catalog requests). ``event`` None: the request changed
    nothing replicated (a member registering again at its recorded address, a topic
    declared again alike) and was answered from the state."""

    event: Event | None
    group: BrokerGroup | None


Outcome = Applied | ControllerError
Callback = Callable[[Outcome], None]


@dataclass(frozen=True)
class GroupChanged:
    """An event the leader applied: the driver tells the group's members (ElectMaster,
    AlterSyncStateSet) and counts elections."""

    key: GroupKey
    event: Event
    group: BrokerGroup | None


@dataclass(frozen=True)
class Snapshot:
    """The state as of ``applied_index``, encoded: write it atomically."""

    applied_index: int
    data: bytes


@dataclass
class CycleOutput:
    """What ``finish_cycle`` leaves the driver to do: send, notify, write the snapshot."""

    messages: list[Message]
    changes: list[GroupChanged] = field(default_factory=list)
    snapshot: Snapshot | None = None


@dataclass(frozen=True)
class CoreSettings:
    heartbeat_timeout_ms: int
    snapshot_interval_entries: int
    enable_elect_unclean_master: bool
    node_heartbeat_timeout_ms: int = 5000  # ControllerSettings.node_heartbeat_timeout_ms


# What an event refused at apply time answers: the code its request would have got had the
# concurrent event been applied first.
_REFUSED_AT_APPLY: dict[type, ControllerCode] = {
    ApplyBrokerId: ControllerCode.CONTROLLER_BROKER_ID_INVALID,
    RegisterBroker: ControllerCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
    ElectMaster: ControllerCode.CONTROLLER_ELECT_MASTER_FAILED,
    AlterSyncStateSet: ControllerCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
    CleanBrokerData: ControllerCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
}


class ControllerCore:
    def __init__(
        self,
        raft_config: RaftConfig,
        storage: LogStorage,
        rng: Rng,
        settings: CoreSettings,
        now_ms: int,
        snapshot: bytes | None = None,
    ) -> None:
        """Start from ``storage`` and, if given, the last snapshot file's bytes."""
        applied_index, self.state = (
            decode_snapshot_at(snapshot) if snapshot else (EMPTY_INDEX, ControllerState())
        )
        committed = min(storage.load_checkpoint().committed_index, storage.last_index())
        if applied_index > committed:
            raise ControllerRecoveryError(
                f"the snapshot is at Raft index {applied_index} but the Raft log holds only "
                f"up to committed index {committed}: the Raft directory was replaced or lost "
                "data it had fsynced; restore it, or remove the snapshot to rebuild from the "
                "other peers"
            )
        self.storage = storage
        self.settings = settings
        self.node = RawNode(raft_config, storage, rng, now_ms, applied_index=applied_index)
        self.liveness = BrokerLiveness(settings.heartbeat_timeout_ms)
        self.nodes = NodeLiveness(settings.node_heartbeat_timeout_ms)
        self.snapshot_index = applied_index
        self._pending: dict[EntryId, Callback] = {}
        self._lead_term: int | None = None  # the term this peer was last seen leading in
        self._leading_since_ms = now_ms
        self._serve_from_index = EMPTY_INDEX  # a new leader's first entry of its term
        self._electing: set[GroupKey] = set()  # master-timeout elections in flight

    # -- inspection -------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self.node.role == Role.LEADER

    @property
    def serving(self) -> bool:
        """Leading, with everything committed before this term applied: requests are
        decided against a state no older than any answer a previous leader gave."""
        return (
            self.is_leader
            and self._lead_term == self.node.term
            and self.node.applied_index >= self._serve_from_index
        )

    @property
    def leader_id(self) -> int:
        """The Raft leader this peer knows of (0: none)."""
        return self.node.leader_id

    def group(self, key: GroupKey) -> BrokerGroup | None:
        return self.state.groups.get(key)

    def not_leader(self, why: str = "") -> ControllerError:
        if self.is_leader:
            why = why or "this peer was just elected and is applying the log first"
        return ControllerError(
            ControllerCode.CONTROLLER_NOT_LEADER,
            f"controller peer {self.node.config.node_id} is not the leader"
            + (f": {why}" if why else ""),
        )

    # -- inputs ------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        self.node.tick(now_ms)
        self._observe_leadership(now_ms)

    def step(self, msg: Message) -> None:
        """A Raft message from a peer (``RaftError`` if it is not for this group)."""
        self.node.step(msg)

    def heartbeat(self, heartbeat: BrokerHeartbeat, now_ms: int) -> bool:
        """Record a member's report; False (nothing kept) for a member the state does not
        know, so reports from anyone cannot grow the table without bound (a member
        heartbeats only after its id was applied; a peer still behind the log drops a
        report or two until it applies that)."""
        group = self.state.groups.get((heartbeat.cluster_name, heartbeat.broker_name))
        if group is None or heartbeat.broker_id not in group.members:
            return False
        self.liveness.record(heartbeat, now_ms)
        return True

    def node_heartbeat(self, heartbeat: NodeHeartbeat, now_ms: int) -> bool:
        """Record a node's report; False (nothing kept) for a node not registered."""
        if heartbeat.node not in self.state.nodes:
            return False
        self.nodes.record(heartbeat, now_ms)
        return True

    def broker_shutdown(self, notice: BrokerShutdown) -> bool:
        """Record a clean-shutdown notice; kept (True) only from the group's master at its
        current epoch: a slave stopping changes no election, and a notice for an older
        epoch is about a master already replaced."""
        key = (notice.cluster_name, notice.broker_name)
        group = self.state.groups.get(key)
        if group is None or (group.master_id, group.master_epoch) != (
            notice.broker_id,
            notice.epoch,
        ):
            return False
        self.liveness.shut_down(key, notice.epoch)
        return True

    def submit(self, request: Request, now_ms: int, callback: Callback) -> None:
        """Decide ``request`` on the leader and propose its event; ``callback`` gets the
        outcome exactly once: the applied event, or a refusal (a follower's is
        CONTROLLER_NOT_LEADER)."""
        self._observe_leadership(now_ms)
        if not self.serving:
            callback(self.not_leader())
            return
        decision = self._decide(request, now_ms)
        if isinstance(decision, ControllerError):
            callback(decision)
            return
        if not isinstance(request, GROUP_REQUESTS):
            if decision is None:
                callback(Applied(None, None))
            else:
                self._propose(decision, callback)
            return
        key = (request.cluster_name, request.broker_name)
        if isinstance(request, RegisterBrokerRequest):
            # a known member: what a restart election dates its reports by (this peer's
            # clock, this term); kept whether or not the address change commits
            self.liveness.registered(key, request.broker_id, now_ms)
        if decision is None:
            callback(Applied(None, self.state.groups.get(key)))
        else:
            self._propose(decision, callback)

    def scan(self, now_ms: int) -> list[ElectMasterRequest]:
        """The leader's master-timeout scan: elect for every group whose master stopped
        reporting (or which lost it and now has a candidate again). Returns the elections
        proposed; their outcome arrives as a ``GroupChanged``."""
        self._observe_leadership(now_ms)
        if not self.serving or now_ms - self._leading_since_ms < self.liveness.timeout_ms:
            return []
        proposed = []
        for key, group in list(self.state.groups.items()):
            if key in self._electing or not group.elected:
                continue  # the first election is the registering members' to ask for
            if group.master_id is not None and group.master_id in self.liveness.alive(key, now_ms):
                continue
            request = ElectMasterRequest(*key, ElectTrigger.MASTER_TIMEOUT)
            decision = self._decide(request, now_ms)
            if not isinstance(decision, ElectMaster):
                continue  # no master and still no candidate: nothing to end or start
            self._electing.add(key)
            self._propose(decision, self._election_done(key))
            proposed.append(request)
        return proposed

    def _election_done(self, key: GroupKey) -> Callback:
        def done(outcome: Outcome) -> None:
            self._electing.discard(key)

        return done

    # -- the Ready cycle ---------------------------------------------------------------------
    def start_cycle(self) -> Ready | None:
        return self.node.ready() if self.node.has_ready() else None

    def persist(self, ready: Ready) -> None:
        """Hard state, entries, fsync, checkpoint (a driver may run this in a worker
        thread). Controller traffic is small, so every Ready is fsynced whole: the
        checkpoint on disk then always covers what is applied, and so any snapshot."""
        persist(self.storage, ready)

    def finish_cycle(self, ready: Ready, now_ms: int) -> CycleOutput:
        out = CycleOutput(list(ready.messages))
        for entry in ready.committed_entries:
            self._apply(entry, out)
        for failed in ready.failed_proposals:
            callback = self._pending.pop(failed.entry_id, None)
            if callback is not None:
                callback(
                    self.not_leader("not committed in time; the outcome is unknown")
                    if failed.reason is FailureReason.TIMEOUT
                    else self.not_leader("leadership changed before commit; the outcome is unknown")
                )
        self.node.advance(ready)
        applied = self.node.applied_index
        if applied - self.snapshot_index >= self.settings.snapshot_interval_entries:
            out.snapshot = Snapshot(applied, encode_snapshot_at(applied, self.state))
            self.snapshot_index = applied
        self._observe_leadership(now_ms)
        return out

    def run_cycle(self, now_ms: int) -> CycleOutput | None:
        """The three steps at once (the simulator and tests)."""
        ready = self.start_cycle()
        if ready is None:
            return None
        self.persist(ready)
        return self.finish_cycle(ready, now_ms)

    def fail_all(self, why: str) -> None:
        """Answer every waiting proposal (the peer is stopping)."""
        pending, self._pending = self._pending, {}
        for callback in pending.values():
            callback(self.not_leader(why))

    # -- internals ---------------------------------------------------------------------------
    def _observe_leadership(self, now_ms: int) -> None:
        if self.node.role != Role.LEADER:
            self._lead_term = None
            self._electing.clear()
        elif self._lead_term != self.node.term:
            self._lead_term = self.node.term
            self._leading_since_ms = now_ms
            self.liveness.forget_registrations()
            # the no-op RawNode appended on winning is at or before the log's end
            self._serve_from_index = self.node.log.ledger_end_index

    def _decide(self, request: Request, now_ms: int) -> Event | ControllerError | None:
        state, liveness = self.state, self.liveness
        if not isinstance(request, GROUP_REQUESTS):
            return decide_catalog(state, request)
        if isinstance(request, ApplyBrokerIdRequest):
            return decide_apply_broker_id(state, request, now_ms)
        if isinstance(request, RegisterBrokerRequest):
            return decide_register_broker(state, request, now_ms)
        key = (request.cluster_name, request.broker_name)
        alive = liveness.alive(key, now_ms)
        group = state.groups.get(key)
        if (
            group is not None
            and group.master_id is not None
            and now_ms - self._leading_since_ms < liveness.timeout_ms
        ):
            # Reports from before this peer led may be partial (a restart, a cut link): until
            # it has led a whole heartbeat timeout, no request may treat the master as dead,
            # as the scan does not (DESIGN §5, apache/rocketmq #7689).
            alive |= {group.master_id}
        if isinstance(request, ElectMasterRequest):
            unclean = self.settings.enable_elect_unclean_master
            if group is not None:
                rules = rules_for_group(state.policies.values(), request.broker_name)
                unclean = unclean_allowed(rules, group, liveness.shutdown_epoch(key), unclean)
            return decide_elect_master(state, request, alive, liveness.live_info(key), unclean)
        if isinstance(request, AlterSyncStateSetRequest):
            return decide_alter_sync_state_set(state, request, alive)
        return decide_clean_broker_data(state, request, alive)

    def _propose(self, event: Event, callback: Callback) -> None:
        try:
            entry_id = self.node.propose(encode_event(event))
        except RaftError as err:  # stepped down, or moving leadership away
            callback(self.not_leader(str(err)))
            return
        self._pending[entry_id] = callback

    def _apply(self, entry: Entry, out: CycleOutput) -> None:
        if entry.is_noop:
            return
        callback = self._pending.pop(EntryId(entry.term, entry.index), None)
        outcome: Outcome
        try:
            event = decode_event(entry.data)
        except ControllerCodecError as err:
            # every peer holds the same bytes and skips them alike; nothing changes
            log.error("controller Raft entry %d is not an event (%s); skipped", entry.index, err)
            outcome = ControllerError(ControllerCode.CONTROLLER_INVALID_REQUEST, str(err))
        else:
            outcome = self._apply_event(event, out)
        if callback is not None:
            callback(outcome)

    def _apply_event(self, event: Event, out: CycleOutput) -> Outcome:
        if not isinstance(event, GROUP_EVENTS):
            if apply_event(self.state, event):
                return Applied(event, None)
            return ControllerError(
                ControllerCode.CONTROLLER_INVALID_REQUEST,
                f"{type(event).__name__} was refused when applied: a concurrent change "
                "to the catalog came first",
            )
        if not apply_event(self.state, event):
            return ControllerError(
                _REFUSED_AT_APPLY[type(event)],
                f"{type(event).__name__} of {event.broker_name} was refused when applied: "
                "a concurrent change to the group came first",
            )
        key = (event.cluster_name, event.broker_name)
        group = self.state.groups.get(key)
        if isinstance(event, CleanBrokerData):
            self.liveness.forget(key, event.broker_ids if group is not None else frozenset())
        if self.is_leader:
            out.changes.append(GroupChanged(key, event, group))
        return Applied(event, group)
