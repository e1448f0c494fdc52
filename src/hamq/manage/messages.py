"""A stored message as JSON, the one shape the CLI (``hamq admin query-msg-*``) and the
web API (``GET /api/messages/...``) print: a body that is not UTF-8 goes as base64, and
properties that cannot be read (stored before sends checked them) are named, never fatal."""

from __future__ import annotations

import base64
from typing import Any

from hamq.client.message import PROPERTY_KEYS, PROPERTY_TAGS, MessageExt
from hamq.errors import MessageIllegal


def message_json(msg: MessageExt) -> dict[str, Any]:
    try:
        properties, error = dict(msg.properties), None
    except (ValueError, MessageIllegal) as err:  # msgpack's errors are ValueErrors
        properties, error = {}, f"properties cannot be read: {err}"
    try:
        body, encoding = msg.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(msg.body).decode(), "base64"
    return {
        "msg_id": msg.msg_id if error is None else msg.offset_msg_id,
        "topic": msg.topic if error is None else msg.queue.topic,
        "tags": properties.get(PROPERTY_TAGS),
        "keys": properties.get(PROPERTY_KEYS),
        "queue_id": msg.queue_id,
        "broker_name": msg.broker_name,
        "queue_offset": msg.queue_offset,
        "born_timestamp": msg.born_timestamp_ms,
        "store_timestamp": msg.store_timestamp_ms,
        "properties": properties,
        "properties_error": error,
        "body": body,
        "body_encoding": encoding,
        "reconsume_times": msg.reconsume_times if error is None else 0,
    }
