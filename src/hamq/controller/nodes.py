"""Soft state: which nodes (``hamq container`` with a node name) are alive and which
broker-group members each says it hosts (seed 003).

Nodes heartbeat every controller peer one-way; each peer keeps the last report of every
node the replicated state knows (so reports from anyone cannot grow the table), and only
the serving leader's placement driver acts on them. Time comes in as an argument, this
peer's own monotonic clock, as in ``liveness.py``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostedMember:
    """A broker-group member running in a node's container."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str


@dataclass(frozen=True)
class NodeHeartbeat:
    """CONTROLLER_NODE_HEARTBEAT: the node, its container's address and its members;
    ``owners``: the ids of its open declaring connections (an exclusive topic whose owner
    is not among them lost its connection), None from a node that does not report them."""

    node: str
    address: str
    members: tuple[HostedMember, ...]
    owners: frozenset[str] | None = None


@dataclass(frozen=True)
class NodeReport:
    """A node's last heartbeat and when it arrived."""

    address: str
    members: tuple[HostedMember, ...]
    last_seen_ms: int
    owners: frozenset[str] | None = None


class NodeLiveness:
    """Last reports per node; a node is alive while its last report is younger than
    ``timeout_ms`` (``node_heartbeat_timeout_ms``)."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self._reports: dict[str, NodeReport] = {}

    def record(self, heartbeat: NodeHeartbeat, now_ms: int) -> None:
        self._reports[heartbeat.node] = NodeReport(
            heartbeat.address, heartbeat.members, now_ms, heartbeat.owners
        )

    def report(self, node: str) -> NodeReport | None:
        return self._reports.get(node)

    def is_alive(self, node: str, now_ms: int) -> bool:
        report = self._reports.get(node)
        return report is not None and now_ms - report.last_seen_ms < self.timeout_ms

    def alive(self, now_ms: int) -> frozenset[str]:
        return frozenset(node for node in self._reports if self.is_alive(node, now_ms))

    def node_of(self, cluster_name: str, broker_name: str, broker_id: int) -> str | None:
        """The node whose last report lists this member (None: no node does)."""
        for node, report in self._reports.items():
            for member in report.members:
                if (member.cluster_name, member.broker_name, member.broker_id) == (
                    cluster_name,
                    broker_name,
                    broker_id,
                ):
                    return node
        return None
