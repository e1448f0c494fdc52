"""The simulated world: virtual time, an event queue, and DLedger members running the
production code on simulated machines.

Every member is the broker's own ``DLedgerCore`` (Ready processing with send-before-persist,
the Raft log's periodic flush, applying to a ``MessageStore``, checkpoint claims, restart
recovery) over ``FileStorage`` and a message store on its own ``SimDisk``; only the event
loop, the sockets and the clocks are the world's. Faults: process kills (the page cache
survives), power losses (unfsynced data lost, torn, out of order across files), crashes
in the middle of a Ready, clean stops, disks replaced by empty ones (one at a time), full
disks, partitions, drops, duplicates, delays, and wall clocks that are skewed and jump.
One seed fixes everything, so a failing seed replays exactly; `trace_hash` digests every
event to prove it.
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import json
import random
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from hamq.broker.dledger.core import DLedgerCore
from hamq.broker.dledger.wire import KIND_DELETE_TOPIC, KIND_TOPIC, encode_command, encode_entry
from hamq.broker.role import BrokerRole, RoleState
from hamq.broker.topics import TopicService
from hamq.config import StoreConfig
from hamq.errors import HamqError, NotLeader
from hamq.protocol.message import encode_batch, encode_message
from hamq.raft import Entry, FileStorage, HardState, Message, RaftConfig, RaftError, Role
from hamq.raft.log import UNKNOWN_VOTE
from hamq.sim.checkers import Ack, Checkers, SafetyViolation, check_restart, check_stores
from hamq.sim.faults import FaultMix, choose_fault_mix
from hamq.sim.fs import DEFAULT_CAPACITY_BYTES, SimDisk
from hamq.sim.network import SimNetwork
from hamq.store.message_store import MessageStore, PutResult

TICK_MS = 10  # how often every live member's clock is advanced
DEFAULT_STEPS = 300  # ticks of the safety phase (3 s of virtual time)
LIVENESS_BOUND_MS = 10_000  # after faults stop, a send must be acknowledged within this
LIVENESS_RETRY_MS = 500  # the marker is sent again (to the current leader) this often
LIVENESS_MARKER = b"liveness"
CATCH_UP_MS = 5_000  # then members that still lag the leader are left out of queue checks
TOPICS = ("T0", "T1", "D")
DELETABLE = "D"  # the topic admins delete and create again; its sends are not tracked as
# acknowledged (a delete takes them away), its queues and bytes are checked like the rest
QUEUES = 2
MIN_FREE_BYTES = 4096  # the store's guard refuses sends below this (see FaultMix)
STORE_DIR = Path("/store")
RAFT_DIR = Path("/dledger")


class _Event(IntEnum):
    TICK = 1
    DELIVER = 2
    RESTART = 3
    HEAL = 4
    DISK_FREED = 5


class LivenessFailure(AssertionError):
    """The healed cluster did not acknowledge a send within LIVENESS_BOUND_MS."""


@dataclass(slots=True)
class SimResult:
    seed: int
    nodes: int
    ok: bool
    failure: str | None
    trace_hash: str
    virtual_ms: int
    messages_sent: int
    crashes: int
    committed: int
    acknowledged: int
    liveness_ms: int | None  # how long the healed cluster took to acknowledge the marker
    fault_mix: FaultMix | None = field(default=None, repr=False)


@dataclass(slots=True)
class _Process:
    """What a crash takes away: the member's objects in memory."""

    core: DLedgerCore
    store: MessageStore
    storage: FileStorage


@dataclass(slots=True)
class _Member:
    node_id: int
    disk: SimDisk
    clock_offset_ms: int  # wall clock minus virtual time: skew plus the jumps so far
    process: _Process | None = None
    applied_at_clean_stop: int | None = None
    # started on an empty disk (the group's start, or a wipe) and not vouched for since:
    # it votes for nobody (see raft/node.py)
    unvouched: bool = True
    was_leader: bool = False
    due_ms: dict[str, int] = field(default_factory=dict)  # next flush / checkpoint


class World:
    def __init__(self, seed: int, nodes: int | None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.mix = mix = choose_fault_mix(self.rng, nodes, random.Random(f"wipe-{seed}"))
        self.now_ms = 0
        self._queue: list[tuple[int, int, _Event, int, bytes]] = []
        self._seq = 0
        self._trace = hashlib.blake2b(b"seed=%d" % seed, digest_size=16)
        self.network = SimNetwork(self.rng, self._schedule_delivery)
        self.checkers = Checkers()
        self.acks: list[Ack] = []
        member_ids = tuple(range(1, mix.nodes + 1))
        self.members: dict[int, _Member] = {}
        for i in member_ids:
            skew = self.rng.randint(-mix.clock_skew_ms_max, mix.clock_skew_ms_max)
            member = _Member(i, SimDisk(), skew)
            self._attach_clock(member)
            self.members[i] = member
        self._raft_configs = {
            i: RaftConfig(
                node_id=i,
                member_ids=member_ids,
                max_entries_per_push=mix.max_entries_per_push,
                max_push_bytes=mix.max_push_bytes,
            )
            for i in member_ids
        }
        self._store_config = StoreConfig(
            store_dir=str(STORE_DIR),
            flush_disk_type=mix.flush_disk_type,
            mapped_file_size_commitlog=mix.commitlog_segment_bytes,
            disk_min_free_bytes=MIN_FREE_BYTES if mix.store_disk_guard else 0,
            disk_max_used_space_ratio=1.0,
        )
        self.crashes = 0
        self._sends = 0
        self._partitioned = False
        self._crash_during_persist_probability = 0.0
        self._workload_on = True
        self._marker_acked = False
        self.liveness_ms: int | None = None
        for member in self.members.values():
            self._start(member)

    def _wall_ms(self, member: _Member) -> int:
        return self.now_ms + member.clock_offset_ms

    def _attach_clock(self, member: _Member) -> None:
        member.disk.clock = lambda m=member: self._wall_ms(m) / 1000

    # ---- the event loop -------------------------------------------------------------

    def _push(self, at_ms: int, kind: _Event, target: int, payload: bytes = b"") -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_ms, self._seq, kind, target, payload))

    def _schedule_delivery(self, delay_ms: int, to_id: int, payload: bytes) -> None:
        self._push(self.now_ms + delay_ms, _Event.DELIVER, to_id, payload)

    def run_until(self, end_ms: int, faults: bool, stop_when_marker: bool = False) -> bool:
        """Process events until `end_ms`; True if stopped early because the marker was
        acknowledged."""
        while self._queue and self._queue[0][0] <= end_ms:
            at_ms, _, kind, target, payload = heapq.heappop(self._queue)
            self.now_ms = at_ms
            self._trace.update(b"%d|%d|%d|" % (at_ms, kind, target) + payload)
            if kind == _Event.TICK:
                self._on_tick(faults)
                self._push(at_ms + TICK_MS, _Event.TICK, 0)
            elif kind == _Event.DELIVER:
                self._deliver(target, payload)
            elif kind == _Event.RESTART:
                self._start(self.members[target])
            elif kind == _Event.DISK_FREED:
                self._free_disk(self.members[target])
            else:
                self.network.heal()
                self._partitioned = False
            self._check_leaders()
            if stop_when_marker and self._marker_acked:
                return True
        self.now_ms = end_ms
        return False

    def _on_tick(self, faults: bool) -> None:
        for member in self.members.values():
            if member.process is not None:
                applied = member.process.core.applied_index
                member.process.core.tick(self.now_ms)  # may apply a backlog
                self._check_applied(member, applied, [])
                self._background(member)
                self._drain(member)
        # a new group needs every member up once (raft/node.py): crashes, wipes and
        # partitions start once it has elected its first leader
        if faults and self.checkers.leaders_by_term:
            self._inject_faults()
        if self._workload_on:
            self._workload()

    def _deliver(self, to_id: int, payload: bytes) -> None:
        member = self.members[to_id]
        if member.process is None:
            return  # it is down: the message is lost
        member.process.core.node.step(Message.decode(payload))
        self._drain(member)

    # ---- a member: the production core on a simulated machine --------------------------

    def _start(self, member: _Member) -> None:
        if member.process is not None:
            return
        claim = self._claim_on_disk(member)
        disk = member.disk
        try:
            store = MessageStore(
                self._store_config, clock_ms=lambda: self._wall_ms(member), disk=disk
            )
            storage = FileStorage(
                RAFT_DIR, segment_max_bytes=self.mix.raft_segment_bytes, disk=disk
            )
            core = DLedgerCore(
                self._raft_configs[member.node_id],
                storage,
                store,
                TopicService(
                    store,
                    RoleState(BrokerRole.SLAVE, member.node_id),
                    default_queue_nums=QUEUES,
                    auto_create=False,
                    on_change=lambda: None,
                ),
                random.Random(self.rng.getrandbits(64)),
                self.now_ms,
                sync_appends=self.mix.flush_disk_type == "sync",
                send=self._send,
                on_applied=lambda arrived: None,
                not_leader=NotLeader,
            )
        except (HamqError, RaftError) as err:
            raise SafetyViolation(f"node {member.node_id} cannot restart: {err}") from err
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            # recovery could not write on a full disk: the process exits, and its
            # supervisor starts it again later
            disk.kill()
            self._push(
                self.now_ms + self.rng.randint(1, self.mix.restart_ms_max),
                _Event.RESTART,
                member.node_id,
            )
            return
        check_restart(member.node_id, claim, core.recovery, member.applied_at_clean_stop)
        member.process = _Process(core, store, storage)
        member.applied_at_clean_stop = None
        member.was_leader = False
        member.due_ms = {
            name: self.now_ms + self.rng.randint(1, period)
            for name, period in self._periods().items()
        }

    def _periods(self) -> dict[str, int]:
        mix = self.mix
        return {
            "store_flush": mix.store_flush_ms,
            "raft_flush": mix.raft_flush_ms,
            "checkpoint": mix.store_checkpoint_ms,
        }

    @staticmethod
    def _claim_on_disk(member: _Member) -> int | None:
        """The applied index the store checkpoint that survived claims (read before the
        store opens: its own recovery rewrites the checkpoint)."""
        try:
            checkpoint = json.loads(member.disk.read_bytes(STORE_DIR / "checkpoint"))
        except (OSError, ValueError):
            return None
        return checkpoint.get("applied_index")

    def _send(self, messages: list[Message]) -> None:
        for msg in messages:
            self.network.send(msg)

    def _drain(self, member: _Member) -> None:
        while member.process is not None:
            core = member.process.core
            cycle = core.start_cycle()
            if cycle is None:
                return
            ready = cycle.ready
            if ready.entries:
                self.checkers.on_persist(member.node_id, core.node, ready.entries)
            if self.rng.random() < self._crash_during_persist_probability:
                # before or after the write (a leader has shipped the entries already);
                # either way no answer, apply or advance happened
                if self.rng.random() < 0.5:
                    core.persist(cycle)
                self._crash(member, power_loss=self._power_loss_possible())
                return
            if not core.persist(cycle):
                return  # a full disk: the core writes the same Ready again later
            applied = core.applied_index
            core.finish_cycle(cycle, self.now_ms)
            self._trace.update(
                b"R%d|%d|%d|" % (member.node_id, len(ready.entries), core.applied_index)
            )
            self._check_applied(member, applied, ready.committed_entries)
            self.checkers.acknowledged.extend(ready.completed_proposals)

    def _check_applied(self, member: _Member, applied: int, handed_out: list[Entry]) -> None:
        """Feed the Raft checkers what the core applied since `applied`: the Ready's
        entries, or (a backlog, after a pause) entries read back from the log."""
        assert member.process is not None
        core = member.process.core
        if core.applied_index <= applied:
            return
        entries = [e for e in handed_out if applied < e.index <= core.applied_index]
        if (
            not entries
            or entries[0].index != applied + 1
            or entries[-1].index != core.applied_index
        ):
            entries = core.node.log.entries(applied + 1, core.applied_index + 1)
        self.checkers.on_apply(member.node_id, applied, entries)

    def _background(self, member: _Member) -> None:
        """The flush and checkpoint services, each on its own period."""
        process, due = member.process, member.due_ms
        assert process is not None
        periods = self._periods()
        for name in sorted(due):
            if self.now_ms < due[name]:
                continue
            due[name] = self.now_ms + periods[name]
            if name == "raft_flush":
                job = process.core.begin_flush()
                try:
                    process.core.run_flush(job)
                except OSError:  # a full disk: the driver keeps it for the next flush
                    process.core.flush_failed(job)
                else:
                    process.core.flush_done(job)
                continue
            try:
                if name == "store_flush":
                    process.store.commitlog.flush()
                else:
                    process.store.sync_files(process.store.write_consume_queues())
                    process.store.write_checkpoint()
            except OSError:
                pass  # a full disk: the broker's periodic service logs it, runs again

    def _power_loss_possible(self) -> bool:
        """Half the crashes that may be power losses are (see FaultMix)."""
        return self.mix.power_loss_probability > 0 and self.rng.random() < 0.5

    def _crash(self, member: _Member, power_loss: bool) -> None:
        assert member.process is not None
        # terms and votes are fsynced when written: a restart finds this one
        hard_state = member.process.storage.load_hard_state()
        member.unvouched = hard_state in (HardState(), HardState(hard_state.term, UNKNOWN_VOTE))
        member.process = None
        if power_loss:
            member.disk.power_loss(self.rng)
        else:
            member.disk.kill()
        self.crashes += 1
        self._push(
            self.now_ms + self.rng.randint(1, self.mix.restart_ms_max),
            _Event.RESTART,
            member.node_id,
        )

    def _wipe(self, member: _Member) -> None:
        """The member's machine comes back with an empty disk (a disk replaced, a volume
        lost): it knows nothing, not even the votes it gave."""
        self._crash(member, power_loss=False)
        member.disk = SimDisk()
        self._attach_clock(member)
        member.unvouched = True

    def _unvouched(self) -> set[int]:
        """Members that vote for nobody, or will once restarted (as their disk says)."""
        for member in self.members.values():
            if member.process is not None:
                member.unvouched = member.process.core.node.voted_for == UNKNOWN_VOTE
        return {m.node_id for m in self.members.values() if m.unvouched}

    def _free_disk(self, member: _Member) -> None:
        """Space came back; the store notices at its next disk check."""
        member.disk.capacity_bytes = DEFAULT_CAPACITY_BYTES
        if member.process is not None:
            member.process.store.check_disk()

    def _stop_cleanly(self, member: _Member) -> None:
        """The broker's shutdown order: the DLedger part flushes its log, then the store
        closes (flushing and checkpointing what it applied)."""
        process = member.process
        assert process is not None
        job = process.core.begin_flush()
        clean = not process.core.stopped_mid_entry  # else it re-applies that entry's start
        try:
            process.core.run_flush(job)
            process.core.flush_done(job)
        except OSError:  # a full disk: the driver logs it, the restart re-applies the tail
            clean = False
        process.core.fail_all(NotLeader("member shutting down"))
        process.storage.close()
        try:
            process.store.close()
        except OSError:  # a full disk: its checkpoint stays the last one written
            clean = False
        member.applied_at_clean_stop = process.core.applied_index if clean else None
        member.process = None
        member.disk.kill()  # the process exits: any handle left open is gone
        self._push(
            self.now_ms + self.rng.randint(1, self.mix.restart_ms_max),
            _Event.RESTART,
            member.node_id,
        )

    # ---- faults and workload -----------------------------------------------------------

    def _inject_faults(self) -> None:
        rng, mix = self.rng, self.mix
        live = [m for m in self.members.values() if m.process is not None]
        if live and rng.random() < mix.kill_probability:
            self._crash(rng.choice(live), power_loss=False)
        elif live and rng.random() < mix.power_loss_probability:
            self._crash(rng.choice(live), power_loss=True)
        elif live and rng.random() < mix.clean_stop_probability:
            self._stop_cleanly(rng.choice(live))
        elif (
            mix.disk_wipe_probability
            and rng.random() < mix.disk_wipe_probability
            and mix.nodes > 1
            and live
            and not self._unvouched()
        ):
            self._wipe(rng.choice(live))
        if mix.disk_full_probability and rng.random() < mix.disk_full_probability and live:
            full = rng.choice(live)
            full.disk.capacity_bytes = full.disk.used_bytes() + rng.randint(0, MIN_FREE_BYTES)
            # the broker's periodic disk check, at once: the store refuses sends before
            # the disk is full (RocketMQ's guard, if the mix has it); the Raft log has none
            if full.process is not None:  # (it may have crashed in this very tick)
                full.process.store.check_disk()
            self._push(
                self.now_ms + rng.randint(1, mix.heal_ms_max), _Event.DISK_FREED, full.node_id
            )
        if rng.random() < mix.clock_jump_probability:
            member = rng.choice(list(self.members.values()))
            member.clock_offset_ms += rng.randint(-mix.clock_jump_ms_max, mix.clock_jump_ms_max)
        if not self._partitioned and mix.nodes > 1 and rng.random() < mix.partition_probability:
            ids = list(self.members)
            rng.shuffle(ids)
            cut = rng.randint(1, len(ids) - 1)
            self.network.split(ids[:cut], ids[cut:], one_way=mix.one_way_partitions)
            self._partitioned = True
            self._push(self.now_ms + rng.randint(1, mix.heal_ms_max), _Event.HEAL, 0)

    def _workload(self) -> None:
        rng, mix = self.rng, self.mix
        leader = self._live_leader()
        if leader is None or leader.process is None:
            return
        core = leader.process.core
        try:
            if rng.random() < mix.topic_probability:
                if rng.random() < 0.5:
                    core.propose(
                        encode_command([KIND_DELETE_TOPIC, DELETABLE]), _ignore, alone=True
                    )
                else:
                    core.propose(
                        encode_command([KIND_TOPIC, rng.choice(TOPICS), QUEUES, QUEUES, 6]), _ignore
                    )
            if rng.random() < mix.proposal_probability:
                for _ in range(rng.randint(1, 3)):
                    self._sends += 1
                    self._propose_send(leader, b"s%d-p%d" % (self.seed, self._sends))
            if mix.nodes > 1 and rng.random() < mix.transfer_probability:
                core.node.transfer_leadership(rng.choice(core.node.config.peer_ids))
        except (HamqError, RaftError):
            pass  # e.g. a transfer is under way: clients retry elsewhere
        self._drain(leader)

    def _propose_send(
        self, leader: _Member, body: bytes, topic: str | None = None, queue_id: int | None = None
    ) -> None:
        assert leader.process is not None
        topic = topic or self.rng.choice(TOPICS)
        queue_id = self.rng.randrange(QUEUES) if queue_id is None else queue_id
        payload, crc = encode_batch([encode_message(body)])
        wall = self._wall_ms(leader)

        def answered(result: PutResult | None, err: HamqError | None) -> None:
            if result is None or topic == DELETABLE:
                return
            self.acks.append(
                Ack(topic, queue_id, body, result.physical_offset, result.base_queue_offset)
            )
            if body == LIVENESS_MARKER:
                self._marker_acked = True

        leader.process.core.propose(
            encode_entry(topic, queue_id, 1, crc, wall, wall, payload), answered
        )

    # ---- checks -------------------------------------------------------------------------

    def _check_leaders(self) -> None:
        for member in self.members.values():
            node = member.process.core.node if member.process is not None else None
            is_leader = node is not None and node.role == Role.LEADER
            if is_leader:
                assert node is not None
                self.checkers.on_leader(member.node_id, node)
                if not member.was_leader:
                    self.checkers.on_elected(member.node_id, node)
            member.was_leader = is_leader

    # ---- phases -------------------------------------------------------------------------

    def run(self, steps: int) -> None:
        self._crash_during_persist_probability = self.mix.crash_during_persist_probability
        self.network.drop_probability = self.mix.drop_probability
        self.network.duplicate_probability = self.mix.duplicate_probability
        self.network.delay_ms_max = self.mix.delay_ms_max
        self._push(TICK_MS, _Event.TICK, 0)
        self.run_until(steps * TICK_MS, faults=True)
        self._liveness_phase()

    def _liveness_phase(self) -> None:
        """Faults stop; all but a minority of members come back; a send must be
        acknowledged; then every live member's store is checked against the others."""
        self._crash_during_persist_probability = 0.0
        self.network.drop_probability = 0.0
        self.network.duplicate_probability = 0.0
        self.network.heal()
        self._partitioned = False
        for member in self.members.values():
            self._free_disk(member)
        # a member that votes for nobody yet is as good as down: while there is one, all
        # come back (a new group needs every member once, a wiped one a majority besides it)
        ids = list(self.members)
        kept_down: set[int] = (
            set()
            if self._unvouched()
            else set(self.rng.sample(ids, self.rng.randint(0, (len(ids) - 1) // 2)))
        )
        for member in self.members.values():
            if member.process is None and member.node_id not in kept_down:
                self._start(member)
            elif member.process is not None and member.node_id in kept_down:
                self._crash(member, power_loss=self._power_loss_possible())
        self._queue = [
            e for e in self._queue if e[2] not in (_Event.RESTART, _Event.HEAL, _Event.DISK_FREED)
        ]
        heapq.heapify(self._queue)
        self._workload_on = False  # only the marker is sent now
        healed_at_ms = self.now_ms
        deadline = healed_at_ms + LIVENESS_BOUND_MS
        while self.now_ms < deadline:
            leader = self._live_leader()
            if leader is not None and leader.process is not None:
                try:
                    self._propose_send(leader, LIVENESS_MARKER, TOPICS[0], 0)
                except HamqError:
                    pass
                self._drain(leader)
            if self.run_until(
                min(deadline, self.now_ms + LIVENESS_RETRY_MS), faults=False, stop_when_marker=True
            ):
                self.liveness_ms = self.now_ms - healed_at_ms
                self._final_checks()
                return
        raise LivenessFailure(f"nothing acknowledged within {LIVENESS_BOUND_MS} ms after healing")

    def _final_checks(self) -> None:
        leader = self._live_leader()
        if leader is None or leader.process is None:
            return
        self.checkers.check_final(leader.node_id, leader.process.core.node)
        # give every live member time to apply what the leader did (a topic delete waits
        # for the store's next claim), then compare the stores
        live = [m for m in self.members.values() if m.process is not None]
        deadline = self.now_ms + CATCH_UP_MS
        while (
            self.now_ms < deadline
            and leader.process is not None
            and any(
                m.process is not None
                and m.process.core.applied_index < leader.process.core.applied_index
                for m in live
            )
        ):
            self.run_until(self.now_ms + LIVENESS_RETRY_MS, faults=False)
        if leader.process is None or any(m.process is None for m in live):
            return
        applied = leader.process.core.applied_index
        check_stores(
            {m.node_id: m.process.store for m in live},
            leader.node_id,
            self.acks,
            {m.node_id for m in live if m.process.core.applied_index == applied},
        )

    def _live_leader(self) -> _Member | None:
        leaders = [
            m for m in self.members.values() if m.process is not None and m.process.core.is_leader
        ]
        return max(
            leaders, key=lambda m: m.process.core.node.term if m.process else 0, default=None
        )

    def result(self, failure: str | None) -> SimResult:
        return SimResult(
            seed=self.seed,
            nodes=self.mix.nodes,
            ok=failure is None,
            failure=failure,
            trace_hash=self._trace.hexdigest(),
            virtual_ms=self.now_ms,
            messages_sent=self.network.sent,
            crashes=self.crashes,
            committed=len(self.checkers.committed),
            acknowledged=len(self.acks),
            liveness_ms=self.liveness_ms,
            fault_mix=self.mix,
        )


def _ignore(result: PutResult | None, err: HamqError | None) -> None:
    """An admin's topic change: nobody waits for its answer here."""


def run_seed(seed: int, steps: int = DEFAULT_STEPS, nodes: int | None = None) -> SimResult:
    """Run one seeded schedule: a safety phase with faults, then a liveness phase."""
    world = World(seed, nodes)
    try:
        world.run(steps)
    except (SafetyViolation, LivenessFailure, AssertionError) as exc:
        return world.result(f"{type(exc).__name__}: {exc}")
    return world.result(None)


def failed_seeds(first: int, count: int, steps: int = DEFAULT_STEPS) -> list[SimResult]:
    """Run seeds first..first+count-1 and return the failures (a picklable unit of work
    for process pools)."""
    results = (run_seed(seed, steps=steps) for seed in range(first, first + count))
    return [result for result in results if not result.ok]
