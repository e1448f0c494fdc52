"""The data source's options, checked once on the driver so a typo fails the query with a
readable message instead of a hang on an executor or an option silently ignored. Spark
hands them over with lower-cased keys and string values; Spark's Kafka source's names are
taken where they mean the same thing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_GROUP = "hamq-spark"
DEFAULT_SINK_GROUP = "hamq-spark-sink"
# Long enough for a master to restart and serve the planned range again.
DEFAULT_POLL_TIMEOUT_MS = 120_000

# The ways to name what is read; exactly one is given (Kafka's source has the last three).
TOPIC_OPTIONS = ("topic", "subscribe", "subscribePattern", "assign")
READ_OPTIONS = (
    "namesrv",
    *TOPIC_OPTIONS,
    "startingOffsets",
    "startingTimestamp",
    "endingOffsets",
    "group",
    "maxRecordsPerPartition",
    "minPartitions",
    "maxRecordsPerTrigger",
    "maxOffsetsPerTrigger",
    "failOnDataLoss",
    "includeHeaders",
    "timeoutMs",
    "pollTimeoutMs",
    "kafkaConsumer.pollTimeoutMs",
)
# checkpointLocation and queryName are what a streaming write's own settings look like to
# the sink: Spark passes them on as options.
WRITE_OPTIONS = (
    "namesrv",
    "topic",
    "producerGroup",
    "checkpointLocation",
    "queryName",
    "timeoutMs",
)


def check_known(options: Mapping[str, str], known: Iterable[str], what: str) -> None:
    known = sorted(known, key=str.lower)
    unknown = sorted(set(options) - {name.lower() for name in known})
    if unknown:
        raise ValueError(
            f"unknown option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(name) for name in unknown)} of the hamq {what}; "
            f"it takes {', '.join(known)}"
        )


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name.lower())
    if not value:
        raise ValueError(f"the hamq data source needs option {name!r}")
    return value


def _int(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    value = options.get(name.lower())
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        kind = "a positive" if minimum == 1 else "a non-negative"
        raise ValueError(f"option {name} must be {kind} integer, got {value!r}")
    return number


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    return _int(options, name, 1)


def _one_of(options: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The one of ``names`` given, None if none; two are an error."""
    given = [name for name in names if options.get(name.lower()) is not None]
    if len(given) > 1:
        raise ValueError(f"options {' and '.join(given)} exclude each other: give one")
    return given[0] if given else None


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name.lower())
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, got {value!r}")
    return value.lower() == "true"


def check_queue_key(key: object, where: str) -> str:
    """A queue is named ``<broker>:<queue id>``."""
    if not isinstance(key, str):
        raise ValueError(f"{where}: a queue is named '<broker>:<queue id>', got {key!r}")
    broker, sep, queue_id = key.rpartition(":")
    if not sep or not broker or not queue_id.isdigit():
        raise ValueError(f"bad queue name {key!r} in {where}: expected '<broker>:<queue id>'")
    return key


@dataclass(frozen=True)
class TopicSelection:
    """What a read covers: fixed topics (``topic``, ``subscribe``), the cluster's topics
    matching ``pattern`` at each trigger (``subscribePattern``), or named queues
    (``assign``: topic -> queue names)."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> TopicSelection:
        name = _one_of(options, TOPIC_OPTIONS)
        value = options[name.lower()] if name else ""
        if name is None or not value.strip():
            raise ValueError(
                f"the hamq data source needs one of the options {', '.join(TOPIC_OPTIONS)}"
            )
        if name in ("topic", "subscribe"):
            topics = [t.strip() for t in value.split(",")] if name == "subscribe" else [value]
            if not all(topics):
                raise ValueError(f"option subscribe: an empty topic name in {value!r}")
            return cls(topics=tuple(dict.fromkeys(topics)))
        if name == "subscribePattern":
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"option subscribePattern: bad regex {value!r} ({err})") from None
            return cls(pattern=value)
        return cls(assigned=_parse_assign(value))

    def covers(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics or topic in dict(self.assigned)

    def describe(self) -> str:
        if self.pattern is not None:
            return f"the topics matching {self.pattern!r}"
        return ", ".join(self.topics or dict(self.assigned))


def _parse_assign(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    example = '{"orders": ["broker-a:0", "broker-a:1"]}'
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"option assign: expected JSON like {example}, got {text!r} ({err})"
        ) from None
    if (
        not isinstance(parsed, dict)
        or not parsed
        or not all(isinstance(queues, list) and queues for queues in parsed.values())
    ):
        raise ValueError(
            f"option assign: expected an object of topics to non-empty lists of queues "
            f"like {example}, got {text!r}"
        )
    return tuple(
        (topic, tuple(dict.fromkeys(check_queue_key(key, "option assign") for key in queues)))
        for topic, queues in sorted(parsed.items())
    )


@dataclass(frozen=True)
class ReadOptions:
    namesrv: str
    topics: TopicSelection
    starting_offsets: str | None
    starting_timestamp_ms: int | None
    ending_offsets: str | None
    group: str | None
    max_records_per_partition: int | None
    min_partitions: int | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    # Kafka's headers are hamq's user properties: the ``properties`` column, kept unless
    # includeHeaders=false (hamq always had it, so it is on by default, unlike Kafka).
    include_headers: bool
    timeout_s: float
    # How long an executor waits for a planned range the broker says is not there yet (a
    # slave behind its master, a master restarting) before failing the task.
    poll_timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        check_known(options, READ_OPTIONS, "source")
        limit = _one_of(options, ("maxRecordsPerTrigger", "maxOffsetsPerTrigger"))
        poll = _one_of(options, ("pollTimeoutMs", "kafkaConsumer.pollTimeoutMs"))
        _one_of(options, ("startingOffsets", "startingTimestamp"))  # not both
        return cls(
            namesrv=_required(options, "namesrv"),
            topics=TopicSelection.parse(options),
            starting_offsets=options.get("startingoffsets"),
            starting_timestamp_ms=_int(options, "startingTimestamp", 0),
            ending_offsets=options.get("endingoffsets"),
            group=options.get("group"),
            max_records_per_partition=_positive_int(options, "maxRecordsPerPartition"),
            min_partitions=_positive_int(options, "minPartitions"),
            max_records_per_trigger=_positive_int(options, limit) if limit else None,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            include_headers=_bool(options, "includeHeaders", True),
            timeout_s=(_positive_int(options, "timeoutMs") or 10_000) / 1000,
            poll_timeout_s=(
                (_positive_int(options, poll) if poll else None) or DEFAULT_POLL_TIMEOUT_MS
            )
            / 1000,
        )

    @property
    def pull_group(self) -> str:
        return self.group or DEFAULT_GROUP


@dataclass(frozen=True)
class WriteOptions:
    namesrv: str
    topic: str | None
    group: str
    checkpoint_location: str | None
    timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        check_known(options, WRITE_OPTIONS, "sink")
        return cls(
            namesrv=_required(options, "namesrv"),
            topic=options.get("topic"),
            group=options.get("producergroup", DEFAULT_SINK_GROUP),
            checkpoint_location=options.get("checkpointlocation"),
            timeout_s=(_positive_int(options, "timeoutMs") or 10_000) / 1000,
        )
