"""The route registry (RocketMQ's RouteInfoManager): who is alive, which groups serve which
topics. Pure state driven by calls that carry the current time, so it is testable without
sockets or clocks.

Acting master (seed 004, ``support_acting_master``): a group without a master whose
smallest-id member registered with ``enable_acting_master`` is routed with that member as
brokerId 0 (removed from its own id) and every queue of the group read-only, as RocketMQ's
``pickupTopicRouteData`` does, so unchanged clients send it their master-only requests
(offset queries, locks, END_TRANSACTION) and producers leave its queues alone. That
member (the "prime slave") also defines the group's queues while there is no master, as
the master's registration does otherwise, so a name server that restarted during the
outage still routes the group. The substitution is computed per route request: it ends
with the first registration of a master. Member-group answers (GET_BROKER_MEMBER_GROUP)
are never substituted: the members themselves need the truth to decide who acts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hamq.errors import NoPermission, SystemBusy
from hamq.store.metadata import PERM_READ_WRITE, PERM_WRITE

# RocketMQ's TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC: brokers that auto-create topics
# register it, and producers of unknown topics route through it.
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
# A member silent for 1/3 of its liveness timeout may have its id taken by a fellow
# member (see _check_conflict).
SILENT_FRACTION = 3
MASTER_ID = 0  # RocketMQ MixAll.MASTER_ID: the id the group's master registers under


@dataclass
class BrokerLiveInfo:
    cluster_name: str
    broker_name: str
    broker_id: int
    last_update_ms: int
    timeout_ms: int
    data_version: dict[str, int] = field(default_factory=dict)
    ha_addr: str = ""
    enable_acting_master: bool = False


@dataclass(frozen=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE


class RouteInfoManager:
    def __init__(
        self,
        broker_not_active_timeout_ms: int,
        max_route_entries: int = 1_000_000,
        support_acting_master: bool = False,
    ) -> None:
        self.default_timeout_ms = broker_not_active_timeout_ms
        self.support_acting_master = support_acting_master
        # Registrations cost memory until they expire (up to 10 min, the broker's choice):
        # a flood of forged groups and topics is bounded by this many members and routes.
        self.max_route_entries = max_route_entries
        self.route_count = 0  # (topic, broker name) pairs in topic_queue_table
        self.cluster_addr_table: dict[str, set[str]] = {}  # cluster -> broker names
        self.broker_addr_table: dict[str, dict[int, str]] = {}  # broker name -> id -> addr
        self.broker_cluster: dict[str, str] = {}  # broker name -> cluster
        self.live: dict[str, BrokerLiveInfo] = {}  # addr -> liveness
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        # broker name -> the topics it serves: a registration or expiry touches its own
        # topics only (walking every topic of every group, 300k entries, took 0.4 s of the
        # event loop per registration)
        self.topics_of: dict[str, set[str]] = {}

    def register_broker(
        self,
        cluster_name: str,
        broker_name: str,
        broker_id: int,
        addr: str,
        topic_configs: dict[str, dict[str, int]],
        data_version: dict[str, int],
        now_ms: int,
        timeout_ms: int | None = None,
        ha_addr: str = "",
        enable_acting_master: bool = False,
    ) -> bool:
        """Returns whether the group's membership changed (members are then notified).
        ``NoPermission`` if it conflicts with a live member, ``SystemBusy`` if it would
        grow the routes past ``max_route_entries`` (nothing is changed then)."""
        self._check_conflict(
            cluster_name, broker_name, broker_id, addr, _state_version(data_version), now_ms
        )
        # the master's topic configs define the group's queues; with no master, the prime
        # slave's do, without the write permission (RocketMQ's isPrimeSlave)
        defines_queues = broker_id == MASTER_ID or (
            self.support_acting_master
            and enable_acting_master
            and self._is_prime_slave(broker_name, broker_id, addr)
        )
        if broker_id != MASTER_ID and defines_queues:
            topic_configs = {
                topic: dict(cfg, perm=cfg["perm"] & ~PERM_WRITE)
                for topic, cfg in topic_configs.items()
            }
        self._check_room(broker_name, addr, topic_configs if defines_queues else None)
        before = dict(self.broker_addr_table.get(broker_name, {}))
        self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)
        members = self.broker_addr_table.setdefault(broker_name, {})
        # A member that changed its id at the same address (a slave promoted to master)
        # keeps one entry, as in RocketMQ.
        for other_id in [i for i, a in members.items() if a == addr and i != broker_id]:
            del members[other_id]
        # A member that came back on a new address (its old one silent past its timeout,
        # or promoted from another id) replaces its old registration.
        old = members.get(broker_id)
        if old is not None and old != addr:
            self.live.pop(old, None)
        members[broker_id] = addr
        self.broker_cluster[broker_name] = cluster_name
        self.live[addr] = BrokerLiveInfo(
            cluster_name,
            broker_name,
            broker_id,
            now_ms,
            timeout_ms or self.default_timeout_ms,
            data_version,
            ha_addr,
            enable_acting_master,
        )
        if defines_queues:
            self._replace_topics_of(broker_name, topic_configs)
        return members != before

    def broker_heartbeat(self, addr: str, now_ms: int) -> bool:
        """Lightweight heartbeat (seed 004): refresh liveness; False if unknown (the broker
        must register in full)."""
        info = self.live.get(addr)
        if info is None:
            return False
        info.last_update_ms = now_ms
        return True

    def unregister_broker(self, broker_name: str, broker_id: int, addr: str) -> None:
        self.live.pop(addr, None)
        members = self.broker_addr_table.get(broker_name, {})
        if members.get(broker_id) == addr:
            del members[broker_id]
        if not members:
            self._forget_group(broker_name)

    def scan_not_active_broker(self, now_ms: int) -> list[str]:
        """Drop members silent for longer than their timeout; returns their addresses."""
        expired = [
            addr
            for addr, info in self.live.items()
            if now_ms - info.last_update_ms > info.timeout_ms
        ]
        for addr in expired:
            info = self.live[addr]
            self.unregister_broker(info.broker_name, info.broker_id, addr)
        return expired

    def delete_topic(self, topic: str) -> bool:
        queues = self.topic_queue_table.pop(topic, None)
        for broker_name in queues or ():
            self.topics_of[broker_name].discard(topic)
            self.route_count -= 1
        return queues is not None

    # -- queries ------------------------------------------------------------------------
    def get_route(self, topic: str) -> dict[str, Any] | None:
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        queue_datas = []
        broker_datas = []
        for name, qd in sorted(queues.items()):
            members = self.broker_addr_table.get(name)
            if not members:
                continue
            addrs, perm = dict(members), qd.perm
            acting = self.acting_master_of(name)
            if acting is not None:  # routed as a read-only master (module docstring)
                addrs[MASTER_ID] = addrs.pop(acting)
                perm &= ~PERM_WRITE
            queue_datas.append(
                {
                    "broker_name": name,
                    "read_queue_nums": qd.read_queue_nums,
                    "write_queue_nums": qd.write_queue_nums,
                    "perm": perm,
                }
            )
            broker_datas.append(
                {
                    "cluster": self.broker_cluster.get(name, ""),
                    "broker_name": name,
                    "broker_addrs": addrs,
                }
            )
        if not queue_datas:
            return None
        return {"topic": topic, "queue_datas": queue_datas, "broker_datas": broker_datas}

    def acting_master_of(self, broker_name: str) -> int | None:
        """The broker id of the member routed as the group's read-only master, or None:
        only with ``support_acting_master``, and when that member enabled it."""
        if not self.support_acting_master:
            return None
        members = self.broker_addr_table.get(broker_name, {})
        acting = acting_master_id(members)
        if acting is None:
            return None
        info = self.live.get(members[acting])
        return acting if info is not None and info.enable_acting_master else None

    def get_broker_member_group(self, cluster_name: str, broker_name: str) -> dict[str, Any]:
        members = self.broker_addr_table.get(broker_name, {})
        return {
            "cluster": cluster_name,
            "broker_name": broker_name,
            "broker_addrs": dict(members),
            "ha_addrs": {
                i: self.live[a].ha_addr
                for i, a in members.items()
                if a in self.live and self.live[a].ha_addr
            },
        }

    def cluster_info(self) -> dict[str, Any]:
        return {
            "cluster_addr_table": {
                c: sorted(names) for c, names in self.cluster_addr_table.items()
            },
            "broker_addr_table": {
                name: {"cluster": self.broker_cluster.get(name, ""), "broker_addrs": dict(m)}
                for name, m in self.broker_addr_table.items()
            },
        }

    def topic_list(self) -> list[str]:
        return sorted(t for t in self.topic_queue_table if t != AUTO_CREATE_TOPIC_KEY_TOPIC)

    # -- internals ----------------------------------------------------------------------
    def _is_live(self, addr: str, now_ms: int) -> bool:
        info = self.live.get(addr)
        return info is not None and now_ms - info.last_update_ms <= info.timeout_ms

    def _is_silent(self, addr: str, now_ms: int) -> bool:
        """Not heard from for a third of its timeout (three heartbeats of a broker with
        the defaults: 1 s heartbeats, 10 s timeout)."""
        info = self.live[addr]
        return now_ms - info.last_update_ms > info.timeout_ms // SILENT_FRACTION

    def _check_conflict(
        self,
        cluster_name: str,
        broker_name: str,
        broker_id: int,
        addr: str,
        state_version: int,
        now_ms: int,
    ) -> None:
        """Without authentication, a registration may not take over what a live member
        holds: its broker id or its group's cluster, except as ``_check_takeover`` allows."""
        holder = self.broker_addr_table.get(broker_name, {}).get(broker_id)
        if holder is not None and holder != addr and self._is_live(holder, now_ms):
            self._check_takeover(broker_name, broker_id, addr, state_version, holder, now_ms)
        cluster = self.broker_cluster.get(broker_name)
        members = self.broker_addr_table.get(broker_name, {}).values()
        if (
            cluster is not None
            and cluster != cluster_name
            and any(self._is_live(a, now_ms) for a in members)
        ):
            raise NoPermission(
                f"broker group {broker_name} belongs to cluster {cluster} with "
                f"live members; refused in cluster {cluster_name} for {addr}"
            )

    def _check_takeover(
        self,
        broker_name: str,
        broker_id: int,
        addr: str,
        state_version: int,
        holder: str,
        now_ms: int,
    ) -> None:
        """May ``addr`` take ``broker_id`` from ``holder``, a live member? Only a live
        member of the same group may (else anyone could join as a slave under a free id
        and then claim the master's). For brokerId 0 the state versions decide first
        (RocketMQ 5): the master epoch in controller mode, the Raft term in DLedger mode.
        A newer one is the elected master: it takes the id at once, though the deposed
        one may still heartbeat (a master cut off from its controller only); an older
        one is a deposed master and is refused. Equal versions (master-slave mode sends
        0) leave the id to a fellow member only once the holder has gone silent (DLedger
        elected it after the leader died)."""
        held = _state_version(self.live[holder].data_version)
        if broker_id == MASTER_ID and state_version < held:
            raise NoPermission(
                f"broker {broker_name}/{broker_id} is held by live member {holder} in "
                f"state version {held}; refused for {addr} in the older state version "
                f"{state_version} (a deposed master: re-read the role)"
            )
        registrant = self.live.get(addr)
        fellow = (
            registrant is not None
            and registrant.broker_name == broker_name
            and self._is_live(addr, now_ms)
        )
        newer = broker_id == MASTER_ID and state_version > held
        if not (fellow and (newer or self._is_silent(holder, now_ms))):
            raise NoPermission(
                f"broker {broker_name}/{broker_id} is registered by live "
                f"member {holder}; refused for {addr}"
            )

    def _is_prime_slave(self, broker_name: str, broker_id: int, addr: str) -> bool:
        """Would this member, once registered, have the smallest id of a masterless group?"""
        others = [i for i, a in self.broker_addr_table.get(broker_name, {}).items() if a != addr]
        return MASTER_ID not in others and all(broker_id < i for i in others)

    def _check_room(
        self,
        broker_name: str,
        addr: str,
        topic_configs: dict[str, dict[str, int]] | None,
    ) -> None:
        """``topic_configs``: those that will define the group's queues, None if these do not."""
        grow = addr not in self.live
        if topic_configs is not None:
            grow += len(topic_configs) - len(self.topics_of.get(broker_name, ()))
        if grow > 0 and len(self.live) + self.route_count + grow > self.max_route_entries:
            raise SystemBusy(
                f"this name server holds {len(self.live)} members and "
                f"{self.route_count} routes; {addr} would add {grow} more than "
                f"max_route_entries ({self.max_route_entries}) allows"
            )

    def _replace_topics_of(
        self, broker_name: str, topic_configs: dict[str, dict[str, int]]
    ) -> None:
        self._drop_topics_of(
            broker_name, self.topics_of.get(broker_name, set()) - topic_configs.keys()
        )
        self.route_count += len(topic_configs) - len(self.topics_of.get(broker_name, ()))
        for topic, cfg in topic_configs.items():
            self.topic_queue_table.setdefault(topic, {})[broker_name] = QueueData(
                broker_name, cfg["read_queue_nums"], cfg["write_queue_nums"], cfg["perm"]
            )
        self.topics_of[broker_name] = set(topic_configs)

    def _drop_topics_of(self, broker_name: str, topics: set[str]) -> None:
        for topic in topics:
            queues = self.topic_queue_table.get(topic)
            if queues is not None:
                queues.pop(broker_name, None)
                if not queues:
                    del self.topic_queue_table[topic]

    def _forget_group(self, broker_name: str) -> None:
        self.broker_addr_table.pop(broker_name, None)
        cluster = self.broker_cluster.pop(broker_name, None)
        if cluster is not None:
            names = self.cluster_addr_table.get(cluster, set())
            names.discard(broker_name)
            if not names:
                self.cluster_addr_table.pop(cluster, None)
        topics = self.topics_of.pop(broker_name, set())
        self.route_count -= len(topics)
        self._drop_topics_of(broker_name, topics)


def acting_master_id(broker_ids: Iterable[int]) -> int | None:
    """Seed 004's choice of a group's acting master: with no master (brokerId 0) among
    the members, the smallest broker id; None when there is a master or no member. The
    brokers decide with the same rule (``broker/acting_master.py``), from the same member
    group, so the member routed as brokerId 0 is the one serving master-only work."""
    ids = list(broker_ids)
    if not ids or MASTER_ID in ids:
        return None
    return min(ids)


def _state_version(data_version: dict[str, int]) -> int:
    """A registration's state version (RocketMQ's DataVersion.stateVersion): the master
    epoch or Raft term a member registers in; 0 when it has none."""
    return data_version.get("state_version", 0)
