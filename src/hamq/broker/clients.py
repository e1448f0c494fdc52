"""Who is connected to this broker: producer and consumer groups, from HEART_BEAT
(RocketMQ's ProducerManager / ConsumerManager). Consumers rebalance from
GET_CONSUMER_LIST_BY_GROUP, and are told NOTIFY_CONSUMER_IDS_CHANGED when their group
changes so they do not wait for their next periodic rebalance; the transaction check
asks a live producer of a group."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from hamq.errors import InvalidArgument
from hamq.net.connection import Connection
from hamq.protocol.codes import RequestCode
from hamq.protocol.limits import MAX_HEARTBEAT_GROUPS, MAX_NAME_LENGTH, MAX_TOPIC_LENGTH
from hamq.protocol.message import validate_name
from hamq.protocol.properties import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger(__name__)

CHANNEL_EXPIRED_TIMEOUT_MS = 120_000  # RocketMQ channelExpiredTimeout
MESSAGE_MODELS = ("clustering", "broadcasting")


@dataclass(frozen=True)
class ConsumerGroupEntry:
    group: str
    message_model: str
    subscriptions: dict[str, str]  # topic -> tag expression


@dataclass(frozen=True)
class Heartbeat:
    client_id: str
    producer_groups: list[str]
    consumer_groups: list[ConsumerGroupEntry]


def parse_heartbeat(body: object) -> Heartbeat:
    """A HEART_BEAT body, every field checked before any of it is applied (a malformed
    group used to fail half-way, after the groups before it had been registered)."""
    if not isinstance(body, dict):
        raise InvalidArgument("HEART_BEAT body must be a map")
    client_id = body.get("client_id")
    if (
        not isinstance(client_id, str)
        or not 0 < len(client_id) <= MAX_NAME_LENGTH
        or not client_id.isprintable()
    ):
        raise InvalidArgument(
            f"HEART_BEAT field 'client_id' must be 1..{MAX_NAME_LENGTH} "
            f"printable characters, got {client_id!r:.80}"
        )
    producers = _list(body, "producer_groups")
    consumers = _list(body, "consumer_groups")
    return Heartbeat(
        client_id,
        [validate_name(g, "HEART_BEAT producer group") for g in producers],
        [_consumer_entry(e) for e in consumers],
    )


def _list(body: dict, field: str) -> list:
    raw = body.get(field) or []
    if not isinstance(raw, list) or len(raw) > MAX_HEARTBEAT_GROUPS:
        raise InvalidArgument(
            f"HEART_BEAT field {field!r} must be a list of at most {MAX_HEARTBEAT_GROUPS} groups"
        )
    return raw


def _consumer_entry(entry: object) -> ConsumerGroupEntry:
    if not isinstance(entry, dict):
        raise InvalidArgument("HEART_BEAT field 'consumer_groups' must hold maps")
    group = validate_name(entry.get("group"), "HEART_BEAT consumer group")
    model = entry.get("message_model", "clustering")
    if model not in MESSAGE_MODELS:
        raise InvalidArgument(
            f"HEART_BEAT consumer group {group} 'message_model' must be one "
            f"of {MESSAGE_MODELS}, got {model!r:.80}"
        )
    if model == "clustering":  # the broker creates its retry topic
        validate_name(
            RETRY_GROUP_TOPIC_PREFIX + group,
            f"retry topic of consumer group {group}",
            MAX_TOPIC_LENGTH,
        )
    subscriptions = entry.get("subscriptions") or {}
    if not isinstance(subscriptions, dict) or not all(
        isinstance(t, str) and isinstance(e, str) for t, e in subscriptions.items()
    ):
        raise InvalidArgument(
            f"HEART_BEAT consumer group {group} 'subscriptions' must map topics to tag expressions"
        )
    return ConsumerGroupEntry(group, model, dict(subscriptions))


@dataclass
class ClientChannel:
    client_id: str
    conn: Connection
    last_update_ms: int
    message_model: str = ""
    subscriptions: dict[str, str] = field(default_factory=dict)


class ClientManager:
    def __init__(self) -> None:
        self.producers: dict[str, dict[str, ClientChannel]] = {}
        self.consumers: dict[str, dict[str, ClientChannel]] = {}
        # called when a consumer's heartbeat subscribes to a topic it did not before: a
        # group with no offset there yet may read from a queue's first message (the need
        # offset of a mirrored group drops at once, not at its next check)
        self.on_subscribe: list[Callable[[], None]] = []

    def heart_beat(self, conn: Connection, heartbeat: Heartbeat, now_ms: int) -> None:
        client_id = heartbeat.client_id
        for group in heartbeat.producer_groups:
            self.producers.setdefault(group, {})[client_id] = ClientChannel(client_id, conn, now_ms)
        subscribed = False
        for entry in heartbeat.consumer_groups:
            members = self.consumers.setdefault(entry.group, {})
            before = members.get(client_id)
            joined = before is None or before.conn is not conn
            if before is None or not entry.subscriptions.keys() <= before.subscriptions.keys():
                subscribed = True
            members[client_id] = ClientChannel(
                client_id, conn, now_ms, entry.message_model, entry.subscriptions
            )
            if joined:
                log.info("consumer %s joined group %s", client_id, entry.group)
                self._notify(entry.group)
        if subscribed:
            for hook in self.on_subscribe:
                hook()

    def is_registered(self, client_id: str) -> bool:
        """``client_id`` heartbeats to this broker (on a live connection), in any group."""
        return any(
            not members[client_id].conn.is_closed
            for table in (self.consumers, self.producers)
            for members in table.values()
            if client_id in members
        )

    def unregister(self, client_id: str) -> None:
        for table in (self.producers, self.consumers):
            for group, members in list(table.items()):
                if members.pop(client_id, None) is not None and table is self.consumers:
                    self._notify(group)

    def connection_closed(self, conn: Connection) -> None:
        self._drop(lambda ch: ch.conn is conn)

    def scan_expired(self, now_ms: int) -> None:
        """Forget channels not heard from for CHANNEL_EXPIRED_TIMEOUT_MS. The time a
        connection is held back by flow control (credit, an alarm) does not count: its
        heartbeats wait unread in the socket, and forgetting a held publisher would leave
        transaction check-backs without a producer until the hold ends."""
        for table in (self.producers, self.consumers):
            for members in table.values():
                for ch in members.values():
                    if ch.conn.held_back:
                        ch.last_update_ms = now_ms
        self._drop(lambda ch: now_ms - ch.last_update_ms > CHANNEL_EXPIRED_TIMEOUT_MS)

    def consumer_ids(self, group: str) -> list[str]:
        return sorted(self.consumers.get(group, {}))

    def producer_channels(self, group: str) -> list[ClientChannel]:
        return [ch for ch in self.producers.get(group, {}).values() if not ch.conn.is_closed]

    def _drop(self, doomed: Callable[[ClientChannel], bool]) -> None:
        """Forget channels; a client's queue locks stay (see broker/locks.py)."""
        for table in (self.producers, self.consumers):
            for group, members in list(table.items()):
                gone = [cid for cid, ch in members.items() if doomed(ch)]
                for cid in gone:
                    del members[cid]
                if not members:
                    del table[group]
                if gone and table is self.consumers:
                    log.info("consumers %s left group %s", gone, group)
                    self._notify(group)

    def _notify(self, group: str) -> None:
        for ch in self.consumers.get(group, {}).values():
            ch.conn.oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"group": group})
