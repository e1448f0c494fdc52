"""System message properties (RocketMQ's ``MessageConst`` names), retry and dead-letter
topic names, RocketMQ's delay levels, and the O(1) test the send path uses to spot a
held-back (delay, timer or transaction half) message without decoding properties.

``Message.encode`` puts a held-back property (``DELAY``, ``TIMER_DELIVER_MS`` or
``TRAN_MSG``) *first* in the properties map, so the broker only has to look at the bytes
where the first key of the batch's first message starts: plain sends pay one
``startswith`` per batch. As in RocketMQ, held-back messages are never batched: a batch
whose first message is held back is refused; the producer must not put one later in a
batch (the broker does not look there).
"""

from __future__ import annotations

import msgpack

from hamq.errors import MessageIllegal
from hamq.protocol.limits import INT64_MAX, MAX_BATCH_MESSAGES, MAX_QUEUE_NUMS, MAX_TOPIC_LENGTH
from hamq.protocol.message import decode_properties, message_bounds, validate_name

PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"  # RocketMQ's client-generated message id (MessageClientIDSetter)
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
# hamq's extension: a half message whose body is a whole batch of ``n`` encoded messages,
# committed as one record (RocketMQ has no transactional batches; the Spark sink needs them).
PROPERTY_TRANSACTION_BATCH = "TRAN_BATCH"
# RocketMQ's MessageConst.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: no check-back (and so no
# rollback after transaction_check_max) before the half message is this old.
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
# RabbitMQ's redelivered flag (seed 003): "true" on a message handed out again that may have
# been delivered before (pop: its invisible time ran out, or a new master took over while it
# was unacked). Set by the consumer from what the broker says, never stored.
PROPERTY_REDELIVERED = "REDELIVERED"

# RocketMQ's messageDelayLevel "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".
DELAY_LEVELS_MS = tuple(
    s * 1000
    for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
MAX_DELAY_LEVEL = len(DELAY_LEVELS_MS)

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"  # RocketMQ MixAll.RETRY_GROUP_TOPIC_PREFIX
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"  # RocketMQ MixAll.DLQ_GROUP_TOPIC_PREFIX
DEFAULT_MAX_RECONSUME_TIMES = 16  # RocketMQ maxReconsumeTimes

# Properties that make the broker hold a message back: delay/timer, transaction half
# messages. They lead the properties map.
SCHEDULE_PROPERTIES = (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TIMER_DELIVER_MS)
HELD_BACK_PROPERTIES = (*SCHEDULE_PROPERTIES, PROPERTY_TRANSACTION_PREPARED)
_LEADING_KEYS = tuple(msgpack.packb(name) for name in HELD_BACK_PROPERTIES)
# Where the first key starts after a msgpack map header: fixmap, map16, map32.
_FIRST_KEY_AT = {0xDE: 3, 0xDF: 5}
_FIXMAP_FIRST_KEY_AT = 1


def first_message_is_held_back(payload: bytes) -> bool:
    """True if the batch's first message leads its properties with a held-back property.
    The batch must already be validated (``validate_batch``)."""
    props_start, body_start, _ = message_bounds(payload, 0, len(payload))
    if body_start == props_start:
        return False
    key_at = props_start + _FIRST_KEY_AT.get(payload[props_start], _FIXMAP_FIRST_KEY_AT)
    return key_at < body_start and payload.startswith(_LEADING_KEYS, key_at)


def leading_held_back_properties(properties: dict[str, str]) -> dict[str, str]:
    """``properties`` reordered so held-back properties come first (see module doc)."""
    lead = {k: properties[k] for k in HELD_BACK_PROPERTIES if k in properties}
    return {**lead, **properties} if lead else properties


def decode_single_message(payload: bytes) -> tuple[dict[str, str], bytes]:
    """(properties, body) of a one-message batch payload, its properties checked (see
    ``validate_properties``)."""
    props_start, body_start, end = message_bounds(payload, 0, len(payload))
    if end != len(payload):
        raise MessageIllegal("expected exactly one message in the payload")
    try:
        properties = decode_properties(payload[props_start:body_start])
    except ValueError as err:  # msgpack's errors
        raise MessageIllegal(
            f"message properties are not a msgpack map of string to string: {err}"
        ) from None
    return validate_properties(properties), payload[body_start:]


# Properties the broker reads back as numbers: (low, high) of each. A value outside these
# would fail later, in a background service (check, delivery, send-back), not at the send.
_INT_PROPERTIES = {
    PROPERTY_DELAY_TIME_LEVEL: (1, MAX_DELAY_LEVEL),
    PROPERTY_TIMER_DELIVER_MS: (0, INT64_MAX),
    PROPERTY_TRANSACTION_BATCH: (1, MAX_BATCH_MESSAGES),
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: (0, INT64_MAX // 1000),
    PROPERTY_REAL_QUEUE_ID: (0, MAX_QUEUE_NUMS - 1),
    PROPERTY_RECONSUME_TIME: (0, INT64_MAX),
    PROPERTY_MAX_RECONSUME_TIMES: (0, INT64_MAX),
}
# RocketMQ's UNIQ_KEY is 32 hex digits; a producer may set its own, but not a huge one.
MAX_UNIQ_KEY_LENGTH = 128


def validate_properties(properties: object) -> dict[str, str]:
    """Properties of a message the broker will act on (held back, checked back, delivered
    later): a map of string to string whose typed keys hold what the broker expects;
    ``MessageIllegal`` naming the property otherwise."""
    if not isinstance(properties, dict):
        raise MessageIllegal(
            "message properties must be a msgpack map of string to string, got "
            f"{type(properties).__name__}"
        )
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise MessageIllegal(
                f"message property {key!r} must map a string to a string, "
                f"got {type(key).__name__} -> {type(value).__name__}"
            )
    for key, (low, high) in _INT_PROPERTIES.items():
        if key in properties:
            property_int(properties, key, low, high)
    if PROPERTY_PRODUCER_GROUP in properties:
        validate_name(
            properties[PROPERTY_PRODUCER_GROUP],
            f"property {PROPERTY_PRODUCER_GROUP}",
            error=MessageIllegal,
        )
    if PROPERTY_REAL_TOPIC in properties:
        validate_name(
            properties[PROPERTY_REAL_TOPIC],
            f"property {PROPERTY_REAL_TOPIC}",
            MAX_TOPIC_LENGTH,
            MessageIllegal,
        )
    if len(properties.get(PROPERTY_UNIQ_KEY, "")) > MAX_UNIQ_KEY_LENGTH:
        raise MessageIllegal(
            f"property {PROPERTY_UNIQ_KEY} is longer than {MAX_UNIQ_KEY_LENGTH} characters"
        )
    return properties


def reconsume_times_of(properties: dict[str, str]) -> int:
    """How often a stored message was consumed again. A plain message's properties are not
    decoded at send (that would cost every send a decode), so a producer may have put
    anything under RECONSUME_TIME: such a value counts as 0, and the copy a send-back
    writes carries a valid count from then on."""
    try:
        return property_int(properties, PROPERTY_RECONSUME_TIME, 0, INT64_MAX)
    except (KeyError, MessageIllegal):
        return 0


def property_int(properties: dict[str, str], key: str, low: int, high: int) -> int:
    """The integer in property ``key``: ASCII digits only (``str.isdigit`` accepts
    superscripts that ``int`` refuses), in ``low..high``."""
    raw = properties[key]
    if (
        not isinstance(raw, str)
        or not raw.isascii()
        or not raw.isdigit()
        or len(raw) > len(str(high))
        or not low <= int(raw) <= high
    ):
        raise MessageIllegal(
            f"property {key} must be an integer in {low}..{high} written in "
            f"ASCII digits, got {raw!r}"
        )
    return int(raw)
