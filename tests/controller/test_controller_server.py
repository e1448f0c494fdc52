"""Real controller processes (``hamq controller``, and a name server with the controller
embedded) on loopback: the Raft election between peers, the wire contract's answers and
refusals, the NOT_LEADER hint the client follows, role-change notifications, a kill -9 of
the Raft leader, a restart that resumes from the peer's own log and snapshot, and
malformed requests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hamq.client.controller import ControllerClient
from hamq.controller.requests import BrokerHeartbeat
from hamq.errors import ControllerFenced, ControllerRefused
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.controller import ReplicaInfo, role_changed
from helpers import free_port, until

CLUSTER, GROUP = "TestCluster", "broker-a"
# Members' listen addresses: nothing listens there, except where a test plays member 1.
M1, M2 = (f"127.0.0.1:{free_port()}" for _ in range(2))
# Members in these tests never heartbeat again after registering: a long timeout keeps the
# master-timeout scan from electing while a test reads the state.
SETTINGS = {
    "controller_election_timeout_ms": 500,
    "controller_heartbeat_timeout_ms": 120_000,
    "controller_snapshot_interval_entries": 3,
}
DEADLINE_S = 30.0


def _start_peers(cluster, count: int = 3, **settings) -> dict[str, str]:
    """``count`` standalone peers; {process name: listen address}."""
    addrs = {f"controller{i}": f"127.0.0.1:{free_port()}" for i in range(1, count + 1)}
    peers = [f"{i}@{addr}" for i, addr in enumerate(addrs.values(), start=1)]
    for i, (name, addr) in enumerate(addrs.items(), start=1):
        cluster.start_controller(
            name, addr, controller_peers=peers, controller_self_id=i, **(SETTINGS | settings)
        )
    return addrs


async def _metadata(addr: str) -> dict | None:
    client = ControllerClient([addr], timeout_s=1.0)
    try:
        return await client.metadata()
    except Exception:  # noqa: BLE001 - a peer that is down or starting has no view yet
        return None
    finally:
        await client.close()


async def _leader(addrs, timeout_s: float = DEADLINE_S) -> str:
    """The listen address every live peer agrees leads."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        views = [await _metadata(a) for a in addrs]
        leaders = {a for a, v in zip(addrs, views, strict=True) if v and v["is_leader"]}
        named = {v["leader_addr"] for v in views if v}
        if len(leaders) == 1 and named == leaders:
            return leaders.pop()
        await asyncio.sleep(0.1)
    raise AssertionError(f"no agreed controller leader among {addrs}")


async def _raw(addr: str, code: int, ext: dict):
    pool = ConnectionPool()
    try:
        conn = await pool.get(addr)
        return await conn.request(code, ext, timeout_s=5.0)
    finally:
        await pool.close()


async def _beat(client: ControllerClient) -> None:
    """Both members report to every peer, as they do every heartbeat interval."""
    for broker_id, addr in ((1, M1), (2, M2)):
        await client.heartbeat(BrokerHeartbeat(CLUSTER, GROUP, broker_id, addr, 1, 0, 0))


def _has_snapshot(data_dir: Path) -> bool:
    return (data_dir / "snapshot").is_file()


def _spoil_snapshot(data_dir: Path) -> None:
    (data_dir / "snapshot").write_bytes(b"not a snapshot")


async def _group_of_two(client: ControllerClient) -> ReplicaInfo:
    """Members 1 and 2 registered, 1 elected on its registration, the set grown to both."""
    assert await client.get_next_broker_id(CLUSTER, GROUP) == 1
    await client.apply_broker_id(CLUSTER, GROUP, 1, M1, "check-1")
    first = await client.register_broker(CLUSTER, GROUP, 1, M1, 0, 0, "check-1")
    assert first.master_id is None and first.members == ((1, M1),)
    elected = await client.elect_master(CLUSTER, GROUP, 1, trigger="register")
    assert (elected.master_id, elected.master_addr, elected.master_epoch) == (1, M1, 1)
    assert await client.get_next_broker_id(CLUSTER, GROUP) == 2
    await client.apply_broker_id(CLUSTER, GROUP, 2, M2, "check-2")
    await client.register_broker(CLUSTER, GROUP, 2, M2, 1, 0, "check-2")
    await _beat(client)
    assert await client.alter_sync_state_set(CLUSTER, GROUP, 1, 1, [1, 2], 1) == (
        frozenset({1, 2}),
        2,
    )
    return await client.get_replica_info(CLUSTER, GROUP)


def test_three_peers_answer_the_contract_and_refuse_stale_epochs(cluster_factory):
    addrs = list(_start_peers(cluster_factory()).values())

    async def scenario():
        leader = await _leader(addrs)
        follower = next(a for a in addrs if a != leader)
        # a follower refuses a change and names the leader
        frame = await _raw(
            follower,
            RequestCode.CONTROLLER_GET_REPLICA_INFO,
            {"cluster_name": CLUSTER, "broker_name": GROUP},
        )
        assert frame.code == ResponseCode.CONTROLLER_NOT_LEADER
        assert frame.ext["leader_addr"] == leader
        # a client that knows only the follower follows that hint
        client = ControllerClient([follower])
        try:
            info = await _group_of_two(client)
            assert client.leader == leader
            assert info == ReplicaInfo(1, M1, 1, frozenset({1, 2}), 2, ((1, M1), (2, M2)))
            with pytest.raises(ControllerFenced) as stale_master:
                await client.alter_sync_state_set(CLUSTER, GROUP, 1, 0, [1], 2)
            assert stale_master.value.code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
            with pytest.raises(ControllerFenced) as stale_set:
                await client.alter_sync_state_set(CLUSTER, GROUP, 1, 1, [1], 1)
            assert stale_set.value.code == ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
            with pytest.raises(ControllerRefused) as taken:
                await client.apply_broker_id(CLUSTER, GROUP, 1, M2, "another broker")
            assert taken.value.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
            assert await client.get_replica_info(CLUSTER, GROUP) == info
            (group,) = await client.sync_state_data([GROUP])
            assert group["master_epoch"] == 1 and group["sync_state_set"] == [1, 2]
            assert [m["alive"] for m in group["members"]] == [True, True]
        finally:
            await client.close()

    asyncio.run(scenario())


def test_kill9_of_the_raft_leader_keeps_the_state_and_a_restarted_peer_catches_up(
    cluster_factory,
):
    cluster = cluster_factory()
    by_name = _start_peers(cluster)
    addrs = list(by_name.values())

    async def scenario():
        old = await _leader(addrs)
        client = ControllerClient(addrs)
        try:
            before = await _group_of_two(client)
            old_name = next(n for n, a in by_name.items() if a == old)
            assert _has_snapshot(cluster.root / old_name)  # 6 events, a snapshot every 3
            cluster.procs[old_name].kill9()
            survivors = [a for a in addrs if a != old]
            new = await _leader(survivors)
            assert new != old
            assert await client.get_replica_info(CLUSTER, GROUP) == before
            assert client.leader == new
            await _beat(client)
            # the new leader takes changes: the set shrinks to the master
            assert await client.alter_sync_state_set(CLUSTER, GROUP, 1, 1, [1], 2) == (
                frozenset({1}),
                3,
            )
            cluster.procs[old_name].start()  # from its own log and snapshot
            leading = await _metadata(new)
            assert leading is not None
            for _ in range(int(DEADLINE_S / 0.1)):
                view = await _metadata(old)
                if view and view["applied_index"] >= leading["commit_index"]:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the restarted peer never caught up")
            assert view["leader_addr"] == new and not view["is_leader"]
        finally:
            await client.close()

    asyncio.run(scenario())


def test_a_restarted_peer_serves_its_state_from_log_and_snapshot_or_log_alone(cluster_factory):
    cluster = cluster_factory()
    (addr,) = _start_peers(cluster, count=1).values()

    async def scenario():
        await _leader([addr])
        client = ControllerClient([addr])
        try:
            before = await _group_of_two(client)
            cluster.procs["controller1"].kill9()
            assert _has_snapshot(cluster.root / "controller1")
            cluster.procs["controller1"].start()
            assert await client.get_replica_info(CLUSTER, GROUP) == before
            assert await client.get_next_broker_id(CLUSTER, GROUP) == 3
            # a snapshot that cannot be read is ignored: the whole log is still there
            cluster.procs["controller1"].kill9()
            _spoil_snapshot(cluster.root / "controller1")
            cluster.procs["controller1"].start()
            assert await client.get_replica_info(CLUSTER, GROUP) == before
        finally:
            await client.close()

    asyncio.run(scenario())


def test_the_controller_embedded_in_a_name_server_answers_the_same(cluster_factory):
    cluster = cluster_factory()
    cluster.start_namesrv(enable_controller_in_namesrv=True, **SETTINGS)
    addr = cluster.namesrv_addrs[0]

    async def scenario():
        await _leader([addr])
        client = ControllerClient([addr])
        try:
            info = await _group_of_two(client)
            assert info.master_addr == M1
            with pytest.raises(ControllerFenced):
                await client.alter_sync_state_set(CLUSTER, GROUP, 1, 0, [1], 2)
            view = await client.metadata()
            assert view["is_leader"] and view["peers"] == [[1, addr]]
        finally:
            await client.close()
        # still a name server: its own requests are answered on the same port
        frame = await _raw(addr, RequestCode.GET_BROKER_CLUSTER_INFO, {})
        assert frame.code == ResponseCode.SUCCESS

    asyncio.run(scenario())
    assert (cluster.root / "namesrv" / "controller" / "raft").is_dir()


def test_a_master_that_stops_reporting_is_replaced_by_the_scan(cluster_factory):
    timeout_ms = 1000
    peers = _start_peers(cluster_factory(), controller_heartbeat_timeout_ms=timeout_ms)
    addrs = list(peers.values())

    async def scenario():
        await _leader(addrs)
        client = ControllerClient(addrs)
        try:
            await _group_of_two(client)
            silent_at = asyncio.get_running_loop().time()
            for _ in range(int(DEADLINE_S / 0.2)):  # member 2 reports on, member 1 is gone
                await client.heartbeat(BrokerHeartbeat(CLUSTER, GROUP, 2, M2, 1, 0, 0))
                info = await client.get_replica_info(CLUSTER, GROUP)
                if info.master_id != 1:
                    break
                await asyncio.sleep(0.2)
            replaced_after_s = asyncio.get_running_loop().time() - silent_at
            assert (info.master_id, info.master_addr, info.master_epoch) == (2, M2, 2)
            assert info.sync_state_set == frozenset({2})
            assert replaced_after_s >= timeout_ms / 1000 - 0.3  # not before it timed out
            view = await client.metadata()
            assert view["elections"] >= 1
            assert view["unclean_elections"] == view["failed_elections"] == 0
        finally:
            await client.close()

    asyncio.run(scenario())


class _Member:
    """Member 1's listen port: records what the controller tells it."""

    def __init__(self) -> None:
        self.notices: list[dict] = []

    def handle(self, conn, frame):
        assert frame.code == RequestCode.NOTIFY_BROKER_ROLE_CHANGED and frame.is_oneway
        self.notices.append(frame.ext)

    def after_batch(self) -> None:
        pass


def test_members_hear_of_elections_and_alters_at_once(cluster_factory):
    cluster = cluster_factory()
    (addr,) = _start_peers(cluster, count=1).values()

    async def scenario():
        member = _Member()
        server = Server(member)
        await server.start(M1)
        await _leader([addr])
        client = ControllerClient([addr])
        try:
            await _group_of_two(client)  # member 2 listens nowhere: skipped, nothing fails
            await until(lambda: len(member.notices) == 2, DEADLINE_S, "two notifications")
        finally:
            await client.close()
            await server.close()
        (key, elected), (_, altered) = (role_changed(ext) for ext in member.notices)
        assert key == (CLUSTER, GROUP)
        assert (elected.master_id, elected.master_epoch, elected.sync_state_set) == (
            1,
            1,
            frozenset({1}),
        )
        assert (altered.sync_state_set, altered.sync_state_set_epoch) == (frozenset({1, 2}), 2)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("code", "ext", "field"),
    [
        (
            RequestCode.CONTROLLER_ELECT_MASTER,
            {"cluster_name": CLUSTER, "broker_name": GROUP, "trigger": "now", "broker_id": 2},
            "trigger",
        ),
        (
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
            {
                "cluster_name": CLUSTER,
                "broker_name": GROUP,
                "master_id": 1,
                "master_epoch": 1,
                "sync_state_set": "1",
                "sync_state_set_epoch": 2,
            },
            "sync_state_set",
        ),
        (
            RequestCode.CLEAN_BROKER_DATA,
            {"cluster_name": CLUSTER, "broker_name": "../" + GROUP, "broker_ids": [2]},
            "broker_name",
        ),
        (
            RequestCode.CONTROLLER_BROKER_HEARTBEAT,
            {"cluster_name": CLUSTER, "broker_name": GROUP, "broker_id": 2, "epoch": -1},
            "broker_addr",
        ),
    ],
)
def test_a_malformed_request_is_refused_and_changes_nothing(cluster_factory, code, ext, field):
    cluster = cluster_factory()
    (addr,) = _start_peers(cluster, count=1).values()

    async def scenario():
        await _leader([addr])
        client = ControllerClient([addr])
        try:
            before = await _group_of_two(client)
            index = (await client.metadata())["commit_index"]
            frame = await _raw(addr, code, ext)
            assert frame.code == ResponseCode.INVALID_ARGUMENT
            assert field in frame.remark
            assert await client.get_replica_info(CLUSTER, GROUP) == before
            assert (await client.metadata())["commit_index"] == index
        finally:
            await client.close()

    asyncio.run(scenario())
