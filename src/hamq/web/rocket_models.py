"""The RocketMQ-shaped API's bodies and answers, typed so the OpenAPI schema says exactly
what each route takes and gives (the fuzzer checks answers against it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from hamq.protocol.limits import INT64_MAX, MAX_BROKER_ID, MAX_QUEUE_NUMS
from hamq.store.metadata import PERM_READ_WRITE
from hamq.web.names import NameField, TopicField

# Strict: a client sends typed JSON, so "4" or true for a number is a mistake to refuse.
QueueNums = Annotated[StrictInt, Field(ge=1, le=MAX_QUEUE_NUMS)]
# A member's own id, as elections name it: controller and DLedger ids start at 1.
BrokerId = Annotated[StrictInt, Field(ge=1, le=MAX_BROKER_ID)]


class _Body(BaseModel):
    """A request body: an unknown key is a mistake the caller should hear about."""

    model_config = ConfigDict(extra="forbid")


# -- clusters and groups --------------------------------------------------------------------


class ClusterMember(BaseModel):
    broker_id: int = Field(description="As the name servers register it (0: the master).")
    addr: str
    role: Literal["master", "slave"]


class ClusterGroup(BaseModel):
    broker_name: str
    members: list[ClusterMember]


class Cluster(BaseModel):
    cluster_name: str
    groups: list[ClusterGroup]


class GroupMember(BaseModel):
    broker_id: int = Field(description="The member's own id: the one elections name.")
    addr: str
    role: Literal["master", "slave", "down"] = Field(description="down: the member is not alive.")
    broker_role: str | None = Field(description="As the member reports it, None if silent.")
    alive: bool
    in_sync: bool | None = Field(description="In the SyncStateSet; None without one.")
    epoch: int | None
    max_offset: int | None
    confirm_offset: int | None
    error: str | None = Field(description="Why the member's runtime info is missing.")


class BrokerGroup(BaseModel):
    cluster_name: str
    broker_name: str
    mode: Literal["controller", "dledger", "master_slave"]
    master_id: int | None
    master_addr: str | None
    master_epoch: int | None
    sync_state_set: list[int] | None
    sync_state_set_epoch: int | None
    confirm_offset: int | None
    members: list[GroupMember]
    controller_error: str | None = Field(
        None,
        description="Why the controller's view is missing (no quorum): the group is then as "
        "its registered members report it, a member that is down is not listed.",
    )


class ElectMaster(_Body):
    action: Literal["elect_master"]
    broker_id: BrokerId


# -- topics -----------------------------------------------------------------------------------


TopicKind = Literal["normal", "retry", "dlq", "system"]


class TopicSummary(BaseModel):
    name: str
    kind: TopicKind


class QueueData(BaseModel):
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


class BrokerData(BaseModel):
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = Field(description="Registered broker id -> address.")


class QueueOffsets(BaseModel):
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int


class TopicDetail(BaseModel):
    name: str
    vhost: str
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    queues: list[QueueOffsets]


class TopicSpec(_Body):
    read_queues: QueueNums = 4
    write_queues: QueueNums = 4
    perm: Literal[2, 4, 6] = Field(
        PERM_READ_WRITE, description="RocketMQ's PermName: 4 read, 2 write, 6 both."
    )
    cluster: NameField | None = Field(
        None, description="Only this cluster's masters (default: all)."
    )
    node: str | None = Field(
        None,
        description="In a cluster with nodes, the node (hamq@host) the topic is declared "
        "through, its home (default: the first alive node); its policy places it.",
    )


class TopicCreated(BaseModel):
    name: str
    vhost: str
    brokers: list[str] = Field(description="The broker groups holding the topic.")
    node: str | None = Field(None, description="The node it was declared through, if any.")


# -- consumer groups ------------------------------------------------------------------------


class ConsumerGroupSummary(BaseModel):
    name: str


class ConsumerQueue(BaseModel):
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int


class ConsumerGroup(BaseModel):
    group: str
    members: list[str] = Field(description="Client ids of the group's live consumers.")
    total_lag: int
    queues: list[ConsumerQueue]


class ResetOffset(_Body):
    action: Literal["reset_offset"]
    topic: TopicField
    timestamp_ms: Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]


class OffsetReset(BaseModel):
    broker_name: str
    queue_id: int
    old_offset: int | None = Field(description="None: the group had never committed there.")
    new_offset: int


class ResetDone(BaseModel):
    group: str
    topic: str
    queues: list[OffsetReset]


# -- messages -------------------------------------------------------------------------------


class MessageView(BaseModel):
    """``hamq.manage.messages.message_json``'s shape."""

    msg_id: str
    topic: str
    tags: str | None
    keys: str | None
    queue_id: int
    broker_name: str
    queue_offset: int
    born_timestamp: int = Field(description="Epoch milliseconds.")
    store_timestamp: int = Field(description="Epoch milliseconds.")
    properties: dict[str, str]
    properties_error: str | None = Field(
        None, description="Why the stored properties could not be read (then empty)."
    )
    body: str
    body_encoding: Literal["utf-8", "base64"]
    reconsume_times: int


class MessageList(BaseModel):
    messages: list[MessageView]
    truncated: bool = Field(
        False, description="A key search stopped at max_scan before the queues' start."
    )
