"""What the placement driver takes away, against a real controller peer in this process and
a recording stand-in for the node's container and the group's master: a removed member is
forgotten by the controller before it is stopped (so a member elected meanwhile is never
stopped), a member a node still runs after it was forgotten is removed, topics deleted
through the controller leave the brokers, and an exclusive topic whose connection its
alive node no longer lists is deleted after a grace."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from hamq.clock import monotonic_ms
from hamq.config import ControllerSettings
from hamq.controller.events import DeclareTopic, RegisterNode, SetTopicGroups
from hamq.controller.nodes import NodeHeartbeat
from hamq.controller.requests import (
    ApplyBrokerIdRequest,
    BrokerHeartbeat,
    ElectMasterRequest,
    ElectTrigger,
)
from hamq.controller.state import BrokerGroup, BrokerMember, ControllerState
from hamq.controller_server.placement import (
    CollectTopics,
    Observed,
    StepRefused,
    orphans,
    strays,
    unwritable,
)
from hamq.controller_server.service import ControllerService
from hamq.errors import InvalidArgument
from hamq.net.connection import Connection, response_pieces
from hamq.net.server import Server
from hamq.policy import placement as policy
from hamq.protocol import controller_catalog as catalog
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, pack_body

sys.path.insert(0, str(Path(__file__).parents[1]))
from helpers import free_port, until

M = TypeVar("M")

CLUSTER = "hamq"
NODE = "hamq@a"
HEARTBEAT_TIMEOUT_MS = 400


class Recording:
    """The node's container and the group's master in one: answers REMOVE_BROKER,
    GET_ALL_TOPIC_CONFIG (``topics``, read-write unless ``perms`` says otherwise) and
    DELETE_TOPIC_IN_BROKER, and records each with what ``probe()`` says at that moment."""

    def __init__(self, probe: Callable[[], object], topics: list[str]) -> None:
        self.probe = probe
        self.topics = topics
        self.perms: dict[str, int] = {}
        self.seen: list[tuple[int, object, dict]] = []

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        self.seen.append((frame.code, self.probe(), dict(frame.ext)))
        if frame.code == RequestCode.GET_ALL_TOPIC_CONFIG:
            table = {t: {"perm": self.perms.get(t, 6)} for t in self.topics}
            return response_pieces(frame, body=pack_body(table))
        return response_pieces(frame)

    def after_batch(self) -> None:
        pass


@contextlib.asynccontextmanager
async def peer(tmp_path: Path) -> AsyncIterator[ControllerService]:
    """One controller peer serving, with group ``ha_g``: master 1 (alive, reporting) and
    member 2, both at addresses the caller's ``Recording`` server is started on."""
    settings = ControllerSettings(
        controller_election_timeout_ms=100,
        mirror_cluster_name=CLUSTER,
        node_heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    )
    service = ControllerService(settings, "127.0.0.1:1", tmp_path)
    service.driver.start()
    try:
        await until(lambda: service.driver.core.serving, 10.0, "the peer serves")
        yield service
    finally:
        await service.stop()


async def group_of_two(service: ControllerService, addr: str) -> None:
    for broker_id in (1, 2):
        await service.propose(ApplyBrokerIdRequest(CLUSTER, "ha_g", broker_id, addr, "c"))
    for broker_id in (1, 2):
        service.driver.core.heartbeat(
            BrokerHeartbeat(CLUSTER, "ha_g", broker_id, addr, 0, 0), monotonic_ms()
        )
    await service.propose(ElectMasterRequest(CLUSTER, "ha_g", ElectTrigger.ADMIN, 1))


@contextlib.asynccontextmanager
async def group_master(service: ControllerService, topics: list[str]) -> AsyncIterator[Recording]:
    """Group ``ha_g`` (``group_of_two``) and node ``NODE`` at a ``Recording`` holding
    ``topics``, which is its master."""
    async with serving_master(service, Recording(lambda: None, topics)) as master:
        yield master


@contextlib.asynccontextmanager
async def serving_master(service: ControllerService, master: M) -> AsyncIterator[M]:
    """Group ``ha_g`` (``group_of_two``) and node ``NODE`` at ``master``, served on a port."""
    addr = f"127.0.0.1:{free_port()}"
    server = Server(master)
    await server.start(addr)
    try:
        await group_of_two(service, addr)
        await service.propose(RegisterNode(NODE, addr))
        yield master
    finally:
        await server.close()


def test_a_removed_member_is_forgotten_before_it_is_stopped(tmp_path: Path) -> None:
    """Stopped first, a member the controller elected between the driver's check and the
    REMOVE_BROKER (its master's node died) would lose its log with the group's only
    synchronised copy (S1's F1). Forgotten first, it can no longer be elected: the
    controller refuses to clean a master at the position the clean takes."""

    async def scenario() -> None:
        async with peer(tmp_path) as service:
            core = service.driver.core
            addr = f"127.0.0.1:{free_port()}"
            node = Recording(lambda: set(core.state.groups[(CLUSTER, "ha_g")].members), [])
            server = Server(node)
            await server.start(addr)
            try:
                await group_of_two(service, addr)
                here = Observed(frozenset({NODE}), {NODE: addr}, {})
                await service.placement._take(policy.RemoveMember("ha_g", 2, NODE), here)
                removes = [m for c, m, _ in node.seen if c == RequestCode.REMOVE_BROKER]
                assert removes == [{1}]
                # cleaned before, its REMOVE_BROKER lost: the node's listing makes it an orphan
                listed = Observed(frozenset({NODE}), {NODE: addr}, {("ha_g", 2): NODE})
                (orphan,) = orphans(core.state, listed, CLUSTER)
                await service.placement._take(orphan, listed)
                assert [c for c, _, _ in node.seen].count(RequestCode.REMOVE_BROKER) == 2
            finally:
                await server.close()

    asyncio.run(scenario())


def test_orphans_are_members_alive_nodes_run_that_their_known_group_does_not_count() -> None:
    state = ControllerState()
    state.groups = {(CLUSTER, "ha_g"): BrokerGroup({1: BrokerMember("x:1", "c", 0)}, 1, 1)}
    where = {("ha_g", 1): "hamq@a", ("ha_g", 2): "hamq@b", ("ha_g", 3): "hamq@c"}
    where[("ha_gone", 1)] = "hamq@a"  # a group the controller does not know: not ours to judge
    seen = Observed(frozenset({"hamq@a", "hamq@b"}), {}, where)
    assert orphans(state, seen, CLUSTER) == [policy.RemoveMember("ha_g", 2, "hamq@b")]


def test_strays_are_client_topics_undeclared_or_not_recorded_in_the_group() -> None:
    state = ControllerState()
    state.topics = {
        ("/", "t"): policy.TopicDecl("/", "t", NODE, groups=("node_a",)),
        ("v", "u"): policy.TopicDecl("v", "u", NODE, groups=("ha_g", "node_a")),
        ("/", "lost"): policy.TopicDecl("/", "lost", NODE, groups=("ha_g",)),
    }
    held = [
        "t",
        "v%u",
        "lost",
        "gone",
        "v%also-gone",
        "%RETRY%g",
        "%RETRY%v%g",
        "%DLQ%g",
        "SCHEDULE_TOPIC_XXXX",
        "rmq_sys_wheel",
        "TBW102",
        "bad vhost!%x",
    ]
    found = strays(state, "node_a", held)
    assert found.undeclared == (("/", "gone"), ("v", "also-gone"))
    assert found.untracked == (("/", "lost"),)


def test_topics_the_state_does_not_account_for_are_deleted_or_recorded(tmp_path: Path) -> None:
    """Deleted through the controller: out of the group (not one declared again
    meanwhile). Placed by a create whose SetTopicGroups never committed (S1's F3): recorded
    as held, before the writable group, so it is retired, drained and dropped."""

    async def scenario() -> None:
        async with peer(tmp_path) as service:
            core, placement = service.driver.core, service.placement
            nobody = Observed(frozenset(), {}, {})
            held = ["kept", "deleted", "%RETRY%g", "TBW102"]
            async with group_master(service, held) as master:
                await service.propose(DeclareTopic("/", "kept", NODE))
                await service.propose(SetTopicGroups("/", "kept", ("node_a", "ha_g")))
                await service.propose(DeclareTopic("/", "moved", NODE))
                await service.propose(SetTopicGroups("/", "moved", ("node_a",)))
                await placement._take(CollectTopics("ha_g"), nobody)
                delete = RequestCode.DELETE_TOPIC_IN_BROKER
                assert [ext for c, _, ext in master.seen if c == delete] == [{"topic": "deleted"}]
                master.topics += ["moved"]  # its create landed, its SetTopicGroups did not
                await placement._take(CollectTopics("ha_g"), nobody)
                assert core.state.topics[("/", "moved")].groups == ("ha_g", "node_a")
                assert core.state.topics[("/", "kept")].groups == ("node_a", "ha_g")
                # held by no group: recorded as the writable one, and made writable (it
                # may be a read-only leftover of an earlier declaration: S1's F4)
                await service.propose(DeclareTopic("/", "again", NODE))
                master.topics += ["again"]
                await placement._take(CollectTopics("ha_g"), nobody)
                assert core.state.topics[("/", "again")].groups == ("ha_g",)
                update = RequestCode.UPDATE_AND_CREATE_TOPIC
                perms = [(e["topic"], e["perm"]) for c, _, e in master.seen if c == update]
                assert perms == [("again", 6)]

    asyncio.run(scenario())


def test_unwritable_are_topics_whose_writable_group_lacks_them_read_write() -> None:
    state = ControllerState()
    state.topics = {
        ("/", "here"): policy.TopicDecl("/", "here", NODE, groups=("node_a", "ha_g")),
        ("v", "gone"): policy.TopicDecl("v", "gone", NODE, groups=("ha_g",)),
        ("/", "retired"): policy.TopicDecl("/", "retired", NODE, groups=("ha_g",)),
        ("/", "old"): policy.TopicDecl("/", "old", NODE, groups=("ha_g", "node_a")),
        ("/", "new"): policy.TopicDecl("/", "new", NODE),
    }
    perms = {"here": 6, "retired": 4}
    assert unwritable(state, "ha_g", perms) == (("/", "retired"), ("v", "gone"))


def test_a_writable_placement_a_deposed_leader_deleted_is_created_again(tmp_path: Path) -> None:
    """A deposed leader's DropTopic (or RetireTopic) still in flight lands after the next
    leader moved the topic back to that group: the group is its writable one, so no plan
    places it there again, and producers were refused for good (S1's F5, sim seed 543)."""

    async def scenario() -> None:
        async with peer(tmp_path) as service:
            nobody = Observed(frozenset(), {}, {})
            async with group_master(service, ["retired", "elsewhere"]) as master:
                master.perms["retired"] = 4
                for name, groups in (
                    ("dropped", ("node_a", "ha_g")),
                    ("retired", ("ha_g",)),
                    ("elsewhere", ("ha_g", "node_a")),
                ):
                    await service.propose(DeclareTopic("/", name, NODE))
                    await service.propose(SetTopicGroups("/", name, groups))
                await service.placement._take(CollectTopics("ha_g"), nobody)
                update = RequestCode.UPDATE_AND_CREATE_TOPIC
                perms = [(e["topic"], e["perm"]) for c, _, e in master.seen if c == update]
                assert perms == [("dropped", 6), ("retired", 6)]

    asyncio.run(scenario())


def test_an_exclusive_topic_whose_connection_its_alive_node_does_not_list_is_deleted(
    tmp_path: Path,
) -> None:
    """After a grace of one node heartbeat timeout (a declaration committed after the
    heartbeat the driver saw was built); a node that reports no owners deletes nothing."""

    async def scenario() -> None:
        async with peer(tmp_path) as service:
            core, placement = service.driver.core, service.placement
            node_addr = f"127.0.0.1:{free_port()}"
            await service.propose(RegisterNode(NODE, node_addr))
            await service.propose(DeclareTopic("/", "mine", NODE, exclusive=True, owner="o1"))
            await service.propose(DeclareTopic("/", "theirs", NODE, exclusive=True, owner="o2"))
            here = Observed(frozenset({NODE}), {NODE: node_addr}, {})

            async def sweep(owners: frozenset[str] | None, now_ms: int) -> set[str]:
                core.nodes.record(NodeHeartbeat(NODE, node_addr, (), owners), now_ms)
                await placement._delete_orphaned_exclusive(core.state, here, now_ms, core.node.term)
                return {name for _, name in core.state.topics}

            start = monotonic_ms()
            assert await sweep(None, start) == {"mine", "theirs"}  # reports no owners
            assert await sweep(frozenset({"o1"}), start) == {"mine", "theirs"}  # grace
            assert await sweep(frozenset({"o1", "o2"}), start + 300) == {"mine", "theirs"}
            # o2 listed again: the grace starts over
            assert await sweep(frozenset({"o1"}), start + 400) == {"mine", "theirs"}
            late = start + 400 + HEARTBEAT_TIMEOUT_MS
            assert await sweep(frozenset({"o1"}), late) == {"mine"}

    asyncio.run(scenario())


def test_node_heartbeats_carry_their_open_connections_and_older_nodes_none() -> None:
    beat = NodeHeartbeat(NODE, "127.0.0.1:1", (), frozenset({"hamq@a/1f/2", "hamq@a/1f/1"}))
    ext = catalog.node_heartbeat_ext(beat)
    assert ext["owners"] == ["hamq@a/1f/1", "hamq@a/1f/2"]
    assert catalog.node_heartbeat(ext) == beat
    del ext["owners"]
    assert catalog.node_heartbeat(ext).owners is None
    with pytest.raises(InvalidArgument, match="owners"):
        catalog.node_heartbeat({**ext, "owners": [""]})


class FillingMaster(Recording):
    """An old group's master whose queue was empty at the round's drain check and then
    took a message from a producer routed before the move (it is still writable): from
    the first update of the topic on, queue 0 holds one message nobody consumed."""

    def __init__(self) -> None:
        super().__init__(lambda: None, ["t"])
        self.max_offset = 0

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        answer = super().handle(conn, frame)
        if frame.code == RequestCode.UPDATE_AND_CREATE_TOPIC:
            self.max_offset = 1
        if frame.code in (RequestCode.GET_MIN_OFFSET, RequestCode.GET_MAX_OFFSET):
            high = frame.code == RequestCode.GET_MAX_OFFSET and frame.ext["queue_id"] == 0
            return response_pieces(frame, ext={"offset": self.max_offset if high else 0})
        return answer


def test_a_drained_placement_is_read_only_and_still_drained_before_it_is_dropped(
    tmp_path: Path,
) -> None:
    """Dropped the round after the move, an old placement was never made read-only: a
    message a producer sent to it between the drain check and the delete was acknowledged
    and then deleted unread."""

    async def scenario() -> None:
        async with peer(tmp_path) as service, serving_master(service, FillingMaster()) as master:
            await service.propose(DeclareTopic("/", "t", NODE))
            await service.propose(SetTopicGroups("/", "t", ("ha_g", "node_a")))
            nobody = Observed(frozenset(), {}, {})
            with pytest.raises(StepRefused, match="not drained once read-only"):
                await service.placement._take(policy.DropTopic("/", "t", "ha_g"), nobody)
            codes = [c for c, _, _ in master.seen]
            assert RequestCode.DELETE_TOPIC_IN_BROKER not in codes
            update = codes.index(RequestCode.UPDATE_AND_CREATE_TOPIC)
            assert master.seen[update][2]["perm"] == 4
            groups = service.driver.core.state.topics[("/", "t")].groups
            assert groups == ("ha_g", "node_a")

    asyncio.run(scenario())


def test_the_drain_check_asks_each_old_master_for_its_offset_table_once(tmp_path: Path) -> None:
    """The table holds every topic's offsets: asked per placement, a migration of a
    thousand topics fetched it a thousand times a round."""

    async def scenario() -> None:
        async with peer(tmp_path) as service, serving_master(service, FillingMaster()) as master:
            for topic in ("t", "u"):
                await service.propose(DeclareTopic("/", topic, NODE))
                await service.propose(SetTopicGroups("/", topic, ("ha_g", "node_a")))
            drained = await service.placement._drained(service.driver.core.state)
            assert drained == {("/", "t", "ha_g"), ("/", "u", "ha_g")}
            codes = [c for c, _, _ in master.seen]
            assert codes.count(RequestCode.GET_ALL_CONSUMER_OFFSET) == 1

    asyncio.run(scenario())


class GarbledMaster(FillingMaster):
    """A master whose offset answers lack the offset (a broker of another version, a bug)."""

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code in (RequestCode.GET_MIN_OFFSET, RequestCode.GET_MAX_OFFSET):
            self.seen.append((frame.code, None, dict(frame.ext)))
            return response_pieces(frame, ext={"offsets": "?"})
        return super().handle(conn, frame)


def test_a_garbled_drain_answer_leaves_the_placement_undrained_not_the_round_undone(
    tmp_path: Path,
) -> None:
    """The drain checks run before the plan: one master's malformed answer raised out of
    them and every group's steps (elections, removals, placements) waited for the next
    round, which failed the same way."""

    async def scenario() -> None:
        async with peer(tmp_path) as service, serving_master(service, GarbledMaster()):
            await service.propose(DeclareTopic("/", "t", NODE))
            await service.propose(SetTopicGroups("/", "t", ("ha_g", "node_a")))
            assert await service.placement._drained(service.driver.core.state) == set()

    asyncio.run(scenario())
