"""Mirrored-queue policies under the simulator (seed 003): the production reconciler
(``policy.placement.reconcile``), the placement driver's pure parts (``build_world``,
``orphans``, ``unplaced_groups``, ``round_steps``, ``removal_refusal``,
``election_refusal``, ``topic_drained``, ``strays``), the controller's ``apply_event``
and ``decide_elect_master`` with the policies' promotion rules, and the master's
``SyncStateSet`` gated on the need offset (``replication.need_offset``), over a simulated
cluster of nodes.

Nodes join, crash (cleanly or not) and come back with their disks, and are cut off from
everyone; policies are set, changed and cleared; topics are declared and move between
groups. Each member has a log (start, end, message ids); a master ships to its slaves,
acks a send once every member of its effective SyncStateSet holds it (all-ack), and one
consumer per group commits as it reads. The driver runs a round every ``ROUND_TICKS``
and carries each group's steps out in the driver's order (``_take``, ``_remove_member``,
``_collect``, ``_drop`` mirror ``controller_server/placement/driver.py`` step by step,
and like it a task stops once its leader's term is over) with delays, failed
requests, lost answers and repeats; now and then a new leader takes over remembering
nothing (the old leader's steps in flight still reach the brokers, its commits fail).
The checkers (``policy_checkers``) run after every commit and every tick; then the faults
stop and the world must settle on the policies' nodes within ``SETTLE_TICKS``.

What is modelled rather than run: the network (a node is reachable or cut off from
everyone), HA transfer (a slave copies a few records a tick; an attach truncates it to
where it agrees with the master), the consumer (one offset per group, in log order),
the brokers' topic configs (one perm per topic and group).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from hamq.controller import elect as elections
from hamq.controller.apply import apply_event
from hamq.controller.decide import decide_elect_master
from hamq.controller.events import (
    AlterSyncStateSet,
    ApplyBrokerId,
    CleanBrokerData,
    ClearPolicy,
    DeclareTopic,
    DeleteTopic,
    ElectMaster,
    Event,
    RegisterNode,
    SetPolicy,
    SetTopicGroups,
)
from hamq.controller.requests import ElectMasterRequest, ElectTrigger
from hamq.controller.state import BrokerGroup, ControllerState, GroupKey
from hamq.controller_server import placement as driver
from hamq.policy import placement as policy
from hamq.policy.definition import Policy, make_policy
from hamq.replication.need_offset import QueueProgress, first_needed, need_offset
from hamq.replication.sync_state_set import SyncStateSet
from hamq.sim import policy_checkers as checks

CLUSTER = "hamq"
TICK_MS = 100
ROUND_TICKS = 2  # placement_interval_ms
HEARTBEAT_TIMEOUT_TICKS = 3  # node and member heartbeats
SLOW_REQUEST = 0.5  # a drop's delete landing late (``_slow``)
NOT_CATCHUP_MS = 1_000
# the controller looks for masters it no longer hears every few ticks, not every tick:
# between two scans a dead master is still the group's master
ELECTION_SCAN_TICKS = 3
FAULT_TICKS = 250
SETTLE_TICKS = 100  # K = 50 rounds after the faults stop before the world must have settled
SETTLE_SHIP = 20
TOPICS = tuple(f"t{i}" for i in range(6))
PERM_READ, PERM_READ_WRITE = 4, 6


@dataclass
class SimNode:
    name: str
    up: bool = True
    cut: bool = False  # partitioned from everyone (controller, clients, other nodes)

    @property
    def reachable(self) -> bool:
        return self.up and not self.cut


@dataclass
class SimMember:
    """One member process and its store: ``log[i]`` is the message id at offset i, for
    ``start <= i < len(log)``; below ``start`` the log holds nothing."""

    group: str
    broker_id: int
    node: str
    ha_join: str
    log: list[int] = field(default_factory=list)
    start: int = 0
    removed: bool = False  # stopped and its store deleted by REMOVE_BROKER, or forgotten
    attached_epoch: int = -1  # master epoch of its last attach as a slave (it reports it)
    # its HA session as a slave: the master's set it attached to (None: none; a session
    # ends when either side stops)
    session: SyncStateSet | None = None
    sss: SyncStateSet | None = None  # while it serves as master
    sss_epoch: int = -1
    served_epoch: int = -1  # the last epoch it served as master (its epoch file keeps it)
    up_since: int = 0  # the tick it (re)started and registered

    @property
    def end(self) -> int:
        return len(self.log)

    def holds(self, offset: int, msg: int) -> bool:
        return self.start <= offset < self.end and self.log[offset] == msg


@dataclass(frozen=True)
class Acked:
    group: str
    offset: int
    msg: int
    tick: int


@dataclass
class GroupData:
    """A group's broker-side state kept by its members together: topic configs (perm per
    topic, a slave follows its master's), the consumer's committed offset."""

    perms: dict[str, int] = field(default_factory=dict)
    consumed: int | None = None  # None: no consumer group has an offset yet
    unclean_tick: int = -1  # the last unclean election: what was acked before may be lost
    shutdown_epoch: int | None = None


@dataclass
class Task:
    """A group's steps being carried out: a generator yielding tick delays."""

    group: str
    run: Iterator[int]
    due: int
    leader: int
    counted: bool = True  # holds the group busy (an old leader's does not)


@dataclass
class PolicyResult:
    seed: int
    ok: bool
    failure: str | None
    nodes: int
    steps: int
    refused: int
    acked: int
    elections: int
    leader_changes: int


@dataclass
class Mix:
    """Each seed's own fault mix (swarm testing): some calm, some storms."""

    crash: float
    clean_stop: float
    back: float
    cut: float
    heal: float
    join: float
    policy: float
    declare: float
    send: float
    consume: float
    fail: float  # a request fails before it has any effect
    lost_answer: float  # it takes effect but the driver hears a failure
    repeat: float  # a step done is carried out again (its answer was late: resent)
    leader_change: float
    delay_max: int
    ship: int  # records a slave copies per tick
    promote_always: float

    @classmethod
    def draw(cls, rng: random.Random) -> Mix:
        storm = rng.random()
        return cls(
            crash=0.03 * storm,
            clean_stop=0.01 * storm,
            back=rng.uniform(0.05, 0.3),
            cut=0.02 * storm,
            heal=rng.uniform(0.05, 0.3),
            join=rng.uniform(0.0, 0.02),
            policy=rng.uniform(0.01, 0.06),
            declare=rng.uniform(0.01, 0.05),
            send=rng.uniform(0.2, 0.9),
            consume=rng.uniform(0.0, 0.6),
            fail=rng.uniform(0.0, 0.3),
            lost_answer=rng.uniform(0.0, 0.2),
            repeat=rng.uniform(0.0, 0.2),
            leader_change=rng.uniform(0.0, 0.02),
            delay_max=rng.randint(0, 10),
            ship=rng.randint(1, 6),
            promote_always=rng.choice((0.0, 0.0, 0.3)),
        )


class Failed(Exception):
    """An invariant does not hold."""


class PolicyWorld:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        # faults added later draw apart, so a seed keeps the schedule it had without them
        self.later = random.Random(f"later-{seed}")
        self.slow = random.Random(f"slow-{seed}")
        self.mix = Mix.draw(self.rng)
        self.tick = 0
        self.faults = True
        self.state = ControllerState()
        self.nodes: dict[str, SimNode] = {}
        self.members: dict[tuple[str, int], SimMember] = {}
        self.data: dict[str, GroupData] = {}
        self.msg_topic: dict[int, str] = {}
        self.next_msg = 0
        self.pending: list[tuple[str, int, int, int]] = []  # group, epoch, offset, msg
        self.acked: list[Acked] = []
        self.heard_node: dict[str, int] = {}
        self.heard_member: dict[tuple[str, int], int] = {}
        self.reports: dict[str, frozenset[tuple[str, int]]] = {}  # node -> members it hosts
        self.live_info: dict[tuple[str, int], elections.BrokerLiveInfo] = {}
        # the driver's memory, lost with each new leader
        self.leader = 0
        self.serving_since = 0
        self.busy: dict[str, Task] = {}
        self.retired: set[policy.RetireTopic] = set()
        self.tasks: list[Task] = []
        self.acting = 0  # the leader whose task runs now
        self.plan: policy.Plan | None = None  # the last round's
        self.stats = {"steps": 0, "refused": 0, "elections": 0, "leaders": 0, "acked": 0}
        for i in range(self.rng.randint(2, 4)):
            self._join(f"hamq@n{i + 1}")

    # -- the controller's state, through the production apply ---------------------------
    def commit(self, event: Event) -> bool:
        return apply_event(self.state, event)

    def propose(self, event: Event | None) -> None:
        """The driver's commit through its own peer: refused once it no longer leads
        (``None``: only that check, for a request decided by the core)."""
        if self.acting != self.leader:
            raise RequestFailed("not the leader any more")
        if isinstance(event, SetTopicGroups):
            self.commit(event)
        elif event is not None:
            before = checks.synchronised_count(self, event.broker_name)
            self.commit(event)
            checks.after_step(self, event, event.broker_name, before)

    def group(self, name: str) -> BrokerGroup | None:
        return self.state.groups.get((CLUSTER, name))

    def controller_alive(self, key: GroupKey) -> frozenset[int]:
        """Members the controller heard from within the heartbeat timeout."""
        group = self.state.groups.get(key)
        if group is None:
            return frozenset()
        oldest = self.tick - HEARTBEAT_TIMEOUT_TICKS
        heard = self.heard_member
        return frozenset(i for i in group.members if heard.get((key[1], i), oldest - 1) >= oldest)

    def node_alive(self, name: str) -> bool:
        return self.tick - self.heard_node.get(name, -(10**9)) <= HEARTBEAT_TIMEOUT_TICKS

    def _join(self, name: str) -> None:
        self.nodes[name] = SimNode(name)
        self.commit(RegisterNode(name, f"{name}:10911"))

    # -- faults and clients --------------------------------------------------------------
    def _faults(self) -> None:
        rng, mix = self.rng, self.mix
        for node in self.nodes.values():
            if node.up and rng.random() < mix.crash + mix.clean_stop:
                node.up = False
                if rng.random() < mix.clean_stop / max(mix.crash + mix.clean_stop, 1e-9):
                    self._clean_shutdown(node.name)
            elif not node.up and rng.random() < mix.back:
                node.up = True
            if not node.cut and rng.random() < mix.cut:
                node.cut = True
            elif node.cut and rng.random() < mix.heal:
                node.cut = False
        if len(self.nodes) < 6 and rng.random() < mix.join:
            self._join(f"hamq@n{len(self.nodes) + 1}")
        if rng.random() < mix.policy:
            self._change_policy()
        if rng.random() < mix.declare:
            self._declare()
        if self.state.topics and self.later.random() < mix.declare / 4:
            # CONTROLLER_DELETE_TOPIC: the state only; the driver collects the queues
            self.commit(DeleteTopic("/", self.later.choice(sorted(self.state.topics))[1]))
        if rng.random() < mix.leader_change:
            self._new_leader()

    def _clean_shutdown(self, node: str) -> None:
        """CONTROLLER_BROKER_SHUTDOWN from each master on the node, for its epoch."""
        for key, group in self.state.groups.items():
            master = self.members.get((key[1], group.master_id or -1))
            if master is not None and master.node == node and not self.nodes[node].cut:
                self.data[key[1]].shutdown_epoch = group.master_epoch

    def _change_policy(self) -> None:
        rng = self.rng
        name = rng.choice(("p1", "p2", "p3"))
        if rng.random() < 0.2:
            self.commit(ClearPolicy("/", name))
            return
        mode = rng.choice(("all", "exactly", "exactly", "nodes"))
        definition: dict[str, object] = {"ha-mode": mode}
        if mode == "exactly":
            definition["ha-params"] = rng.randint(1, 3)
        elif mode == "nodes":
            definition["ha-params"] = rng.sample(sorted(self.nodes), rng.randint(1, 2))
        definition["ha-sync-mode"] = rng.choice(("manual", "automatic"))
        if rng.random() < self.mix.promote_always:
            definition["ha-promote-on-failure"] = "always"
        if rng.random() < 0.3:
            definition["queue-master-locator"] = rng.choice(
                ("min-masters", "client-local", "random")
            )
        pattern = rng.choice(("^t[0-2]$", "^t[3-5]$", "t", "^t1$", "^t[024]$"))
        made: Policy = make_policy("/", name, pattern, definition, priority=rng.randint(0, 2))
        self.commit(SetPolicy(made))

    def _declare(self) -> None:
        topic = self.rng.choice(TOPICS)
        if ("/", topic) in self.state.topics:
            return
        home = self.rng.choice(sorted(self.nodes))
        self.commit(DeclareTopic("/", topic, home, queue_nums=1))

    def _send(self) -> None:
        """A producer sends to a group where the topic is writable (the route)."""
        topics = [t for t in self.state.topics.values() if t.groups]
        if not topics or self.rng.random() >= self.mix.send:
            return
        topic = self.rng.choice(topics)
        routes = [g for g in topic.groups if self.data[g].perms.get(topic.name) == PERM_READ_WRITE]
        masters = [(g, m) for g in routes if (m := self.serving_master(g)) is not None]
        if not masters:
            return
        name, master = self.rng.choice(masters)
        msg = self.next_msg
        self.next_msg += 1
        self.msg_topic[msg] = topic.name
        master.log.append(msg)
        epoch = self.state.groups[(CLUSTER, name)].master_epoch
        self.pending.append((name, epoch, master.end - 1, msg))

    # -- members and replication ------------------------------------------------------------
    def up(self, member: SimMember) -> bool:
        return not member.removed and self.nodes[member.node].reachable

    def serving_master(self, name: str) -> SimMember | None:
        """The group's master, if it runs and is reachable (a cut-off old master serves
        nobody: clients cannot reach it either)."""
        group = self.group(name)
        if group is None or group.master_id is None:
            return None
        master = self.members.get((name, group.master_id))
        return master if master is not None and self.up(master) else None

    def _heartbeats(self) -> None:
        hosted: dict[str, set[tuple[str, int]]] = {name: set() for name in self.nodes}
        for key, member in self.members.items():
            if not member.removed:
                hosted[member.node].add(key)
        for node in self.nodes.values():
            if node.reachable:
                self.heard_node[node.name] = self.tick
                self.reports[node.name] = frozenset(hosted[node.name])
        for key, member in self.members.items():
            if not self.up(member):  # a stopped or cut-off member loses its sessions
                member.session, member.sss = None, None
                member.up_since = -1
            else:
                if member.up_since < 0:
                    member.up_since = self.tick
                self.heard_member[key] = self.tick
                self.live_info[key] = elections.BrokerLiveInfo(
                    member.attached_epoch, member.end, self.tick, member.up_since
                )

    def _elections(self) -> None:
        """The controller's own elections: a group whose master it no longer hears."""
        for key, group in list(self.state.groups.items()):
            alive = self.controller_alive(key)
            if group.master_id is not None and group.master_id in alive:
                continue
            self.elect(key, ElectTrigger.MASTER_TIMEOUT)

    def elect(self, key: GroupKey, trigger: ElectTrigger, broker_id: int | None = None) -> bool:
        """An election decided by the controller's own ``decide_elect_master``, with the
        group's promotion rules (``unclean_allowed``), and applied."""
        group = self.state.groups[key]
        data = self.data[key[1]]
        rules = policy.rules_for_group(self.state.policies.values(), key[1])
        unclean = elections.unclean_allowed(rules, group, data.shutdown_epoch, False)
        live = {i: info for (g, i), info in self.live_info.items() if g == key[1]}
        request = ElectMasterRequest(*key, trigger, broker_id, group.master_epoch)
        event = decide_elect_master(self.state, request, self.controller_alive(key), live, unclean)
        if not isinstance(event, ElectMaster) or not self.commit(event):
            return False
        if event.new_master_id is not None:
            self.stats["elections"] += 1
        if event.unclean:
            data.unclean_tick = self.tick
        return event.new_master_id is not None

    def _replicate(self) -> None:
        for (_, name), group in list(self.state.groups.items()):
            master = self.serving_master(name)
            if master is None:
                continue
            assert group.master_id is not None
            if master.sss is None or master.sss_epoch != group.master_epoch:
                if master.served_epoch == group.master_epoch:
                    # restarted: it never continues its epoch (ElectTrigger.MASTER_RESTART)
                    self.elect((CLUSTER, name), ElectTrigger.MASTER_RESTART, master.broker_id)
                    continue
                master.served_epoch = group.master_epoch
                master.sss = SyncStateSet(group.master_id, NOT_CATCHUP_MS)
                master.sss.apply(group.sync_state_set, group.sync_state_set_epoch)
                master.sss_epoch = group.master_epoch
                master.attached_epoch = group.master_epoch
            sss = master.sss
            # the master learns the set the controller holds (a removal changed it)
            sss.apply(group.sync_state_set, group.sync_state_set_epoch)
            sss.set_need_offset(self.need_offset(name, master))
            now_ms = self.tick * TICK_MS
            for broker_id in sorted(group.members):
                slave = self.members.get((name, broker_id))
                if slave is None or slave is master:
                    continue
                if not self.up(slave):
                    sss.on_disconnect(broker_id)
                    continue
                if slave.session is not sss:
                    self._attach(slave, master)
                    slave.attached_epoch, slave.session = group.master_epoch, sss
                    slave.sss = None
                    sss.on_connect(broker_id, slave.end, now_ms, slave.start)
                upto = min(master.end, slave.end + self.mix.ship)
                slave.log.extend(master.log[slave.end : upto])
                sss.on_transfer(broker_id, master.end, now_ms)
                sss.on_ack(broker_id, slave.end, slave.start)
                if sss.maybe_expand(broker_id, master.end):
                    self._alter(name, master, sss.effective)
            proposal = sss.change(now_ms, master.end)
            if proposal is not None:
                self._alter(name, master, proposal)
            self._ack(name, group.master_epoch, sss.confirm_offset(master.end), master)

    def need_offset(self, name: str, master: SimMember) -> int:
        """The production rule over the group's one queue (offsets are log offsets)."""
        consumed = self.data[name].consumed
        queue = QueueProgress(master.start, master.end, () if consumed is None else (consumed,))
        first = first_needed(queue)
        return need_offset(() if first is None else (first,), master.start, master.end)

    @staticmethod
    def _attach(slave: SimMember, master: SimMember) -> None:
        """HA attach: the slave keeps the prefix it shares with the master (truncating the
        rest); an empty slave starts at the master's log start (history) or end (tail)."""
        agree = slave.start
        while agree < min(slave.end, master.end) and slave.log[agree] == master.log[agree]:
            agree += 1
        if agree > slave.start and slave.start >= master.start:
            del slave.log[agree:]
            return
        start = master.start if slave.ha_join == "history" else master.end
        slave.log = [*master.log[:start]]
        slave.start = start

    def _alter(self, name: str, master: SimMember, proposal: frozenset[int]) -> None:
        """AlterSyncStateSet, applied by the controller (fenced by the epochs) and
        answered to the master at once."""
        group = self.state.groups[(CLUSTER, name)]
        assert master.sss is not None
        event = AlterSyncStateSet(
            CLUSTER,
            name,
            master.broker_id,
            group.master_epoch,
            proposal,
            group.sync_state_set_epoch + 1,
        )
        if self.commit(event):
            master.sss.apply(proposal, event.new_sync_state_set_epoch)
        else:
            master.sss.refused()

    def _ack(self, name: str, epoch: int, confirm: int, master: SimMember) -> None:
        still = []
        for pending in self.pending:
            group, sent_epoch, offset, msg = pending
            if group != name:
                still.append(pending)
            elif sent_epoch == epoch and offset < confirm and master.holds(offset, msg):
                self.acked.append(Acked(group, offset, msg, self.tick))
                self.stats["acked"] += 1
            elif sent_epoch == epoch and master.holds(offset, msg):
                still.append(pending)
        self.pending = still

    def _consume(self) -> None:
        """One consumer per group reads its master up to the confirm offset and commits."""
        for (_, name), _group in self.state.groups.items():
            master = self.serving_master(name)
            data = self.data[name]
            if master is None or master.sss is None:
                continue
            if self.faults and self.rng.random() >= self.mix.consume:
                continue
            confirm = master.sss.confirm_offset(master.end)
            data.consumed = max(data.consumed or 0, min(confirm, (data.consumed or 0) + 3))

    # -- the placement driver ---------------------------------------------------------------
    def _new_leader(self) -> None:
        """Another controller peer leads: the driver's memory goes; the old leader's steps
        in flight may still land (or not)."""
        self.leader += 1
        self.stats["leaders"] += 1
        self.serving_since = self.tick
        self.busy.clear()
        self.retired.clear()
        self.tasks = [t for t in self.tasks if self.rng.random() < 0.5]
        for task in self.tasks:
            task.counted = False

    def observed(self) -> driver.Observed:
        """As ``driver.observe`` reads the nodes' last heartbeats: a member two nodes list
        is placed on the alive one, then the first by name."""
        alive = frozenset(n for n in self.state.nodes if self.node_alive(n))
        where = {}
        for name in sorted(self.state.nodes, key=lambda n: (n not in alive, n), reverse=True):
            for key in self.reports.get(name, ()):
                where[key] = name
        return driver.Observed(alive, dict(self.state.nodes), where)

    def drained(self) -> frozenset[tuple[str, str, str]]:
        """The driver's drain check against each old group's serving master."""
        return frozenset(
            (decl.vhost, decl.name, name)
            for decl in self.state.topics.values()
            for name in decl.groups[:-1]
            if self._placement_drained(decl.name, name)
        )

    def _placement_drained(self, topic: str, name: str) -> bool:
        """``topic_drained`` on what the group's serving master holds (none: not drained)."""
        master = self.serving_master(name)
        if master is None:
            return False
        consumed = self.data[name].consumed
        mine = [
            i for i in range(master.start, master.end) if self.msg_topic.get(master.log[i]) == topic
        ]
        queue = driver.QueueState(0, 0, 0 if not mine else mine[-1] + 1)
        offsets = {} if consumed is None else {f"{topic}@c": {0: consumed}}
        return driver.topic_drained(topic, [queue], offsets)

    def _round(self) -> None:
        if self.tick - self.serving_since < HEARTBEAT_TIMEOUT_TICKS:
            return
        seen = self.observed()
        world = driver.build_world(
            self.state, seen, self.controller_alive, CLUSTER, self.drained(), "client-local"
        )
        plan = policy.reconcile(world)
        self.plan = plan
        self.retired.intersection_update(plan.steps)
        unplaced = driver.unplaced_groups(self.state, seen, self.controller_alive, CLUSTER)
        collect = [
            driver.CollectTopics(name)
            for (_, name) in sorted(self.state.groups)
            if name.startswith(driver.MANAGED_GROUP_PREFIXES)
        ]
        steps = (*driver.orphans(self.state, seen, CLUSTER), *plan.steps, *collect)
        for name, todo in driver.round_steps(steps, self.busy, unplaced).items():
            task = Task(name, self._carry_out(todo, seen), self.tick, self.leader)
            self.busy[name] = task
            self.tasks.append(task)

    def _run_tasks(self) -> None:
        for task in list(self.tasks):
            if task.due > self.tick:
                continue
            self.acting = task.leader
            delay = next(task.run, None)
            if delay is None:
                self.tasks.remove(task)
                if task.counted and self.busy.get(task.group) is task:
                    del self.busy[task.group]
            else:
                task.due = self.tick + delay

    def _carry_out(self, steps: tuple[driver.Step, ...], seen: driver.Observed) -> Iterator[int]:
        """``PlacementDriver._carry_out``: each step only while its leader still leads (a
        step already under way may still land)."""
        for step in steps:
            yield self._delay()
            if self.acting != self.leader:
                return
            try:
                yield from self._take(step, seen)
            except driver.StepRefused:
                self.stats["refused"] += 1
            except RequestFailed:
                pass
            if self.faults and self.rng.random() < self.mix.repeat:
                yield self._delay()
                if self.acting != self.leader:
                    return
                try:
                    yield from self._take(step, seen)
                except (driver.StepRefused, RequestFailed):
                    pass

    def _delay(self) -> int:
        return self.rng.randint(0, self.mix.delay_max) if self.faults else 0

    def _slow(self) -> int:
        """Now and then a request lands long after it was sent, later than a new leader's
        first round (a real one may take its 5 s timeout; a new leader waits one node
        heartbeat timeout): a deposed leader's step then lands on what the next did."""
        if self.faults and self.slow.random() < SLOW_REQUEST:
            return self.slow.randint(HEARTBEAT_TIMEOUT_TICKS, 20 * HEARTBEAT_TIMEOUT_TICKS)
        return 0

    def _request(self, node: str) -> None:
        """A request to ``node``, before its effect: it fails unless the node is reachable,
        and with faults now and then anyway (``_answer``, after the effect, may lose the
        answer)."""
        if not self.nodes[node].reachable or (self.faults and self.rng.random() < self.mix.fail):
            raise RequestFailed(node)

    def _answer(self) -> None:
        if self.faults and self.rng.random() < self.mix.lost_answer:
            raise RequestFailed("answer lost")

    def _take(self, step: driver.Step, seen: driver.Observed) -> Iterator[int]:
        self.stats["steps"] += 1
        if isinstance(step, policy.AddMember):
            self._add_member(step, seen)
        elif isinstance(step, policy.ElectMaster):
            self._elect_step(step)
        elif isinstance(step, policy.RemoveMember):
            yield from self._remove_member(step, seen)
        elif isinstance(step, policy.PlaceTopic):
            self._set_perm(step.topic, step.group, PERM_READ_WRITE)
            decl = self.state.topics.get((step.vhost, step.topic))
            if decl is not None and decl.groups[-1:] != (step.group,):
                groups = (*(g for g in decl.groups if g != step.group), step.group)
                self.propose(SetTopicGroups(step.vhost, step.topic, groups))
        elif isinstance(step, policy.RetireTopic):
            if step not in self.retired:
                self._set_perm(step.topic, step.group, PERM_READ)
                self.retired.add(step)
        elif isinstance(step, driver.CollectTopics):
            self._collect(step.group)
        elif isinstance(step, policy.DropTopic):
            yield from self._drop(step)

    def _drop(self, step: policy.DropTopic) -> Iterator[int]:
        """``PlacementDriver._drop``: never the writable group; read-only, then drained
        again, then deleted (a request later: the state may have moved on meanwhile)."""
        decl = self.state.topics.get((step.vhost, step.topic))
        if decl is not None:
            if decl.groups[-1:] == (step.group,):
                raise driver.StepRefused(f"{step.topic} in {step.group} is writable there")
            self._set_perm(step.topic, step.group, PERM_READ)
            if not self._placement_drained(step.topic, step.group):
                raise driver.StepRefused(f"{step.topic} in {step.group} is not drained")
            yield self._slow()
        self._master_node(step.group)
        self.data[step.group].perms.pop(step.topic, None)
        decl = self.state.topics.get((step.vhost, step.topic))
        if decl is not None and step.group in decl.groups:
            groups = tuple(g for g in decl.groups if g != step.group)
            self.propose(SetTopicGroups(step.vhost, step.topic, groups))

    def _collect(self, name: str) -> None:
        """``PlacementDriver._collect``, in its order: the topics the group's master holds
        that the state does not account for (``driver.strays``): an untracked placement is
        recorded as held, not writable, unless it becomes the topic's only group (then it
        is made writable first); then the topics whose writable group it is that its
        master lacks read-write (``driver.unwritable``) are made writable again."""
        if self.serving_master(name) is None:
            return
        self._master_node(name)
        found = driver.strays(self.state, name, list(self.data[name].perms))
        for vhost, topic in found.undeclared:
            if (vhost, topic) not in self.state.topics:
                self._master_node(name)
                self.data[name].perms.pop(topic, None)
        for vhost, topic in found.untracked:
            decl = self.state.topics.get((vhost, topic))
            if decl is not None and name not in decl.groups:
                if not decl.groups:  # to be its only, writable, group: made writable first
                    self._set_perm(topic, name, PERM_READ_WRITE)
                self.propose(SetTopicGroups(vhost, topic, (name, *decl.groups)))
        for vhost, topic in driver.unwritable(self.state, name, self.data[name].perms):
            decl = self.state.topics.get((vhost, topic))
            if decl is not None and decl.groups[-1:] == (name,) and self.acting == self.leader:
                self._set_perm(topic, name, PERM_READ_WRITE)

    def _add_member(self, step: policy.AddMember, seen: driver.Observed) -> None:
        if step.node not in seen.alive:
            raise driver.StepRefused(f"node {step.node} is not alive")
        self._request(step.node)
        if any(
            m.group == step.group and m.node == step.node and not m.removed
            for m in self.members.values()
        ):
            raise RequestFailed("a member of the group is on the node already")
        key = (CLUSTER, step.group)
        group = self.state.groups.get(key)
        broker_id = group.next_broker_id if group is not None else 1
        self.commit(ApplyBrokerId(*key, broker_id, f"{step.node}:{broker_id}", "x", 0))
        self.members[(step.group, broker_id)] = SimMember(
            step.group, broker_id, step.node, step.ha_join
        )
        self.data.setdefault(step.group, GroupData())
        self.heard_member[(step.group, broker_id)] = self.tick
        if self.state.groups[key].master_id is None:
            # the first registrant wins the group's first election
            self.elect(key, ElectTrigger.REGISTER, broker_id)
        self._answer()

    def _elect_step(self, step: policy.ElectMaster) -> None:
        key = (CLUSTER, step.group)
        group = self.state.groups.get(key)
        if group is None:
            raise driver.StepRefused(f"group {step.group} is not known")
        if group.master_id == step.broker_id:
            return
        self.propose(None)
        why = driver.election_refusal(group, step.broker_id, self.controller_alive(key))
        if why is not None:
            raise driver.StepRefused(why)
        before = checks.synchronised_count(self, step.group)
        elected = self.elect(key, ElectTrigger.ADMIN, step.broker_id)
        checks.after_step(self, step, step.group, before)
        if not elected:
            raise driver.StepRefused("the controller refused the election")

    def _remove_member(self, step: policy.RemoveMember, seen: driver.Observed) -> Iterator[int]:
        """The driver's removal, in its order: checked, forgotten by the controller
        (CleanBrokerData, which the apply refuses for the master of that moment), then
        REMOVE_BROKER to its node (stopping it and deleting its store). A member the
        controller no longer counts is an orphan: only stopped."""
        key = (CLUSTER, step.group)
        group = self.state.groups.get(key)
        if group is None:
            raise driver.StepRefused(f"group {step.group} is not known")
        on_node = step.node in seen.alive
        member = self.members.get((step.group, step.broker_id))
        if step.broker_id in group.members:
            why = driver.removal_refusal(group, step.broker_id, self.controller_alive(key))
            if why is not None:
                raise driver.StepRefused(why)
            self.propose(CleanBrokerData(*key, frozenset({step.broker_id})))
            if step.broker_id in self.state.groups.get(key, _EMPTY).members:
                raise driver.StepRefused(f"member {step.broker_id} became master")
            if member is not None and not on_node:
                member.removed = True  # gone with its node; its container drops it on return
        if on_node:
            yield self._delay()
            self._request(step.node)
            if member is not None and member.node == step.node and not member.removed:
                checks.before_store_deleted(self, member)
                member.removed = True
                member.log, member.start = [], 0
            self._answer()

    def _master_node(self, name: str) -> str:
        group = self.group(name)
        alive = self.controller_alive((CLUSTER, name))
        if group is None or group.master_id is None or group.master_id not in alive:
            raise driver.StepRefused(f"group {name} has no alive master")
        node = self.members[(name, group.master_id)].node
        self._request(node)
        return node

    def _set_perm(self, topic: str, name: str, perm: int) -> None:
        if ("/", topic) not in self.state.topics:
            return
        self._master_node(name)
        self.data.setdefault(name, GroupData()).perms[topic] = perm
        self._answer()

    # -- the run ----------------------------------------------------------------------------
    def step(self) -> None:
        self.tick += 1
        if self.faults:
            self._faults()
        self._heartbeats()
        if self.tick % ELECTION_SCAN_TICKS == 0:
            self._elections()
        self._replicate()
        self._send()
        self._consume()
        if self.tick % ROUND_TICKS == 0:
            self._round()
        self._run_tasks()
        checks.every_tick(self)

    def heal(self) -> None:
        """Faults stop: every node back and reachable, the driver's requests answered,
        and mirrors copy faster than producers send (so they catch up)."""
        self.faults = False
        self.mix = replace(self.mix, ship=SETTLE_SHIP)
        for node in self.nodes.values():
            node.up, node.cut = True, False


_EMPTY = BrokerGroup(members={})


class RequestFailed(Exception):
    """A request the driver sent failed or its answer was lost (retried next round)."""


def run_policy_seed(seed: int) -> PolicyResult:
    world = PolicyWorld(seed)
    failure = None
    try:
        for _ in range(FAULT_TICKS):
            world.step()
        world.heal()
        for _ in range(SETTLE_TICKS):
            world.step()
        checks.settled(world)
    except Failed as err:
        failure = f"tick {world.tick}: {err}"
    return PolicyResult(
        seed=seed,
        ok=failure is None,
        failure=failure,
        nodes=len(world.nodes),
        steps=world.stats["steps"],
        refused=world.stats["refused"],
        acked=world.stats["acked"],
        elections=world.stats["elections"],
        leader_changes=world.stats["leaders"],
    )


def failed_policy_seeds(first: int, count: int) -> list[PolicyResult]:
    """Seeds first..first+count-1 that failed (a picklable unit for a process pool)."""
    return [r for r in map(run_policy_seed, range(first, first + count)) if not r.ok]
