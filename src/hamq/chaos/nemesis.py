"""Nemeses: the faults a chaos run injects, and the seeded schedule of when.

One seed decides everything random in a run (the TigerBeetle VOPR's idea): the schedule's
windows come from ``random.Random(seed)`` and each fault's choices (which process, which
shape of partition, how far the clock jumps) from the ``rng`` the runner hands to
``start``, so a run that lost data is replayed by its seed.

A run alternates a calm interval (1–2 s) and a fault window (2–5 s) until the duration is
spent: ``start`` injects one fault and says what it did, ``stop`` undoes it (heals the
network, restarts what was killed, resumes what was paused). Both append a line to the
run's faults.jsonl — ``{"t", "fault", "event": "start"|"stop", "target", "detail"}`` with
``t`` the runner's ``time.monotonic_ns()``, the clock every history uses — so the checker
and the timeline place each fault among the clients' operations.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, ClassVar

from hamq.chaos.cluster import ClusterFailed
from hamq.chaos.disk_faults import NoClosedSegment
from hamq.chaos.history import HistoryWriter
from hamq.errors import HamqError

if TYPE_CHECKING:
    from pathlib import Path

    from hamq.chaos.clock_faults import ClockFaults
    from hamq.chaos.cluster import Cluster
    from hamq.chaos.disk_faults import DiskFaults
    from hamq.chaos.hosts import Hosts

NEMESES = (
    "kill",
    "pause",
    "partition",
    "loss",
    "clock",
    "disk-full",
    "slow-disk",
    "corrupt",
    "power-loss",
    "mixed",
)
CALM_S = (1.0, 2.0)  # between two faults: the cluster gets a moment to recover
FAULT_S = (2.0, 5.0)  # long enough for a failover to begin, short enough to see several
FAULT_MIN_S = 1.0  # a window the duration cuts shorter than this is not injected
CLOCK_JUMP_S = (30.0, 600.0)  # past any lease or heartbeat timeout, either direction
SLOW_FSYNC_MS = (1000, 3000)  # a fsync that takes seconds (issue 18)
LOSS = (0.05, 0.3)  # fraction of frames dropped per proxy and direction
DELAY_MS = (0, 200)
DUPLICATE = (0.0, 0.1)
CORRUPTIONS = (1, 2)  # a corrupted byte per run: once or twice, not every window
MASTER_SHARE = 0.5  # of kills and pauses aimed at a group's master
MIXED = ("kill", "pause", "partition", "clock", "slow-disk", "power-loss")


@dataclass(frozen=True)
class Window:
    """One fault window, in seconds from the start of the run's fault phase."""

    start_s: float
    stop_s: float


@dataclass(frozen=True)
class Schedule:
    """When faults are injected: deterministic in the seed, every window inside the duration."""

    windows: tuple[Window, ...]

    @classmethod
    def of(cls, seed: int, duration_s: float) -> Schedule:
        rng = random.Random(seed)
        windows: list[Window] = []
        t = 0.0
        while True:
            t += rng.uniform(*CALM_S)
            stop = min(t + rng.uniform(*FAULT_S), duration_s)
            if stop - t < FAULT_MIN_S:
                return cls(tuple(windows))
            windows.append(Window(round(t, 3), round(stop, 3)))
            t = stop


@dataclass
class Stage:
    """What a nemesis acts on: the run's cluster, its hosts and fault layers, and the log."""

    cluster: Cluster
    hosts: Hosts
    disks: DiskFaults
    clock: ClockFaults | None
    faults: HistoryWriter

    def record(self, fault: str, event: str, target: str, detail: str) -> None:
        self.faults.record(fault=fault, event=event, target=target, detail=detail)

    def processes(self) -> list[str]:
        return sorted(self.cluster.layout.processes)

    def member_processes(self) -> list[str]:
        """Brokers and nodes (what holds messages), from the layout: asking the cluster
        could fail in the middle of a fault."""
        layout = self.cluster.layout
        return sorted(p for p, spec in layout.processes.items() if spec.server != "namesrv")

    def server_hosts(self) -> list[str]:
        return sorted(self.cluster.layout.hosts)

    def member_hosts(self) -> list[str]:
        return sorted({self.cluster.host_of(p) for p in self.member_processes()})

    def victim(self, rng: random.Random) -> str:
        """A process to kill or hang: half the time the routed master of a group (the
        fault that tests failover), else any process — member, name server or controller.
        A cluster too broken to say who its master is gets any process."""
        processes = self.processes()
        if rng.random() < MASTER_SHARE:
            try:
                masters = self.cluster.masters()
            except (ClusterFailed, HamqError, TimeoutError):
                masters = {}
            if masters:
                return masters[rng.choice(sorted(masters))]
        return rng.choice(processes)

    def restart(self, processes: list[str]) -> str:
        """Starts each process again; one that does not come up (its disk still full, its
        log cut by a power loss) is said, not raised: the runner's healing tries again and
        the verdict shows what it cost."""
        done = []
        for process in processes:
            try:
                self.cluster.start_process(process)
                done.append(f"{process} restarted")
            except ClusterFailed as err:
                done.append(f"{process} did not start: {str(err).splitlines()[0]}")
        return "; ".join(done)

    def restart_dead(self) -> str:
        """Every process of the layout that is not running, started again."""
        return self.restart([p for p in self.processes() if not self.cluster.is_running(p)])


class Nemesis:
    """One kind of fault. ``inject`` does it and returns (target, detail), or None when
    there is nothing to do this window; ``heal`` undoes exactly what ``inject`` did."""

    name: ClassVar[str]
    needs_netns: ClassVar[bool] = False  # partitions cut links inside network namespaces
    needs_proxy: ClassVar[bool] = False  # frame loss goes through FrameProxy
    needs_clock: ClassVar[bool] = False  # servers start under libfaketime
    needs_tmpfs: ClassVar[bool] = False  # a full disk is a small tmpfs filled up

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self._active: tuple[str, str] | None = None  # (fault, target) of the open window

    def start(self, rng: random.Random) -> str | None:
        """Injects one fault; returns what it did, or None when nothing was injected."""
        done = self.inject(rng)
        if done is None:
            return None
        target, detail = done
        self._active = (self.name, target)
        self.stage.record(self.name, "start", target, detail)
        return f"{self.name} {target}: {detail}" if detail else f"{self.name} {target}"

    def stop(self) -> None:
        if self._active is None:
            return
        fault, target = self._active
        self._active = None
        detail = self.heal()
        self.stage.record(fault, "stop", target, detail)

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        raise AssertionError(f"{type(self).__name__} must define inject")

    def heal(self) -> str:
        raise AssertionError(f"{type(self).__name__} must define heal")


class Kill(Nemesis):
    """``kill -9`` of one process (``Stage.victim``: often a master); restarted at stop."""

    name = "kill"

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        self.victim = self.stage.victim(rng)
        self.stage.cluster.kill9(self.victim)
        return self.victim, "SIGKILL"

    def heal(self) -> str:
        return self.stage.restart([self.victim])


class Pause(Nemesis):
    """SIGSTOP of one process (``Stage.victim``) — a hung master keeps its sockets open and
    answers nothing."""

    name = "pause"

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        self.victim = self.stage.victim(rng)
        self.stage.cluster.pause(self.victim)
        return self.victim, "SIGSTOP"

    def heal(self) -> str:
        self.stage.cluster.resume(self.victim)
        return "SIGCONT"


Pairs = list[tuple[str, str]]


def _across(sides: Sequence[Sequence[str]]) -> Pairs:
    """Every pair of hosts on different sides."""
    return [
        (a, b)
        for i, side in enumerate(sides)
        for other in sides[i + 1 :]
        for a in side
        for b in other
    ]


def partition_shapes(
    hosts: list[str], members: list[str]
) -> dict[str, Callable[[random.Random], Pairs]]:
    """The shapes of partition this cluster can take, each as the host pairs it cuts (empty
    shapes — a data-only cut with one member host — are left out)."""

    def majority(rng: random.Random) -> Pairs:
        order = rng.sample(hosts, len(hosts))
        return _across([order[: len(order) // 2], order[len(order) // 2 :]])

    def isolate_one(rng: random.Random) -> Pairs:
        lone = rng.choice(hosts)
        return _across([[lone], [h for h in hosts if h != lone]])

    def bridge(rng: random.Random) -> Pairs:
        # two halves that cannot see each other and one host that sees both (Jepsen's bridge)
        order = rng.sample(hosts, len(hosts))
        rest = order[1:]
        return _across([rest[: len(rest) // 2], rest[len(rest) // 2 :]])

    def ring(rng: random.Random) -> Pairs:
        # each host sees only its two neighbours in a random ring
        order = rng.sample(hosts, len(hosts))
        near = {frozenset((order[i], order[(i + 1) % len(order)])) for i in range(len(order))}
        return [(a, b) for a, b in combinations(order, 2) if frozenset((a, b)) not in near]

    def control_cut(rng: random.Random) -> Pairs:
        # controllers and name servers from members; members still see each other
        return _across([[h for h in hosts if h not in members], members])

    def data_cut(rng: random.Random) -> Pairs:
        # members among themselves; every member still sees the controllers
        return list(combinations(members, 2))

    shapes: dict[str, Callable[[random.Random], Pairs]] = {
        "majority-minority": majority,
        "isolate-one": isolate_one,
    }
    if len(hosts) >= 3:
        shapes["bridge"] = bridge
    if len(hosts) >= 4:
        shapes["ring"] = ring
    if 0 < len(members) < len(hosts):
        shapes["controller-only"] = control_cut
    if len(members) >= 2:
        shapes["data-only"] = data_cut
    return shapes


LINK_DOWN = "link-down"


class Partition(Nemesis):
    """A network partition of a random shape, cut between hosts (the runner's clients still
    reach every host), or one host's link taken down (``LINK_DOWN``: its clients lose it
    too, as when a machine's cable is pulled)."""

    name = "partition"
    needs_netns = True

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        hosts = self.stage.server_hosts()
        if len(hosts) < 2:
            return None  # one host: nothing to partition
        shapes = partition_shapes(hosts, self.stage.member_hosts())
        shape = rng.choice([*sorted(shapes), LINK_DOWN])
        if shape == LINK_DOWN:
            lone = rng.choice(hosts)
            self.stage.hosts.isolate(lone)
            return shape, lone
        pairs = shapes[shape](rng)
        self.stage.hosts.cut(pairs)
        return shape, " ".join(f"{a}/{b}" for a, b in sorted(pairs))

    def heal(self) -> str:
        self.stage.hosts.heal()
        return "healed"


class Loss(Nemesis):
    """Frames dropped, delayed and duplicated by the proxies in front of every server."""

    name = "loss"
    needs_proxy = True

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        proxies = self.stage.cluster.proxies
        names = sorted(rng.sample(sorted(proxies), rng.randint(1, len(proxies))))
        loss, delay_ms, duplicate = (
            rng.uniform(*LOSS),
            rng.randint(*DELAY_MS),
            rng.uniform(*DUPLICATE),
        )
        for name in names:
            proxies[name].set_faults(
                loss=loss, delay_ms=delay_ms, duplicate=duplicate, seed=rng.getrandbits(32)
            )
        self.faulty = names
        return ",".join(names), f"loss={loss:.2f} delay_ms={delay_ms} duplicate={duplicate:.2f}"

    def heal(self) -> str:
        for name in self.faulty:
            self.stage.cluster.proxies[name].clear()
        return "cleared"


class Clock(Nemesis):
    """A server's wall clock jumps 30–600 s forward or back (libfaketime); reset at stop."""

    name = "clock"
    needs_clock = True

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        assert self.stage.clock is not None, "the runner starts clock runs under libfaketime"
        self.host = rng.choice(self.stage.server_hosts())
        jump_s = rng.choice((-1, 1)) * round(rng.uniform(*CLOCK_JUMP_S))
        self.stage.clock.jump(self.host, jump_s)
        return self.host, f"{jump_s:+d}s"

    def heal(self) -> str:
        assert self.stage.clock is not None
        self.stage.clock.reset(self.host)
        return "reset"


class DiskFull(Nemesis):
    """A member host's data disk (a small tmpfs) filled to the last byte; freed at stop."""

    name = "disk-full"
    needs_tmpfs = True

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        self.host = rng.choice(self.stage.member_hosts())
        self.stage.disks.fill(self.host)
        return self.host, "filled"

    def heal(self) -> str:
        self.stage.disks.free(self.host)
        return "freed"


class SlowDisk(Nemesis):
    """Every fsync of a member host takes 1–3 s (the LD_PRELOAD shim); fast again at stop."""

    name = "slow-disk"

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        self.host = rng.choice(self.stage.member_hosts())
        fsync_ms = rng.randint(*SLOW_FSYNC_MS)
        self.stage.disks.slow_disk(self.host, fsync_ms)
        return self.host, f"fsync {fsync_ms} ms"

    def heal(self) -> str:
        self.stage.disks.fast_disk(self.host)
        return "fast"


class Corrupt(Nemesis):
    """One byte flipped in a closed commit-log segment of one member, once or twice a run
    (a window before any segment is closed corrupts nothing and is not recorded)."""

    name = "corrupt"

    def __init__(self, stage: Stage) -> None:
        super().__init__(stage)
        self.left: int | None = None

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        if self.left is None:
            self.left = rng.randint(*CORRUPTIONS)
        if self.left == 0:
            return None
        logs = self.stage.cluster.member_logs()  # group -> member -> its commit-log dir
        group = rng.choice(sorted(logs))
        member = rng.choice(sorted(logs[group]))
        try:
            # the member's store holding that log (a node's holds one per placed group)
            where = self.stage.disks.corrupt(logs[group][member].parent, rng)
        except NoClosedSegment:
            return None  # no closed segment yet
        self.left -= 1
        return member, where

    def heal(self) -> str:
        return "left corrupted"  # a corrupted byte stays: what matters is who serves it


class PowerLoss(Nemesis):
    """Every process of one host killed, and everything its disk had not fsynced dropped;
    the host's processes start again at stop, from what survived."""

    name = "power-loss"

    def inject(self, rng: random.Random) -> tuple[str, str] | None:
        cluster = self.stage.cluster
        self.host = rng.choice(self.stage.server_hosts())
        self.victims = cluster.processes_on(self.host)
        for process in self.victims:
            cluster.kill9(process)
        dropped = self.stage.disks.power_loss(cluster.host_dir(self.host))
        return self.host, " ".join(f"{k}={v}" for k, v in sorted(dropped.items()))

    def heal(self) -> str:
        return self.stage.restart(self.victims)


class Mixed(Nemesis):
    """Each window a random one of the kinds in MIXED (those the hosts can do); the
    faults.jsonl lines name the kind drawn."""

    name = "mixed"
    needs_clock = True

    def __init__(self, stage: Stage) -> None:
        super().__init__(stage)
        self.kinds = {k: NEMESIS_TYPES[k](stage) for k in mixed_kinds(stage.hosts.kind)}
        self.current: Nemesis | None = None

    def start(self, rng: random.Random) -> str | None:
        self.current = self.kinds[draw_mixed(rng, self.stage.hosts.kind)]
        return self.current.start(rng)

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


def mixed_kinds(host_kind: str) -> list[str]:
    """The kinds ``mixed`` draws from on hosts of this kind."""
    return [k for k in MIXED if supported(k, host_kind) is None]


def draw_mixed(rng: random.Random, host_kind: str) -> str:
    """The kind of one ``mixed`` window."""
    return rng.choice(mixed_kinds(host_kind))


NEMESIS_TYPES: dict[str, type[Nemesis]] = {
    cls.name: cls
    for cls in (Kill, Pause, Partition, Loss, Clock, DiskFull, SlowDisk, Corrupt, PowerLoss, Mixed)
}


@dataclass(frozen=True)
class Needs:
    """What a nemesis needs from the run's setup (the runner builds the layout to match)."""

    netns: bool = False
    proxy: bool = False
    clock: bool = False
    tmpfs: bool = False


def needs(name: str) -> Needs:
    cls = nemesis_type(name)
    return Needs(
        netns=cls.needs_netns, proxy=cls.needs_proxy, clock=cls.needs_clock, tmpfs=cls.needs_tmpfs
    )


def nemesis_type(name: str) -> type[Nemesis]:
    try:
        return NEMESIS_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown nemesis {name!r}: one of {', '.join(NEMESES)}") from None


def supported(name: str, host_kind: str) -> str | None:
    """None when hosts of this kind can inject the fault, else why not."""
    if nemesis_type(name).needs_netns and host_kind != "netns":
        return f"{name} needs network namespaces; the hosts here are {host_kind}"
    return None


def make_nemesis(name: str, stage: Stage) -> Nemesis:
    return nemesis_type(name)(stage)


def fault_log(run_dir: Path) -> HistoryWriter:
    return HistoryWriter(run_dir / "faults.jsonl")
