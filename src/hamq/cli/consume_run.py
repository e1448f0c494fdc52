"""What every ``hamq bench consume`` run is told (pull, push or pop): one value instead of
the same five arguments to each, and the parameters each reports beside its numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hamq.cli.bench_timeline import Timeline


@dataclass(frozen=True)
class ConsumeRun:
    namesrv: str
    topic: str
    count: int  # messages to consume at most
    group: str
    max_seconds: float  # stop after this long, whatever the count
    timeline: Timeline | None = None  # the progress bar and --plot's samples

    def params(self, **extra: Any) -> dict[str, Any]:
        """The run's parameters as the bench's JSON reports them, with ``extra``."""
        return {
            "count": self.count,
            "topic": self.topic,
            "group": self.group,
            "namesrv": self.namesrv,
            **extra,
        }
