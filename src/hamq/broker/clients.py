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

log = logging.getLogger(__name__)

CHANNEL_EXPIRED_TIMEOUT_MS = 120_000  # RocketMQ channelExpiredTimeout


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

    def heart_beat(self, conn: Connection, heartbeat: dict, now_ms: int) -> None:
        client_id = heartbeat.get("client_id")
        if not isinstance(client_id, str) or not client_id:
            raise InvalidArgument("HEART_BEAT needs a client_id")
        for group in heartbeat.get("producer_groups") or []:
            self.producers.setdefault(group, {})[client_id] = ClientChannel(client_id, conn, now_ms)
        for entry in heartbeat.get("consumer_groups") or []:
            group = entry["group"]
            members = self.consumers.setdefault(group, {})
            joined = client_id not in members or members[client_id].conn is not conn
            members[client_id] = ClientChannel(client_id, conn, now_ms,
                                               entry.get("message_model", "clustering"),
                                               dict(entry.get("subscriptions") or {}))
            if joined:
                log.info("consumer %s joined group %s", client_id, group)
                self._notify(group)

    def unregister(self, client_id: str) -> None:
        for table in (self.producers, self.consumers):
            for group, members in list(table.items()):
                if members.pop(client_id, None) is not None and table is self.consumers:
                    self._notify(group)

    def connection_closed(self, conn: Connection) -> None:
        self._drop(lambda ch: ch.conn is conn)

    def scan_expired(self, now_ms: int) -> None:
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
