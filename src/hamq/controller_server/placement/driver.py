"""The ``PlacementDriver``, the one part of placement with a memory: which groups have a
task in flight, the term its plan belongs to, the retirements sent in that term, the last
plan. It keeps the order that makes steps safe against real containers and brokers
(forget a member before stopping it, read-only before dropping); what it decides from
comes afresh from the state each round (see the package docstring)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hamq.clock import monotonic_ms
from hamq.controller.core import Applied, Request
from hamq.controller.events import DeleteTopic, SetTopicGroups
from hamq.controller.requests import CleanBrokerDataRequest, ElectMasterRequest, ElectTrigger
from hamq.controller.state import ControllerState, GroupKey
from hamq.controller_server.placement.answer import describe, placement_ext
from hamq.controller_server.placement.brokers import Brokers
from hamq.controller_server.placement.checks import (
    StepRefused,
    election_refusal,
    removal_refusal,
)
from hamq.controller_server.placement.cleanup import strays, topic_drained, unwritable
from hamq.controller_server.placement.rounds import CollectTopics, Step, round_steps
from hamq.controller_server.placement.world import (
    Observed,
    build_world,
    observe,
    orphans,
    unplaced_groups,
)
from hamq.errors import HamqError, InvalidArgument, RequestTimeout
from hamq.net.connection import Connection, response_pieces
from hamq.net.tasks import PeriodicTask, cancel_all, spawn
from hamq.policy import placement as policy
from hamq.policy.definition import wire_name
from hamq.policy.world import TopicDecl
from hamq.protocol.codes import RequestCode
from hamq.protocol.controller_catalog import answer_parts
from hamq.protocol.frame import Frame, pack_body, unpack_body
from hamq.store.metadata import PERM_READ, PERM_READ_WRITE

if TYPE_CHECKING:
    from hamq.controller_server.service import ControllerService

log = logging.getLogger(__name__)

# A member's start: its store opened, its id applied and registered with the controller.
ADD_BROKER_TIMEOUT_S = 30.0
# A request to this peer's own core: decided, committed by a majority, applied.
COMMIT_TIMEOUT_S = 10.0
MANAGED_GROUP_PREFIXES = (policy.POLICY_GROUP_PREFIX, policy.NODE_GROUP_PREFIX)


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


# Causes remembered at most: a step that fails and then leaves the plan (its topic deleted,
# its node gone) never succeeds, so without a bound the table grows with every topic and
# member that ever failed while the leader lives. Past it the oldest is forgotten (logged
# again if it fails again).
MAX_COMPLAINTS = 4096


class Complaints:
    """Each failing step's cause logged once, not every round: logged again only when the
    cause changes, and a line when it clears."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def failed(self, key: str, cause: str) -> None:
        if self._last.get(key) != cause:
            self._last.pop(key, None)  # re-inserted: the newest
            if len(self._last) >= MAX_COMPLAINTS:
                del self._last[next(iter(self._last))]
            self._last[key] = cause
            log.warning("placement: %s not done: %s (retried every round)", key, cause)

    def __len__(self) -> int:
        return len(self._last)

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
        self.brokers = Brokers(self.core, self.cluster)
        self.plan: policy.Plan | None = None
        self.complaints = Complaints()
        self._busy: dict[str, asyncio.Task] = {}
        self._term: int | None = None  # the term this peer serves in, as last seen
        self._serving_since_ms: int | None = None
        self._retired: set[policy.RetireTopic] = set()  # done while this peer serves
        # exclusive topics whose home node is alive but does not list their owner, since
        # when (this peer's clock): deleted after a grace (see _delete_orphaned_exclusive)
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
        await self.brokers.close()

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
        term = self.core.node.term if self.core.serving else None
        if term != self._term:
            # a term lost and won again between two rounds is a new term too: another
            # leader may have undone what this peer remembers doing
            self._term, self._serving_since_ms, self.plan = term, now_ms, None
            self._retired.clear()
            self._ownerless_since.clear()
        if term is None or self._serving_since_ms is None:
            return
        # A new leader first hears every node once: members it has no report for would
        # look lost, and be replaced for nothing.
        if now_ms - self._serving_since_ms < self.settings.node_heartbeat_timeout_ms:
            return
        state = self.core.state
        seen = observe(state, self.core.nodes, self.cluster, now_ms)
        await self._delete_orphaned_exclusive(state, seen, now_ms, term)
        drained = await self._drained(state)
        if not self._leading(term):
            return  # the plan would be a deposed leader's
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
            task = spawn(self._carry_out(todo, seen, term))
            self._busy[group] = task
            task.add_done_callback(lambda _, g=group: self._busy.pop(g, None))

    def _leading(self, term: int) -> bool:
        """Still serving in ``term``. A step of a plan made in an earlier term may undo
        what a later leader did (a retirement sent after it placed the topic back there
        leaves the topic's writable queues read-only, and no later plan places it again)."""
        return self.core.serving and self.core.node.term == term

    async def _carry_out(self, steps: tuple[Step, ...], seen: Observed, term: int) -> None:
        for step in steps:
            key = describe(step)
            if not self._leading(term):
                log.info(
                    "placement: %s and the rest of its plan dropped: term %d is over", key, term
                )
                return
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
            await self.brokers.set_perm(step.vhost, step.topic, step.group, PERM_READ_WRITE)
            decl = self.core.state.topics.get((step.vhost, step.topic))
            if decl is not None and decl.groups[-1:] != (step.group,):
                groups = (*(g for g in decl.groups if g != step.group), step.group)
                await self._commit(SetTopicGroups(step.vhost, step.topic, groups))
        elif isinstance(step, policy.RetireTopic):
            # asked every round while the topic drains; sent once a term (an update of the
            # topic rewrites the broker's topic file and registers it again)
            if step not in self._retired:
                await self.brokers.set_perm(step.vhost, step.topic, step.group, PERM_READ)
                self._retired.add(step)
        elif isinstance(step, policy.DropTopic):
            await self._drop(step.vhost, step.topic, step.group)
        elif isinstance(step, CollectTopics):
            await self._collect(step.group)

    # -- membership ----------------------------------------------------------------------------
    async def _add_member(self, step: policy.AddMember, seen: Observed) -> None:
        if step.node not in seen.alive:
            raise StepRefused(f"node {step.node} is not alive")
        settings = member_settings(
            step.group, step.ha_join, self.cluster, self.driver.peers.values()
        )
        await self.brokers.request(
            seen.addresses[step.node],
            RequestCode.ADD_BROKER,
            body=pack_body(settings),
            timeout_s=ADD_BROKER_TIMEOUT_S,
        )
        log.info("placement: added a member of %s on %s (%s)", step.group, step.node, step.ha_join)

    async def _elect(self, step: policy.ElectMaster) -> None:
        group = self.brokers.group(step.group)
        if group.master_id == step.broker_id:
            return
        why = election_refusal(group, step.broker_id, self.brokers.alive(step.group))
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
        group = self.brokers.group(step.group)
        # On a node that is down the member went with it: only forgotten, once the
        # controller too has stopped hearing from it.
        on_node = step.node in seen.alive
        if step.broker_id in group.members:
            why = removal_refusal(group, step.broker_id, self.brokers.alive(step.group))
            if why is not None:
                raise StepRefused(f"member {step.broker_id} of {step.group} kept: {why}")
            clean = CleanBrokerDataRequest(
                self.cluster, step.group, frozenset({step.broker_id}), on_node
            )
            await self._commit(clean)
            # an apply that found it master (elected between decide and apply) is a no-op
            if step.broker_id in self.brokers.group(step.group).members:
                raise StepRefused(f"member {step.broker_id} of {step.group} became master")
            log.info("placement: member %d of %s forgotten", step.broker_id, step.group)
        if on_node:
            ext = {"broker_name": step.group, "broker_id": step.broker_id, "delete_store": True}
            try:
                await self.brokers.request(
                    seen.addresses[step.node], RequestCode.REMOVE_BROKER, ext
                )
            except InvalidArgument:
                return  # not a member there (any more): removed by an earlier attempt
            log.info(
                "placement: member %d of %s stopped on %s, its store deleted",
                *(step.broker_id, step.group, step.node),
            )

    # -- topics --------------------------------------------------------------------------------
    async def _drop(self, vhost: str, topic: str, group: str) -> None:
        """The topic leaves the group's master (its slaves follow its topic config); the
        master's next registration takes its queues out of the route. Not
        DELETE_TOPIC_IN_NAMESRV: that would drop the topic's route to every group.

        Read-only first, and drained again once read-only: the round's drain check may
        come before any retirement (a placement drained the round after the move is
        dropped at once), and a producer whose route is from before the move still writes
        to a writable old placement: a message it sent between that check and the delete
        would be acknowledged, then deleted unread."""
        wire = wire_name(vhost, topic)
        decl = self.core.state.topics.get((vhost, topic))
        if decl is not None:
            if decl.groups[-1:] == (group,):
                raise StepRefused(f"{wire} in {group} is its writable placement")
            await self.brokers.set_perm(vhost, topic, group, PERM_READ)
            if not await self.brokers.placement_drained(wire, group, decl.queue_nums):
                raise StepRefused(f"{wire} in {group} is not drained once read-only")
        await self.brokers.delete_in(group, wire)
        decl = self.core.state.topics.get((vhost, topic))
        if decl is not None and group in decl.groups:
            groups = tuple(g for g in decl.groups if g != group)
            await self._commit(SetTopicGroups(vhost, topic, groups))

    async def _drained(self, state: ControllerState) -> frozenset[tuple[str, str, str]]:
        """(vhost, topic, group) for every retired placement with nothing left to consume,
        asked of each old group's master now (one that does not answer: not drained). The
        master's consumer offset table is asked once per group, not once per placement: it
        holds every topic's, and a migration of many topics would fetch it that many times
        a round."""
        retired: dict[str, list[TopicDecl]] = {}
        for decl in state.topics.values():
            for group in decl.groups[:-1]:
                retired.setdefault(group, []).append(decl)
        found = await asyncio.gather(
            *(self._group_drained(group, decls) for group, decls in retired.items()),
            return_exceptions=True,
        )
        done: set[tuple[str, str, str]] = set()
        for group, keys in zip(retired, found):
            if isinstance(keys, BaseException):
                # a bug or a malformed answer: loud, and only this group's placements wait
                # (the plan, with every other group's steps, comes after the drain checks)
                log.error("placement: drain check in %s failed", group, exc_info=keys)
            else:
                done.update(keys)
        return frozenset(done)

    async def _group_drained(
        self, group: str, decls: list[TopicDecl]
    ) -> list[tuple[str, str, str]]:
        try:
            addr = self.brokers.master_addr(group)
            offsets = await self.brokers.offsets(addr)
        except HamqError as err:
            for decl in decls:
                self.complaints.failed(f"drain check of {decl.name} in {group}", err.message)
            return []
        answers = await asyncio.gather(
            *(self.brokers.queues(addr, wire_name(d.vhost, d.name), d.queue_nums) for d in decls),
            return_exceptions=True,
        )
        done = []
        for decl, answer in zip(decls, answers):
            if isinstance(answer, HamqError):
                self.complaints.failed(f"drain check of {decl.name} in {group}", answer.message)
            elif isinstance(answer, BaseException):
                raise answer
            elif topic_drained(wire_name(decl.vhost, decl.name), answer, offsets):
                done.append((decl.vhost, decl.name, group))
        return done

    async def _collect(self, group: str) -> None:
        """``CollectTopics``: each finding checked again against the state right before
        it is acted on (a topic declared again since stays)."""
        try:
            addr = self.brokers.master_addr(group)
        except StepRefused:
            return  # no alive master: nothing to ask, nothing to delete from
        frame = await self.brokers.request(addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        table = unpack_body(frame.body) or {}
        perms = {
            name: int(config.get("perm", 0))
            for name, config in table.items()
            if isinstance(name, str) and isinstance(config, dict)
        }
        found = strays(self.core.state, group, list(perms))
        for vhost, topic in found.undeclared:
            if (vhost, topic) in self.core.state.topics or not self.core.serving:
                continue
            await self.brokers.delete_in(group, wire_name(vhost, topic))
            log.info("placement: %s left %s: no longer declared", wire_name(vhost, topic), group)
        for vhost, topic in found.untracked:
            decl = self.core.state.topics.get((vhost, topic))
            if decl is not None and group not in decl.groups:
                if not decl.groups:  # it becomes the writable group: writable it is (it
                    # may be a read-only leftover of an earlier declaration of the name)
                    await self.brokers.set_perm(vhost, topic, group, PERM_READ_WRITE)
                # first: not the writable group (unless it is the only one)
                await self._commit(SetTopicGroups(vhost, topic, (group, *decl.groups)))
                log.info("placement: %s recorded as held by %s", wire_name(vhost, topic), group)
        for vhost, topic in unwritable(self.core.state, group, perms):
            decl = self.core.state.topics.get((vhost, topic))
            if decl is None or decl.groups[-1:] != (group,) or not self.core.serving:
                continue
            # PlaceTopic's broker side again (an update: no data lost if it is there)
            await self.brokers.set_perm(vhost, topic, group, PERM_READ_WRITE)
            log.info("placement: %s writable in %s again", wire_name(vhost, topic), group)

    async def _delete_orphaned_exclusive(
        self, state: ControllerState, seen: Observed, now_ms: int, term: int
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
            if not self._leading(term):
                return
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
                await self._unplace(decl)
                await self._commit(DeleteTopic(decl.vhost, decl.name))
            except HamqError as err:
                self.complaints.failed(f"deleting exclusive topic {decl.name}", err.message)
            else:
                log.info("placement: exclusive topic %s deleted: %s", decl.name, why)
        for key in set(self._ownerless_since) - missing:
            del self._ownerless_since[key]

    async def _unplace(self, decl: TopicDecl) -> None:
        """A deleted topic's queues leave every group holding it, best effort: a group with
        no alive master (its node is down) is skipped, and one that fails is logged."""
        topic = wire_name(decl.vhost, decl.name)
        for group in decl.groups:
            try:
                await self.brokers.delete_in(group, topic)
            except StepRefused:
                continue
            except HamqError as err:
                log.warning("placement: %s not deleted from %s: %s", topic, group, err.message)

    # -- requests ------------------------------------------------------------------------------
    async def _commit(self, request: Request) -> Applied:
        """``request`` decided by this peer's core and applied, or the refusal raised."""
        try:
            return await asyncio.wait_for(self.propose(request), COMMIT_TIMEOUT_S)
        except TimeoutError:
            raise RequestTimeout(f"{type(request).__name__} not committed in time") from None
