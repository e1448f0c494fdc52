"""Memory and disk alarms (RabbitMQ's ``vm_memory_high_watermark`` and
``disk_free_limit``): while one is on, publishers are blocked (``broker/flow.py``).

The state machine (``AlarmState``) is given readings and returns the edges; the shell
(``ResourceMonitor``) takes a reading every ``ALARM_CHECK_INTERVAL_S`` — the process's RSS
from ``/proc/self/statm`` and the free space of the store's file system, two cheap system
calls, never per message; at the memory watermark the allocator first returns what is
free (``rss_after_trim``) — logs each edge once, and tells the flow control. The limits
can be changed while the broker runs (UPDATE_BROKER_CONFIG, RocketMQ's code, for these
keys only), as ``rabbitmqctl set_vm_memory_high_watermark`` does; the new limits are
checked at once.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from hamq.broker.flow import PublisherFlow
from hamq.config import BrokerConfig
from hamq.errors import InvalidArgument
from hamq.net.connection import Connection, response_pieces
from hamq.net.metrics import gauge
from hamq.net.tasks import PeriodicTask
from hamq.protocol.frame import Frame, require_int

log = logging.getLogger(__name__)

ALARM_CHECK_INTERVAL_S = 1.0
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024


class Resource(Enum):
    MEMORY = "memory"
    DISK = "disk"


@dataclass(frozen=True)
class AlarmLimits:
    memory_high_watermark_bytes: int  # RSS at which the memory alarm goes on; 0: never
    disk_free_limit_bytes: int  # free space under which the disk alarm goes on


@dataclass(frozen=True)
class Reading:
    rss_bytes: int
    disk_free_bytes: int


@dataclass(frozen=True)
class AlarmEdge:
    resource: Resource
    on: bool
    detail: str


class AlarmState:
    """Which alarms are on, from the readings it is given (no clock, no I/O)."""

    def __init__(self, limits: AlarmLimits) -> None:
        self.limits = limits
        self.active: dict[Resource, str] = {}  # resource -> what set it off

    def check(self, reading: Reading) -> list[AlarmEdge]:
        """The alarms that went on or off with this reading."""
        limits = self.limits
        memory = 0 < limits.memory_high_watermark_bytes <= reading.rss_bytes
        disk = reading.disk_free_bytes < limits.disk_free_limit_bytes
        edges = []
        for resource, on, detail in (
            (
                Resource.MEMORY,
                memory,
                f"resident memory {reading.rss_bytes / MIB:.1f} MiB, high watermark "
                f"{limits.memory_high_watermark_bytes / MIB:.1f} MiB",
            ),
            (
                Resource.DISK,
                disk,
                f"free disk space {reading.disk_free_bytes / MIB:.1f} MiB, limit "
                f"{limits.disk_free_limit_bytes / MIB:.1f} MiB",
            ),
        ):
            if on and resource not in self.active:
                self.active[resource] = detail
                edges.append(AlarmEdge(resource, True, detail))
            elif not on and resource in self.active:
                del self.active[resource]
                edges.append(AlarmEdge(resource, False, detail))
        return edges

    @property
    def blocked(self) -> tuple[str, str] | None:
        """(reason, detail) publishers are blocked for — memory first — or None."""
        for resource in Resource:
            if resource in self.active:
                return resource.value, self.active[resource]
        return None


def read_rss_bytes() -> int:
    """The process's resident set size (the second field of /proc/self/statm, in pages)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere, e.g. musl)."""
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


_MALLOC_TRIM = _find_malloc_trim()


def rss_after_trim(rss_bytes: int, watermark_bytes: int) -> int:
    """The RSS once the allocator returned its free memory, when ``rss_bytes`` is at the
    memory watermark: glibc keeps memory freed in small blocks (message bodies, frames)
    until asked, so an RSS measured without it would stay over the watermark after what
    set the alarm off was freed, and the alarm would block publishers for good. At most
    once per check, and only at the watermark (a first trim of a large heap takes a
    fraction of a second)."""
    if _MALLOC_TRIM is None or not 0 < watermark_bytes <= rss_bytes:
        return rss_bytes
    _MALLOC_TRIM(0)
    return read_rss_bytes()


def read_disk_free_bytes(path: str) -> int:
    """Space an unprivileged writer may still use on the file system holding ``path``."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


# What UPDATE_BROKER_CONFIG may change while the broker runs.
RUNTIME_KEYS = ("memory_high_watermark_bytes", "disk_free_limit_bytes")


class ResourceMonitor:
    """Checks the alarms periodically and blocks or lets go a member's publishers."""

    def __init__(self, config: BrokerConfig, flow: PublisherFlow) -> None:
        self.store_dir = config.store_dir
        self.flow = flow
        self.state = AlarmState(
            AlarmLimits(config.memory_high_watermark_bytes, config.disk_free_limit_bytes)
        )
        self._task = PeriodicTask("memory and disk alarms", ALARM_CHECK_INTERVAL_S, self.check)

    def start(self) -> None:
        self.check()
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    def check(self) -> None:
        rss = rss_after_trim(read_rss_bytes(), self.state.limits.memory_high_watermark_bytes)
        reading = Reading(rss, read_disk_free_bytes(self.store_dir))
        for edge in self.state.check(reading):
            if edge.on:
                log.warning(
                    "%s alarm set (%s): publishers are blocked", edge.resource.value, edge.detail
                )
            else:
                log.warning("%s alarm cleared (%s)", edge.resource.value, edge.detail)
        self.flow.block(self.state.blocked)

    def add_gauges(self, labels: dict[str, str] | None = None) -> None:
        for resource in Resource:
            gauge(
                "hamq_alarm",
                "1 while the resource's alarm blocks publishers",
                lambda r=resource: int(r in self.state.active),
                {**(labels or {}), "resource": resource.value},
            )

    def update_config(self, conn: Connection, frame: Frame) -> list:
        """UPDATE_BROKER_CONFIG: new alarm limits (ext: either key, a byte count), checked
        at once; answers the alarms now on."""
        # msgpack map keys may be integers: named as text in the refusal
        unknown = sorted(str(key) for key in frame.ext if key not in RUNTIME_KEYS)
        if unknown:
            raise InvalidArgument(
                f"cannot change {', '.join(unknown)} while the broker runs; "
                f"UPDATE_BROKER_CONFIG takes {', '.join(RUNTIME_KEYS)}"
            )
        changes = {key: require_int(frame.ext, key, 0) for key in RUNTIME_KEYS if key in frame.ext}
        self.state.limits = replace(self.state.limits, **changes)
        self.check()
        on = [r.value for r in Resource if r in self.state.active]
        return response_pieces(frame, ext={"alarms": on})
