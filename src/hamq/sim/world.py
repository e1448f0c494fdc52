"""The simulated world: virtual time, an event queue, and the members' drivers.

One seed fixes everything (cluster size, faults, workload, timers), so a failing seed
replays exactly; `trace_hash` digests every event to prove it.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from dataclasses import dataclass, field
from enum import IntEnum

from hamq.raft.config import RaftConfig
from hamq.raft.errors import RaftError
from hamq.raft.messages import Message
from hamq.raft.node import RawNode, Role
from hamq.sim.checkers import Checkers, SafetyViolation
from hamq.sim.disk import SimDisk
from hamq.sim.faults import FaultMix, choose_fault_mix
from hamq.sim.network import SimNetwork

TICK_MS = 10  # how often every live member's clock is advanced
DEFAULT_STEPS = 300  # ticks of the safety phase (3 s of virtual time)
LIVENESS_BOUND_MS = 10_000  # after faults stop, a proposal must commit within this
LIVENESS_RETRY_MS = 500  # the marker is proposed again (to the current leader) this often
LIVENESS_MARKER = b"liveness"


class _Event(IntEnum):
    TICK = 1
    DELIVER = 2
    RESTART = 3
    HEAL = 4


class LivenessFailure(AssertionError):
    """The healed cluster did not commit a proposal within LIVENESS_BOUND_MS."""


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
    liveness_ms: int | None  # how long the healed cluster took to commit the marker
    fault_mix: FaultMix | None = field(default=None, repr=False)


@dataclass(slots=True)
class _Member:
    node_id: int
    disk: SimDisk
    node: RawNode | None = None  # None while crashed
    applied_index: int = -1
    was_leader: bool = False


class World:
    def __init__(self, seed: int, nodes: int | None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.mix = choose_fault_mix(self.rng, nodes)
        self.now_ms = 0
        self._queue: list[tuple[int, int, _Event, int, bytes]] = []
        self._seq = 0
        self._trace = hashlib.blake2b(b"seed=%d" % seed, digest_size=16)
        self.network = SimNetwork(self.rng, self._schedule_delivery)
        self.checkers = Checkers()
        member_ids = tuple(range(1, self.mix.nodes + 1))
        self.members = {i: _Member(i, SimDisk()) for i in member_ids}
        self._configs = {
            i: RaftConfig(node_id=i, member_ids=member_ids,
                          max_entries_per_push=self.mix.max_entries_per_push,
                          max_push_bytes=self.mix.max_push_bytes)
            for i in member_ids}
        self.crashes = 0
        self._proposals = 0
        self._partitioned = False
        self._crash_during_persist_probability = 0.0
        self._workload_on = True
        self._marker_committed = False
        self.liveness_ms: int | None = None
        for member in self.members.values():
            self._start(member)

    # ---- the event loop -------------------------------------------------------------

    def _push(self, at_ms: int, kind: _Event, target: int, payload: bytes = b"") -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_ms, self._seq, kind, target, payload))

    def _schedule_delivery(self, delay_ms: int, to_id: int, payload: bytes) -> None:
        self._push(self.now_ms + delay_ms, _Event.DELIVER, to_id, payload)

    def run_until(self, end_ms: int, faults: bool, stop_when_marker: bool = False) -> bool:
        """Process events until `end_ms`; True if stopped early because the marker committed."""
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
            else:
                self.network.heal()
                self._partitioned = False
            self._check_leaders()
            if stop_when_marker and self._marker_committed:
                return True
        self.now_ms = end_ms
        return False

    def _on_tick(self, faults: bool) -> None:
        for member in self.members.values():
            if member.node is not None:
                member.node.tick(self.now_ms)
                self._drain(member)
        if faults:
            self._inject_faults()
        if self._workload_on:
            self._workload()

    def _deliver(self, to_id: int, payload: bytes) -> None:
        member = self.members[to_id]
        if member.node is None:
            return  # it is down: the message is lost
        member.node.step(Message.decode(payload))
        self._drain(member)

    # ---- a member's driver: the Ready contract ---------------------------------------

    def _start(self, member: _Member) -> None:
        # a restarted member rebuilds its state machine from the log: applied = -1
        member.node = RawNode(self._configs[member.node_id], member.disk,
                              random.Random(self.rng.getrandbits(64)), now_ms=self.now_ms)
        member.applied_index = -1
        member.was_leader = False

    def _crash(self, member: _Member) -> None:
        assert member.node is not None
        member.disk.crash(self.rng)
        member.node = None
        self.crashes += 1
        self._push(self.now_ms + self.rng.randint(1, self.mix.restart_ms_max),
                   _Event.RESTART, member.node_id)

    def _drain(self, member: _Member) -> None:
        node = member.node
        while node is not None and node.has_ready():
            ready = node.ready()
            disk = member.disk
            if ready.hard_state is not None:
                disk.save_hard_state(ready.hard_state)
            if ready.entries:
                self.checkers.on_persist(member.node_id, node, ready.entries)
                disk.append(ready.entries)
            if ready.checkpoint is not None:
                disk.save_checkpoint(ready.checkpoint)
            if self.rng.random() < self._crash_during_persist_probability:
                self._crash(member)  # before the sync: nothing of this Ready was sent
                return
            disk.sync()
            self._trace.update(b"R%d|%d|%d|" % (member.node_id, len(ready.entries),
                                                member.applied_index))
            for msg in ready.messages:
                self.network.send(msg)
            member.applied_index = self.checkers.on_apply(
                member.node_id, member.applied_index, ready.committed_entries)
            self.checkers.acknowledged.extend(ready.completed_proposals)
            if any(e.data == LIVENESS_MARKER for e in ready.committed_entries):
                self._marker_committed = True
            node.advance(ready)

    # ---- faults and workload -----------------------------------------------------------

    def _inject_faults(self) -> None:
        rng, mix = self.rng, self.mix
        live = [m for m in self.members.values() if m.node is not None]
        if live and rng.random() < mix.crash_probability:
            self._crash(rng.choice(live))
        if not self._partitioned and mix.nodes > 1 and rng.random() < mix.partition_probability:
            ids = list(self.members)
            rng.shuffle(ids)
            cut = rng.randint(1, len(ids) - 1)
            self.network.split(ids[:cut], ids[cut:], one_way=mix.one_way_partitions)
            self._partitioned = True
            self._push(self.now_ms + rng.randint(1, mix.heal_ms_max), _Event.HEAL, 0)

    def _workload(self) -> None:
        rng, mix = self.rng, self.mix
        leaders = [m for m in self.members.values() if m.node is not None
                   and m.node.role == Role.LEADER]
        if not leaders:
            return
        member = rng.choice(leaders)
        assert member.node is not None
        try:
            if rng.random() < mix.proposal_probability:
                self._proposals += 1
                member.node.propose(b"s%d-p%d" % (self.seed, self._proposals))
            if mix.nodes > 1 and rng.random() < mix.transfer_probability:
                member.node.transfer_leadership(rng.choice(member.node.config.peer_ids))
        except RaftError:
            pass  # e.g. a transfer is under way: clients retry elsewhere
        self._drain(member)

    # ---- checks -------------------------------------------------------------------------

    def _check_leaders(self) -> None:
        for member in self.members.values():
            node = member.node
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
        """Faults stop; all but a minority of members come back; a proposal must commit."""
        self._crash_during_persist_probability = 0.0
        self.network.drop_probability = 0.0
        self.network.duplicate_probability = 0.0
        self.network.heal()
        self._partitioned = False
        ids = list(self.members)
        kept_down = set(self.rng.sample(ids, self.rng.randint(0, (len(ids) - 1) // 2)))
        for member in self.members.values():
            if member.node is None and member.node_id not in kept_down:
                self._start(member)
            elif member.node is not None and member.node_id in kept_down:
                member.disk.crash(self.rng)
                member.node = None
        self._queue = [e for e in self._queue if e[2] not in (_Event.RESTART, _Event.HEAL)]
        heapq.heapify(self._queue)
        self._workload_on = False  # only the marker is proposed now
        healed_at_ms = self.now_ms
        deadline = healed_at_ms + LIVENESS_BOUND_MS
        while self.now_ms < deadline:
            leader = self._live_leader()
            if leader is not None and leader.node is not None:
                try:
                    leader.node.propose(LIVENESS_MARKER)
                except RaftError:
                    pass
                self._drain(leader)
            if self.run_until(min(deadline, self.now_ms + LIVENESS_RETRY_MS), faults=False,
                              stop_when_marker=True):
                self.liveness_ms = self.now_ms - healed_at_ms
                leader = self._live_leader()
                if leader is not None and leader.node is not None:
                    self.checkers.check_final(leader.node_id, leader.node)
                return
        raise LivenessFailure(f"nothing committed within {LIVENESS_BOUND_MS} ms after healing")

    def _live_leader(self) -> _Member | None:
        leaders = [m for m in self.members.values()
                   if m.node is not None and m.node.role == Role.LEADER]
        return max(leaders, key=lambda m: m.node.term if m.node else 0, default=None)

    def result(self, failure: str | None) -> SimResult:
        return SimResult(
            seed=self.seed, nodes=self.mix.nodes, ok=failure is None, failure=failure,
            trace_hash=self._trace.hexdigest(), virtual_ms=self.now_ms,
            messages_sent=self.network.sent, crashes=self.crashes,
            committed=len(self.checkers.committed),
            acknowledged=len(self.checkers.acknowledged), liveness_ms=self.liveness_ms,
            fault_mix=self.mix,
        )


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
