"""Request and response bodies of the RabbitMQ-shaped routes, with RabbitMQ's keys
(``apply-to``, ``slave_nodes``, ``message_stats``...) so its users' scripts read them
unchanged; hamq's own additions (``lag``, ``broker_name``) sit beside them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt


class PolicyBody(BaseModel):
    """PUT /api/policies/{vhost}/{name}: RabbitMQ's body. ``apply-to`` "queues" (RabbitMQ's
    word) means topics; the definition's keys are checked as ``set-policy`` checks them."""

    model_config = ConfigDict(populate_by_name=True)

    pattern: str = Field(description="Regular expression over topic names", examples=["^ha."])
    definition: dict[str, Any] = Field(
        description="RabbitMQ's keys: ha-mode (all, exactly, nodes), ha-params (a count for "
        "exactly, node names hamq@host for nodes), ha-sync-mode (manual, automatic), "
        "ha-sync-batch-size, ha-promote-on-shutdown and ha-promote-on-failure (when-synced, "
        "always), queue-master-locator",
        examples=[{"ha-mode": "all"}, {"ha-mode": "exactly", "ha-params": 2}],
    )
    # RabbitMQ refuses "3" and true: JSON's types are the caller's, not to be guessed at.
    priority: StrictInt = 0
    apply_to: str = Field("topics", alias="apply-to", description="topics (or queues), all")


class PolicyOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    vhost: str
    name: str
    pattern: str
    apply_to: str = Field(alias="apply-to")
    definition: dict[str, Any]
    priority: int


class QueueOut(BaseModel):
    """A declared topic as RabbitMQ's queue: ``node`` hosts the master, ``slave_nodes``
    the alive mirrors, ``synchronised_slave_nodes`` those in the SyncStateSet. A node is
    None until a heartbeat of the node lists a just-added member."""

    name: str
    vhost: str
    policy: str | None
    node: str | None
    slave_nodes: list[str | None]
    synchronised_slave_nodes: list[str | None]
    messages: int | None
    lag: int | None
    broker_name: str | None
    master_address: str | None
    slave_addresses: list[str]


class QueueAction(BaseModel):
    action: Literal["sync", "cancel_sync"]


class VhostOut(BaseModel):
    name: str


class NodeMember(BaseModel):
    cluster_name: str
    broker_name: str
    broker_id: int
    address: str


class NodeOut(BaseModel):
    """A process of the cluster, in one of two shapes. In a cluster with nodes: a node
    (container) the controller places mirrors on, RabbitMQ's ``hamq@host``, with the
    members it hosts; ``role`` and ``pid`` are null. Without nodes: a broker member as the
    name servers register it, named by its address, ``members`` = itself, with its
    ``role`` and ``pid``."""

    name: str
    running: bool
    address: str
    members: list[NodeMember]
    role: Literal["master", "slave", "down"] | None = Field(
        None, description="A broker member's own role; null for a node."
    )
    pid: int | None = Field(None, description="A running broker member's process id.")


class RateSample(BaseModel):
    timestamp: int  # ms since the epoch
    sample: float


class RateDetails(BaseModel):
    """RabbitMQ's ``*_details``: the latest rate (messages per second) and its history."""

    rate: float
    samples: list[RateSample]


class MessageStats(BaseModel):
    publish: int
    publish_details: RateDetails
    deliver_get: int
    deliver_get_details: RateDetails


class QueueTotals(BaseModel):
    messages: int
    lag: int


class GroupMember(BaseModel):
    broker_id: int
    address: str


class GroupOut(BaseModel):
    broker_name: str
    cluster_name: str
    master_address: str | None
    members: list[GroupMember]


class ObjectTotals(BaseModel):
    topics: int
    groups: int
    brokers: int


class Overview(BaseModel):
    cluster_name: str
    node_count: int
    object_totals: ObjectTotals
    message_stats: MessageStats
    queue_totals: QueueTotals
    groups: list[GroupOut]


class TopicSeries(BaseModel):
    publish_rate: list[tuple[int, float]]
    deliver_rate: list[tuple[int, float]]


class HistorySeries(BaseModel):
    publish_rate: list[tuple[int, float]]
    deliver_rate: list[tuple[int, float]]
    lag: list[tuple[int, float]]
    topics: dict[str, TopicSeries]


class HistoryOut(BaseModel):
    interval_s: float
    series: HistorySeries
