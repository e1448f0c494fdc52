"""The data source's options, checked once on the driver so a typo fails the query with a
readable message instead of a hang on an executor. Spark hands them over with lower-cased
keys and string values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_GROUP = "hamq-spark"
DEFAULT_SINK_GROUP = "hamq-spark-sink"
# Long enough for a master to restart and serve the planned range again.
DEFAULT_POLL_TIMEOUT_MS = 120_000


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name.lower())
    if not value:
        raise ValueError(f"the hamq data source needs option {name!r}")
    return value


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    value = options.get(name.lower())
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ValueError(f"option {name} must be a positive integer, got {value!r}")
    return number


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name.lower())
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, got {value!r}")
    return value.lower() == "true"


@dataclass(frozen=True)
class ReadOptions:
    namesrv: str
    topic: str
    starting_offsets: str | None
    ending_offsets: str | None
    group: str | None
    max_records_per_partition: int | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    timeout_s: float
    # How long an executor waits for a planned range the broker says is not there yet (a
    # slave behind its master, a master restarting) before failing the task.
    poll_timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        return cls(
            namesrv=_required(options, "namesrv"),
            topic=_required(options, "topic"),
            starting_offsets=options.get("startingoffsets"),
            ending_offsets=options.get("endingoffsets"),
            group=options.get("group"),
            max_records_per_partition=_positive_int(options, "maxRecordsPerPartition"),
            max_records_per_trigger=_positive_int(options, "maxRecordsPerTrigger"),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            timeout_s=(_positive_int(options, "timeoutMs") or 10_000) / 1000,
            poll_timeout_s=(
                _positive_int(options, "pollTimeoutMs")
                or _positive_int(options, "kafkaConsumer.pollTimeoutMs")
                or DEFAULT_POLL_TIMEOUT_MS
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
        if "_failpoint" in options:  # once a test hook: refused, not silently ignored
            raise ValueError("unknown option '_failpoint' of the hamq data source")
        return cls(
            namesrv=_required(options, "namesrv"),
            topic=options.get("topic"),
            group=options.get("producergroup", DEFAULT_SINK_GROUP),
            checkpoint_location=options.get("checkpointlocation"),
            timeout_s=(_positive_int(options, "timeoutMs") or 10_000) / 1000,
        )
