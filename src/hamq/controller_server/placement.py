"""The placement driver (seed 003): on the serving controller leader, every
``placement_interval_ms``, the policies, declared topics and nodes of the replicated state,
with what the nodes and the members report, become a ``policy.placement.World``;
``reconcile`` turns it into a plan, and the driver carries the plan's steps out against
real containers and brokers.

Nothing the driver remembers decides anything: each round starts again from the
replicated state and fresh observations, so a new leader picks up a migration where the
old one stopped, and a step repeated after a lost answer finds its work done (a container
holds one member of a group, so a second ADD_BROKER for it is refused; a removed member or
a dropped topic that is already gone counts as done; topic steps are updates). What it
keeps in memory only makes it polite: one step in flight per group, each failure's cause
logged once, read-only retirements sent once a leadership, the last plan for
CONTROLLER_GET_PLACEMENT.

Safety does not rest on the reconciler alone: right before it removes a member or moves a
master, the driver checks the group again as the controller sees it at that moment, and it
never removes the master or the last synchronised member whatever a plan says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hamq.broker.topics import is_system_topic
from hamq.clock import monotonic_ms
from hamq.controller.core import Applied, Request
from hamq.controller.events import DeleteTopic, SetTopicGroups
from hamq.controller.nodes import NodeLiveness
from hamq.controller.requests import CleanBrokerDataRequest, ElectMasterRequest, ElectTrigger
from hamq.controller.state import BrokerGroup, ControllerState, GroupKey
from hamq.errors import HamqError, InvalidArgument, RequestTimeout, TopicNotExist
from hamq.net.connection import Connection, response_pieces
from hamq.net.pool import ConnectionPool
from hamq.net.tasks import PeriodicTask, cancel_all, spawn
from hamq.policy import placement as policy
from hamq.policy.definition import PolicyError, split_wire_name, wire_name
from hamq.policy.world import TopicDecl
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.controller_catalog import answer_parts
from hamq.protocol.frame import Frame, pack_body, unpack_body
from hamq.protocol.properties import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from hamq.store.metadata import PERM_READ, PERM_READ_WRITE

if TYPE_CHECKING:
    from hamq.controller_server.service import ControllerService

log = logging.getLogger(__name__)

# Every request the driver sends is bounded: a hung broker or container costs one round
# of its group, never the driver.
REQUEST_TIMEOUT_S = 5.0
# A member's start: its store opened, its id applied and registered with the controller.
ADD_BROKER_TIMEOUT_S = 30.0
# A request to this peer's own core: decided, committed by a majority, applied.
COMMIT_TIMEOUT_S = 10.0
MEMBERSHIP_STEPS = (policy.AddMember, policy.ElectMaster, policy.RemoveMember)
MANAGED_GROUP_PREFIXES = (policy.POLICY_GROUP_PREFIX, policy.NODE_GROUP_PREFIX)


class StepRefused(HamqError):
    """A step the driver will not take now: the group as the controller sees it makes the
    step unsafe or impossible (tried again next round, against fresh observations)."""


@dataclass(frozen=True)
class Observed:
    """The nodes as the leader sees them at one moment: which are alive (heard within
    ``node_heartbeat_timeout_ms``), where their containers listen, and which node hosts
    each member of the mirror cluster (the last heartbeat that lists it)."""

    alive: frozenset[str]
    addresses: Mapping[str, str]
    where: Mapping[tuple[str, int], str]  # (group, broker id) -> node


def observe(state: ControllerState, nodes: NodeLiveness, cluster: str, now_ms: int) -> Observed:
    """Only nodes the replicated state knows count. A member two nodes list (a report from
    before a move) is placed on the alive one, then the first by name."""
    alive = frozenset(name for name in state.nodes if nodes.is_alive(name, now_ms))
    where: dict[tuple[str, int], str] = {}
    for name in sorted(state.nodes, key=lambda n: (n not in alive, n), reverse=True):
        report = nodes.report(name)
        for member in report.members if report is not None else ():
            if member.cluster_name == cluster:
                where[(member.broker_name, member.broker_id)] = name
    addresses = {
        name: report.address if (report := nodes.report(name)) is not None else address
        for name, address in state.nodes.items()
    }
    return Observed(alive, addresses, where)


@dataclass(frozen=True)
class CollectTopics:
    """The topics a managed group's master holds that the state does not account for,
    read and settled in the group's own task, after its placements of the round (the
    group's topics change only there). Undeclared ones were deleted through the
    controller (DELETE_TOPIC, DELETE_VHOST, an exclusive topic whose connection closed),
    which changes only the replicated state: they leave the group. A declared topic the
    group holds without the state listing it there was placed by a PlaceTopic whose
    SetTopicGroups never committed: recorded as held (not writable), it is then retired,
    drained and dropped like any old placement, or placed again if it is the target."""

    group: str


Step = policy.Step | CollectTopics


def declared_name(wire: str) -> tuple[str, str] | None:
    """(vhost, topic) of a topic a client declares, or None for the ones the brokers keep
    themselves (system topics, a group's retry and dead-letter topics) and names of no
    vhost: those are never collected."""
    if is_system_topic(wire) or wire.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
        return None
    try:
        return split_wire_name(wire)
    except PolicyError:
        return None


@dataclass(frozen=True)
class Strays:
    undeclared: tuple[tuple[str, str], ...]
    untracked: tuple[tuple[str, str], ...]


def strays(state: ControllerState, group: str, held: Iterable[str]) -> Strays:
    """The client topics among ``held`` (a group master's topic names) that no
    declaration names, and the declared ones whose declaration does not list ``group``."""
    undeclared, untracked = [], []
    for wire in sorted(held):
        name = declared_name(wire)
        decl = None if name is None else state.topics.get(name)
        if name is not None and decl is None:
            undeclared.append(name)
        elif decl is not None and group not in decl.groups:
            untracked.append((decl.vhost, decl.name))
    return Strays(tuple(undeclared), tuple(untracked))


def orphans(state: ControllerState, seen: Observed, cluster: str) -> list[policy.RemoveMember]:
    """Members alive nodes still run that their group no longer counts: cleaned by a
    removal whose REMOVE_BROKER did not reach the node. Counted for nothing (outside the
    SyncStateSet, never elected), such a member still holds the group's place on its
    node, where a new member of the group would be refused."""
    return [
        policy.RemoveMember(name, broker_id, node)
        for (name, broker_id), node in sorted(seen.where.items())
        if node in seen.alive
        and (group := state.groups.get((cluster, name))) is not None
        and broker_id not in group.members
    ]


def build_world(
    state: ControllerState,
    seen: Observed,
    alive_members: Callable[[GroupKey], frozenset[int]],
    cluster: str,
    drained: frozenset[tuple[str, str, str]],
    default_locator: str,
) -> policy.World:
    """The reconciler's input. A group's members are the controller's; a member's node is
    the one whose heartbeat lists it ("" when no node does: the reconciler sees it as
    lost); synchronised = in the SyncStateSet (the master admits only caught-up members
    holding everything from the need offset)."""
    groups = []
    for (group_cluster, name), group in sorted(state.groups.items()):
        if group_cluster != cluster:
            continue
        alive = alive_members((group_cluster, name))
        members = tuple(
            policy.MemberView(
                broker_id,
                seen.where.get((name, broker_id), ""),
                broker_id in alive,
                broker_id in group.sync_state_set,
            )
            for broker_id in sorted(group.members)
        )
        groups.append(policy.GroupView(name, members, group.master_id))
    return policy.World(
        policies=tuple(state.policies.values()),
        topics=tuple(state.topics.values()),
        nodes=tuple(policy.NodeView(name, name in seen.alive) for name in sorted(state.nodes)),
        groups=tuple(groups),
        drained=drained,
        default_locator=default_locator,
    )


def unplaced_groups(
    state: ControllerState,
    seen: Observed,
    alive_members: Callable[[GroupKey], frozenset[int]],
    cluster: str,
) -> frozenset[str]:
    """Groups with an alive member no node lists yet (a member just added, before its
    node's next heartbeat): their membership waits a round, or the reconciler would count
    that member lost and add or remove one for it."""
    return frozenset(
        name
        for (group_cluster, name) in state.groups
        if group_cluster == cluster
        and any((name, i) not in seen.where for i in alive_members((group_cluster, name)))
    )


def member_settings(
    group: str, ha_join: str, cluster: str, controller_addr: Iterable[str]
) -> dict[str, Any]:
    """The broker settings ADD_BROKER carries for a new member of ``group``. The node's
    container fills in the rest: ports it picks on its ``member_host``, the store
    ``<store_root>/<group>`` (one member of a group per container, so an ADD_BROKER sent
    twice is refused the second time), its own ``namesrv``."""
    return {
        "broker_name": group,
        "cluster_name": cluster,
        "enable_controller_mode": True,
        "controller_addr": list(controller_addr),
        "all_ack_in_sync_state_set": True,
        "ha_join": ha_join,
    }


def removal_refusal(group: BrokerGroup, broker_id: int, alive: frozenset[int]) -> str | None:
    """Why ``broker_id`` must not leave ``group`` now, or None: never the master, and a
    synchronised member only while another synchronised one is alive (an unsynchronised
    one may always go: it takes no synchronised copy with it)."""
    if broker_id == group.master_id:
        return f"member {broker_id} is the master"
    if broker_id in group.sync_state_set and not (group.sync_state_set & alive) - {broker_id}:
        return f"member {broker_id} is synchronised and no other synchronised member is alive"
    return None


def election_refusal(group: BrokerGroup, broker_id: int, alive: frozenset[int]) -> str | None:
    """Why the master must not move to ``broker_id`` now, or None: only to an alive
    synchronised member (the controller would refuse anything else too, less clearly)."""
    if broker_id not in group.members:
        return f"member {broker_id} is not in the group"
    if broker_id not in group.sync_state_set:
        return f"member {broker_id} is not synchronised"
    if broker_id not in alive:
        return f"member {broker_id} is not alive"
    return None


@dataclass(frozen=True)
class QueueState:
    queue_id: int
    min_offset: int
    max_offset: int


def topic_drained(
    topic: str, queues: Iterable[QueueState], offsets: Mapping[str, Mapping[Any, int]]
) -> bool:
    """Whether a retired placement of ``topic`` (its wire name) has nothing left to give:
    every queue empty, or consumed to its end by every consumer group with an offset on
    it. A queue with messages that no group has an offset on is not drained: a consumer
    may still come for them. ``offsets`` is GET_ALL_CONSUMER_OFFSET's table
    ("topic@group" -> {queue id: offset})."""
    mine = [table for key, table in offsets.items() if key.partition("@")[0] == topic]
    for queue in queues:
        if queue.max_offset <= queue.min_offset:
            continue
        committed = [
            int(table[key])
            for table in mine
            for key in (queue.queue_id, str(queue.queue_id))
            if key in table
        ]
        if not committed or min(committed) < queue.max_offset:
            return False
    return True


def step_group(step: Step) -> str:
    return step.group


def round_steps(
    steps: Iterable[Step], busy: Iterable[str], unplaced: frozenset[str]
) -> dict[str, tuple[Step, ...]]:
    """What this round carries out, per group not busy: its first membership step (the
    plan after it is stale until observed), unless the group has a member not placed on a
    node yet, then its topic steps (idempotent updates, in plan order)."""
    taken: dict[str, list[Step]] = {}
    skip = set(busy)
    for step in steps:
        group = step_group(step)
        if group in skip:
            continue
        todo = taken.setdefault(group, [])
        if isinstance(step, MEMBERSHIP_STEPS):
            if group in unplaced or any(isinstance(s, MEMBERSHIP_STEPS) for s in todo):
                continue
            todo.insert(0, step)
        else:
            todo.append(step)
    return {group: tuple(todo) for group, todo in taken.items() if todo}


def describe(step: Step) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in vars(step).items())
    return f"{type(step).__name__}({fields})"


def placement_ext(plan: policy.Plan | None, in_flight: Iterable[str]) -> dict[str, Any]:
    """CONTROLLER_GET_PLACEMENT's answer: the last plan and its pending steps."""
    if plan is None:
        return {"groups": [], "topics": [], "pending": [], "in_flight": []}
    return {
        "groups": [
            {
                "name": g.name,
                "policy": list(g.policy) if g.policy is not None else None,
                "nodes": list(g.nodes),
                "master_node": g.master_node,
            }
            for g in sorted(plan.groups.values(), key=lambda g: g.name)
        ],
        "topics": [
            {"vhost": vhost, "topic": topic, "group": group}
            for (vhost, topic), group in sorted(plan.topic_group.items())
        ],
        "pending": [describe(step) for step in plan.steps],
        "in_flight": sorted(in_flight),
    }


class Complaints:
    """Each failing step's cause logged once, not every round: logged again only when the
    cause changes, and a line when it clears."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def failed(self, key: str, cause: str) -> None:
        if self._last.get(key) != cause:
            self._last[key] = cause
            log.warning("placement: %s not done: %s (retried every round)", key, cause)

    def succeeded(self, key: str) -> None:
        if self._last.pop(key, None) is not None:
            log.info("placement: %s done", key)


# -- the driver ----------------------------------------------------------------------------
class PlacementDriver:
    """Built by the ``ControllerService`` it serves in: ``service.propose`` changes the
    replicated state, and CONTROLLER_GET_PLACEMENT is answered here."""

    def __init__(self, service: ControllerService) -> None:
        self.settings = service.settings
        self.driver = service.driver
        self.core = service.driver.core
        self.propose = service.propose
        self.not_serving = service.processor.not_serving
        service.processor.register(RequestCode.CONTROLLER_GET_PLACEMENT, self._get_placement)
        self.cluster = self.settings.mirror_cluster_name
        self.pool = ConnectionPool(connect_timeout_s=REQUEST_TIMEOUT_S)
        self.plan: policy.Plan | None = None
        self.complaints = Complaints()
        self._busy: dict[str, asyncio.Task] = {}
        self._serving_since_ms: int | None = None
        self._retired: set[policy.RetireTopic] = set()  # done while this peer serves
        # exclusive topics whose home node is alive but does not list their owner, since
        # when (this peer's clock): deleted after a grace (see _delete_ownerless)
        self._ownerless_since: dict[tuple[str, str], int] = {}
        self._rounds = PeriodicTask(
            "placement driver",
            self.settings.placement_interval_ms / 1000,
            self.run_round,
            errors=(HamqError,),
        )

    def start(self) -> None:
        self._rounds.start()

    async def stop(self) -> None:
        await self._rounds.stop()
        await cancel_all(list(self._busy.values()))
        await self.pool.close()

    def _get_placement(self, conn: Connection, frame: Frame) -> list:
        refusal = self.not_serving(frame)
        if refusal is not None:
            return refusal
        # past half the header limit (a large plan) the answer is the body
        ext, body = answer_parts(placement_ext(self.plan, self._busy))
        return response_pieces(frame, ext=ext, body=body)

    def _alive(self, key: GroupKey) -> frozenset[int]:
        return self.core.liveness.alive(key, monotonic_ms())

    async def run_round(self) -> None:
        now_ms = monotonic_ms()
        if not self.core.serving:
            self._serving_since_ms, self.plan = None, None
            self._retired.clear()
            self._ownerless_since.clear()
            return
        if self._serving_since_ms is None:
            self._serving_since_ms = now_ms
        # A new leader first hears every node once: members it has no report for would
        # look lost, and be replaced for nothing.
        if now_ms - self._serving_since_ms < self.settings.node_heartbeat_timeout_ms:
            return
        state = self.core.state
        seen = observe(state, self.core.nodes, self.cluster, now_ms)
        await self._delete_orphaned_exclusive(state, seen, now_ms)
        drained = await self._drained(state)
        world = build_world(
            state,
            seen,
            self._alive,
            self.cluster,
            drained,
            self.settings.default_queue_master_locator,
        )
        self.plan = plan = policy.reconcile(world)
        self._retired.intersection_update(plan.steps)  # drained and dropped: forgotten
        unplaced = unplaced_groups(state, seen, self._alive, self.cluster)
        # orphans first: one holds its group's place on its node
        collect = [
            CollectTopics(name)
            for (cluster, name) in sorted(state.groups)
            if cluster == self.cluster and name.startswith(MANAGED_GROUP_PREFIXES)
        ]
        steps = (*orphans(state, seen, self.cluster), *plan.steps, *collect)
        for group, todo in round_steps(steps, self._busy, unplaced).items():
            task = spawn(self._carry_out(todo, seen))
            self._busy[group] = task
            task.add_done_callback(lambda _, g=group: self._busy.pop(g, None))

    async def _carry_out(self, steps: tuple[Step, ...], seen: Observed) -> None:
        for step in steps:
            key = describe(step)
            try:
                await self._take(step, seen)
            except HamqError as err:  # each step of the group is tried on its own
                self.complaints.failed(key, err.message)
            except Exception:  # a bug: loud, and the next round tries again
                log.exception("placement: %s failed", key)
            else:
                self.complaints.succeeded(key)

    async def _take(self, step: Step, seen: Observed) -> None:
        if isinstance(step, policy.AddMember):
            await self._add_member(step, seen)
        elif isinstance(step, policy.ElectMaster):
            await self._elect(step)
        elif isinstance(step, policy.RemoveMember):
            await self._remove_member(step, seen)
        elif isinstance(step, policy.PlaceTopic):
            await self._set_perm(step.vhost, step.topic, step.group, PERM_READ_WRITE)
            decl = self.core.state.topics.get((step.vhost, step.topic))
            if decl is not None and decl.groups[-1:] != (step.group,):
                groups = (*(g for g in decl.groups if g != step.group), step.group)
                await self._commit(SetTopicGroups(step.vhost, step.topic, groups))
        elif isinstance(step, policy.RetireTopic):
            # asked every round while the topic drains; sent once a term (an update of the
            # topic rewrites the broker's topic file and registers it again)
            if step not in self._retired:
                await self._set_perm(step.vhost, step.topic, step.group, PERM_READ)
                self._retired.add(step)
        elif isinstance(step, policy.DropTopic):
            await self._drop(step.vhost, step.topic, step.group)
        elif isinstance(step, CollectTopics):
            await self._collect(step.group)

    # -- membership ----------------------------------------------------------------------------
    def _group(self, name: str) -> BrokerGroup:
        group = self.core.state.groups.get((self.cluster, name))
        if group is None:
            raise StepRefused(f"group {name} is not known to the controller")
        return group

    async def _add_member(self, step: policy.AddMember, seen: Observed) -> None:
        if step.node not in seen.alive:
            raise StepRefused(f"node {step.node} is not alive")
        settings = member_settings(
            step.group, step.ha_join, self.cluster, self.driver.peers.values()
        )
        await self._request(
            seen.addresses[step.node],
            RequestCode.ADD_BROKER,
            body=pack_body(settings),
            timeout_s=ADD_BROKER_TIMEOUT_S,
        )
        log.info("placement: added a member of %s on %s (%s)", step.group, step.node, step.ha_join)

    async def _elect(self, step: policy.ElectMaster) -> None:
        group = self._group(step.group)
        if group.master_id == step.broker_id:
            return
        why = election_refusal(group, step.broker_id, self._alive((self.cluster, step.group)))
        if why is not None:
            raise StepRefused(f"master of {step.group} not moved: {why}")
        request = ElectMasterRequest(self.cluster, step.group, ElectTrigger.ADMIN, step.broker_id)
        await self._commit(request)
        log.info("placement: master of %s moved to member %d", step.group, step.broker_id)

    async def _remove_member(self, step: policy.RemoveMember, seen: Observed) -> None:
        """Forgotten by the controller first, then stopped with its store deleted. In that
        order: the controller refuses to clean the master at the log position the clean
        takes, so a member elected after the check (its master's node died) is never
        stopped; once cleaned it is never elected nor counted synchronised, so stopping
        it loses nothing. Cleaned but not stopped (its node did not answer), it is an
        orphan the next rounds remove (``orphans``)."""
        group = self._group(step.group)
        # On a node that is down the member went with it: only forgotten, once the
        # controller too has stopped hearing from it.
        on_node = step.node in seen.alive
        if step.broker_id in group.members:
            why = removal_refusal(group, step.broker_id, self._alive((self.cluster, step.group)))
            if why is not None:
                raise StepRefused(f"member {step.broker_id} of {step.group} kept: {why}")
            clean = CleanBrokerDataRequest(
                self.cluster, step.group, frozenset({step.broker_id}), on_node
            )
            await self._commit(clean)
            # an apply that found it master (elected between decide and apply) is a no-op
            if step.broker_id in self._group(step.group).members:
                raise StepRefused(f"member {step.broker_id} of {step.group} became master")
            log.info("placement: member %d of %s forgotten", step.broker_id, step.group)
        if on_node:
            ext = {"broker_name": step.group, "broker_id": step.broker_id, "delete_store": True}
            try:
                await self._request(seen.addresses[step.node], RequestCode.REMOVE_BROKER, ext)
            except InvalidArgument:
                return  # not a member there (any more): removed by an earlier attempt
            log.info(
                "placement: member %d of %s stopped on %s, its store deleted",
                *(step.broker_id, step.group, step.node),
            )

    # -- topics --------------------------------------------------------------------------------
    def _master_addr(self, name: str) -> str:
        group = self._group(name)
        alive = self._alive((self.cluster, name))
        if group.master_id is None or group.master_id not in alive:
            raise StepRefused(f"group {name} has no alive master")
        return group.members[group.master_id].address

    async def _set_perm(self, vhost: str, topic: str, group: str, perm: int) -> None:
        decl = self.core.state.topics.get((vhost, topic))
        if decl is None:
            return  # deleted meanwhile: the next plan drops it
        ext = {
            "topic": wire_name(vhost, topic),
            "read_queue_nums": decl.queue_nums,
            "write_queue_nums": decl.queue_nums,
            "perm": perm,
        }
        await self._request(self._master_addr(group), RequestCode.UPDATE_AND_CREATE_TOPIC, ext)

    async def _drop(self, vhost: str, topic: str, group: str) -> None:
        """The topic leaves the group's master (its slaves follow its topic config); the
        master's next registration takes its queues out of the route. Not
        DELETE_TOPIC_IN_NAMESRV: that would drop the topic's route to every group."""
        await self._delete_in(group, wire_name(vhost, topic))
        decl = self.core.state.topics.get((vhost, topic))
        if decl is not None and group in decl.groups:
            groups = tuple(g for g in decl.groups if g != group)
            await self._commit(SetTopicGroups(vhost, topic, groups))

    async def _drained(self, state: ControllerState) -> frozenset[tuple[str, str, str]]:
        """(vhost, topic, group) for every retired placement with nothing left to consume,
        asked of each old group's master now (one that does not answer: not drained)."""
        asks = [
            (decl.vhost, decl.name, group, decl.queue_nums)
            for decl in state.topics.values()
            for group in decl.groups[:-1]
        ]
        answers = await asyncio.gather(
            *(self._placement_drained(wire_name(v, t), g, n) for v, t, g, n in asks),
            return_exceptions=True,
        )
        done = set()
        for (vhost, topic, group, _), answer in zip(asks, answers):
            if answer is True:
                done.add((vhost, topic, group))
            elif isinstance(answer, HamqError):
                self.complaints.failed(f"drain check of {topic} in {group}", answer.message)
            elif isinstance(answer, BaseException):
                raise answer
        return frozenset(done)

    async def _placement_drained(self, topic: str, group: str, queue_nums: int) -> bool:
        addr = self._master_addr(group)
        frame = await self._request(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
        offsets = unpack_body(frame.body) or {}
        queues = []
        for queue_id in range(queue_nums):
            ext = {"topic": topic, "queue_id": queue_id}
            low, high = await asyncio.gather(
                self._request(addr, RequestCode.GET_MIN_OFFSET, ext),
                self._request(addr, RequestCode.GET_MAX_OFFSET, ext),
            )
            queues.append(QueueState(queue_id, int(low.ext["offset"]), int(high.ext["offset"])))
        return topic_drained(topic, queues, offsets)

    async def _collect(self, group: str) -> None:
        """``CollectTopics``: each finding checked again against the state right before
        it is acted on (a topic declared again since stays)."""
        try:
            addr = self._master_addr(group)
        except StepRefused:
            return  # no alive master: nothing to ask, nothing to delete from
        frame = await self._request(addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        table = unpack_body(frame.body) or {}
        found = strays(self.core.state, group, [n for n in table if isinstance(n, str)])
        for vhost, topic in found.undeclared:
            if (vhost, topic) in self.core.state.topics or not self.core.serving:
                continue
            await self._delete_in(group, wire_name(vhost, topic))
            log.info("placement: %s left %s: no longer declared", wire_name(vhost, topic), group)
        for vhost, topic in found.untracked:
            decl = self.core.state.topics.get((vhost, topic))
            if decl is not None and group not in decl.groups:
                if not decl.groups:  # it becomes the writable group: writable it is (it
                    # may be a read-only leftover of an earlier declaration of the name)
                    await self._set_perm(vhost, topic, group, PERM_READ_WRITE)
                # first: not the writable group (unless it is the only one)
                await self._commit(SetTopicGroups(vhost, topic, (group, *decl.groups)))
                log.info("placement: %s recorded as held by %s", wire_name(vhost, topic), group)

    async def _delete_orphaned_exclusive(
        self, state: ControllerState, seen: Observed, now_ms: int
    ) -> None:
        """An exclusive topic lives as long as its declaring connection. With its home node
        down so is that connection; on an alive node, a connection that is gone is one the
        node's heartbeats no longer list as open (its delete on close did not reach the
        controller, or the declare finished after the close). A declaration committed
        after the heartbeat the driver last saw was built is not listed there yet: such a
        topic is deleted only once its owner has been missing for a whole
        ``node_heartbeat_timeout_ms``."""
        missing = set()
        for key, decl in list(state.topics.items()):
            if not decl.exclusive:
                continue
            if decl.home_node in seen.alive:
                report = self.core.nodes.report(decl.home_node)
                owners = None if report is None else report.owners
                if owners is None or state.topic_owners.get(key, "") in owners:
                    continue
                missing.add(key)
                since = self._ownerless_since.setdefault(key, now_ms)
                if now_ms - since < self.settings.node_heartbeat_timeout_ms:
                    continue
                why = f"its connection to {decl.home_node} is gone"
            else:
                why = f"its node {decl.home_node} is down"
            try:
                await self.unplace(decl)
                await self._commit(DeleteTopic(decl.vhost, decl.name))
            except HamqError as err:
                self.complaints.failed(f"deleting exclusive topic {decl.name}", err.message)
            else:
                log.info("placement: exclusive topic %s deleted: %s", decl.name, why)
        for key in set(self._ownerless_since) - missing:
            del self._ownerless_since[key]

    async def unplace(self, decl: TopicDecl) -> None:
        """A deleted topic's queues leave every group holding it, best effort: a group with
        no alive master (its node is down) is skipped, and one that fails is logged."""
        topic = wire_name(decl.vhost, decl.name)
        for group in decl.groups:
            try:
                await self._delete_in(group, topic)
            except StepRefused:
                continue
            except HamqError as err:
                log.warning("placement: %s not deleted from %s: %s", topic, group, err.message)

    async def _delete_in(self, group: str, topic: str) -> None:
        """DELETE_TOPIC_IN_BROKER on the group's master; a topic it no longer has was
        deleted by an earlier attempt."""
        try:
            await self._request(
                self._master_addr(group), RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}
            )
        except TopicNotExist:
            pass

    # -- requests ------------------------------------------------------------------------------
    async def _request(
        self,
        addr: str,
        code: int,
        ext: dict[str, Any] | None = None,
        body: bytes = b"",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Frame:
        conn = await self.pool.get(addr)
        frame = await conn.request(code, ext, body, timeout_s)
        if frame.code != ResponseCode.SUCCESS:
            raise HamqError.for_code(frame.code, frame.remark)
        return frame

    async def _commit(self, request: Request) -> Applied:
        """``request`` decided by this peer's core and applied, or the refusal raised."""
        try:
            return await asyncio.wait_for(self.propose(request), COMMIT_TIMEOUT_S)
        except TimeoutError:
            raise RequestTimeout(f"{type(request).__name__} not committed in time") from None
