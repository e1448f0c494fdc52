"""One chaos run: a cluster of one mode on test hosts, a workload recording histories, a
nemesis injecting faults on a seeded schedule, then healing, a final read and a verdict.

The phases, in order (each bounded in time):

1. hosts (network namespaces, else loopback — printed and kept in verdict.json), the disk
   and clock fault layers, the mode's promising layout built for what the nemesis needs
   (proxies for frame loss, libfaketime for clock jumps, tmpfs data dirs for a full disk);
2. the cluster started and healthy, the chaos topics created, the workload started;
3. the schedule: calm, fault, heal, … until the duration is spent;
4. everything healed (links, proxies, clocks, disks; paused processes resumed, dead ones
   started) and the cluster given ``RECOVER_TIMEOUT_S`` to be healthy again — one that is
   not is a verdict (``recovered: false``), not a crash of the runner;
5. a settle period, producers stopped, consumers drained, every queue read back
   (final.jsonl), the committed offsets and member logs noted (members.json), the cluster
   stopped, the histories checked, the timeline drawn, verdict.json written.

Whatever happens, every process is stopped by its PID and every namespace and mount the
run made is removed (``finally``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hamq.chaos.checker import Verdict, check
from hamq.chaos.cluster import Cluster, ClusterFailed
from hamq.chaos.disk_faults import DiskFaults
from hamq.chaos.hosts import Hosts, Unsupported, make_hosts
from hamq.chaos.layout import MODES, layout_for
from hamq.chaos.nemesis import Needs, Schedule, Stage, fault_log, make_nemesis, needs, supported
from hamq.chaos.report import timeline_png
from hamq.chaos.workload import TOPICS, Workload, final_read
from hamq.errors import HamqError

START_TIMEOUT_S = 120.0  # every group has a writable master after a cold start (loaded CI)
RECOVER_TIMEOUT_S = 90.0  # after healing: a cluster that needs longer is reported unavailable
SETTLE_S = 2.0  # producers keep sending on the healed cluster before they stop
DRAIN_TIMEOUT_S = 60.0  # consumers catch up with every acknowledged id
FINAL_READ_TIMEOUT_S = 60.0
MAX_DURATION_S = 24 * 3600  # a longer run is a typo, not a plan
# A host's data disk for disk-full: the broker's disk_min_free_bytes (64 MiB) plus room for a
# run's data, and small enough to fill in an instant.
TMPFS_MIB = 192
# What each mode does not promise, and why: a loss under these is reported, not a broken
# promise. Every other (mode, nemesis) pair promises 0 lost, 0 phantom, 0 divergent.
UNPROMISED: dict[str, dict[str, str]] = {
    "single": {
        "corrupt": "one copy: a corrupted byte in it has no other copy to come from",
    },
}
# Faults a mode's layout cannot put on its data path: run anyway, they would report a pass
# for a fault no send or replication ever met (found by reviewer R1: mirrored x loss).
NOT_INJECTABLE: dict[str, dict[str, str]] = {
    "mirrored": {
        "loss": "the members a node hosts listen on ports picked when they are placed, not "
        "behind FrameProxies: frame loss would reach the name servers and node admin ports only",
    },
}
CLIENT_LOG = "clients.log"  # the workload's client warnings (routes refreshed, retries)
Progress = Callable[[str], None]


class BadRun(ValueError):
    """A run asked for with a mode, nemesis, duration or directory it cannot have."""


@dataclass(frozen=True)
class RunSpec:
    mode: str
    nemesis: str
    duration_s: float
    seed: int

    def validate(self) -> None:
        if self.mode not in MODES:
            raise BadRun(f"unknown mode {self.mode!r}: one of {', '.join(MODES)}")
        try:
            needs(self.nemesis)
        except ValueError as err:
            raise BadRun(str(err)) from None
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise BadRun(f"duration must be above 0 and at most a day, not {self.duration_s} s")


def promise_note(mode: str, nemesis: str) -> dict[str, Any]:
    """What ``mode`` promises, and whether the promise covers ``nemesis`` (and why not)."""
    why = UNPROMISED.get(mode, {}).get(nemesis, "")
    return {"promise": layout_for(mode).promise, "promise_covers": not why, "unpromised_why": why}


def why_unsupported(mode: str, nemesis: str, host_kind: str) -> str | None:
    """None when a run of ``mode`` on hosts of ``host_kind`` can inject ``nemesis`` where
    it matters, else why not."""
    return supported(nemesis, host_kind) or NOT_INJECTABLE.get(mode, {}).get(nemesis)


def default_run_dir(mode: str, nemesis: str, seed: int) -> Path:
    return Path(".hamq-chaos") / f"{mode}-{nemesis}-{seed}"


def run(
    mode: str,
    nemesis: str,
    duration_s: float,
    seed: int,
    run_dir: Path,
    progress: Progress | None = None,
    hosts_kind: str = "netns",
) -> Verdict:
    """One run; raises ``Unsupported`` (before starting anything) when these hosts cannot
    inject the fault, ``BadRun`` on a bad mode, nemesis, duration or directory.
    ``hosts_kind``: "netns" (falls back to loopback where namespaces cannot be made) or
    "loopback"."""
    spec = RunSpec(mode, nemesis, duration_s, seed)
    spec.validate()
    say = progress or _quiet
    need = needs(nemesis)
    run_dir = _fresh(Path(run_dir))
    hosts = make_hosts(f"c{seed % 1000}{_pid_tag()}", prefer=hosts_kind)
    try:
        why = why_unsupported(mode, nemesis, hosts.kind)
        if why is not None:
            raise Unsupported(why)
        say(f"hosts: {hosts.kind}")
        disks = DiskFaults(run_dir)
        try:
            with _client_log(run_dir / CLIENT_LOG):
                recovered = _run_on(spec, need, hosts, disks, run_dir, say)
            # checked before the tmpfs data dirs (disk-full runs) are unmounted: the
            # members' commit logs are compared there
            verdict = check(run_dir, promise_zero_loss=not UNPROMISED.get(mode, {}).get(nemesis))
        finally:
            disks.close()
    finally:
        hosts.close()
    timeline_png(run_dir)
    (run_dir / "verdict.json").write_text(
        json.dumps(verdict_json(spec, verdict, hosts.kind, recovered, run_dir), indent=2) + "\n"
    )
    return verdict


def verdict_json(
    spec: RunSpec, verdict: Verdict, host_kind: str, recovered: bool, run_dir: Path
) -> dict[str, Any]:
    """The checker's verdict (the issue's keys first), then what run it is."""
    starts = sum(1 for line in _lines(run_dir / "faults.jsonl") if line.get("event") == "start")
    return {
        **verdict.to_json(),
        "recovered": recovered,
        "mode": spec.mode,
        "nemesis": spec.nemesis,
        "seed": spec.seed,
        "duration_s": spec.duration_s,
        "hosts": host_kind,
        "faults": starts,
        # no members.json (the members could not be asked): divergent 0 means not looked at
        "divergence_checked": (run_dir / "members.json").exists(),
        **promise_note(spec.mode, spec.nemesis),
    }


def _run_on(
    spec: RunSpec, need: Needs, hosts: Hosts, disks: DiskFaults, run_dir: Path, say: Progress
) -> bool:
    clock = disks.clock if need.clock else None
    layout = layout_for(spec.mode, proxied=need.proxy)
    cluster = Cluster(layout, hosts, disks, run_dir, clock, TMPFS_MIB if need.tmpfs else None)
    workload: Workload | None = None
    try:
        say(f"starting {spec.mode}: {', '.join(sorted(layout.processes))}")
        cluster.start()
        cluster.wait_healthy(START_TIMEOUT_S)
        cluster.create_topics(TOPICS)
        cluster.wait_healthy(START_TIMEOUT_S)  # mirrored: the topics' groups exist only now
        workload = Workload(
            cluster.namesrv, run_dir / "history", spec.seed, confirms=spec.mode == "mirrored"
        )
        workload.start()
        stage = Stage(cluster, hosts, disks, clock, fault_log(run_dir))
        try:
            _inject(spec, stage, say)
            recovered = _heal(stage, say)
        finally:
            stage.faults.close()
        time.sleep(SETTLE_S)
        workload.stop_producers()
        missing = {kind: n for kind, n in workload.drain(DRAIN_TIMEOUT_S).items() if n}
        if missing:
            say(f"consumers missing acknowledged ids after {DRAIN_TIMEOUT_S:.0f} s: {missing}")
        for kind, why in workload.unsupported().items():
            say(f"{kind} consumer refused by the cluster: {why}")
        say(f"acknowledged {workload.acked()}; reading every queue back")
        final_read(
            cluster.namesrv, TOPICS, run_dir / "history" / "final.jsonl", FINAL_READ_TIMEOUT_S
        )
        try:
            _write_members(cluster, run_dir)
        except (ClusterFailed, HamqError, TimeoutError) as err:
            # no members.json: the checker then compares no member logs, and says nothing
            # is divergent only because it could not look — the run says why here
            say(f"members not asked (no divergence check): {type(err).__name__}: {err}")
        return recovered
    finally:
        if workload is not None:
            workload.stop()
        cluster.stop()


def _inject(spec: RunSpec, stage: Stage, say: Progress) -> None:
    """The schedule's windows, each after its calm interval counted from the moment the
    previous fault was healed (a restart can take seconds: the calm stays calm); a window
    that would end past the duration is not begun."""
    nemesis = make_nemesis(spec.nemesis, stage)
    rng = random.Random(f"{spec.seed}/{spec.nemesis}")
    began = time.monotonic()
    end = began + spec.duration_s
    healed_at, healed_s = began, 0.0  # when the last fault was healed: now, and on schedule
    try:
        for window in Schedule.of(spec.seed, spec.duration_s).windows:
            start = healed_at + window.start_s - healed_s
            if start + window.stop_s - window.start_s > end:
                break
            _sleep_until(start)
            done = nemesis.start(rng)
            if done is not None:
                say(done)
            _sleep_until(start + window.stop_s - window.start_s)
            nemesis.stop()
            healed_at, healed_s = time.monotonic(), window.stop_s
        _sleep_until(end)
    finally:
        nemesis.stop()


def _heal(stage: Stage, say: Progress) -> bool:
    """Everything any nemesis may have left undone, undone; True when the cluster is
    healthy again within RECOVER_TIMEOUT_S."""
    cluster = stage.cluster
    if stage.hosts.kind == "netns":
        stage.hosts.heal()
    for proxy in getattr(cluster, "proxies", {}).values():
        proxy.clear()
    for host in stage.server_hosts():
        if stage.clock is not None:
            stage.clock.reset(host)
        stage.disks.fast_disk(host)
    for process in stage.processes():
        cluster.resume(process)
    restarted = stage.restart_dead()
    if restarted:
        say(restarted)
    try:
        cluster.wait_healthy(RECOVER_TIMEOUT_S)
    except ClusterFailed as err:
        say(f"not healthy {RECOVER_TIMEOUT_S:.0f} s after healing: {err}")
        return False
    return True


def _write_members(cluster: Cluster, run_dir: Path) -> None:
    committed = cluster.committed_offsets()
    logs = cluster.member_logs()
    groups = {
        group: {
            "committed": committed.get(group, 0),
            # relative: a kept run directory, moved or copied, is checked against its own logs
            "logs": {m: str(p.relative_to(run_dir)) for m, p in members.items()},
        }
        for group, members in logs.items()
    }
    (run_dir / "members.json").write_text(json.dumps({"groups": groups}, indent=2) + "\n")


def _fresh(run_dir: Path) -> Path:
    """The run's directory, emptied of an earlier run's files; a directory holding anything
    else is refused rather than emptied."""
    if run_dir.exists() and any(run_dir.iterdir()):
        if not any((run_dir / name).exists() for name in ("hosts", "history", "faults.jsonl")):
            raise BadRun(f"{run_dir} is not empty and holds no chaos run: choose another --dir")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir.resolve()


@contextmanager
def _client_log(path: Path) -> Iterator[None]:
    """The in-process clients' log lines go to the run's file while it runs: a fault makes
    them warn many times a second, which would bury the runner's own progress."""
    logger = logging.getLogger("hamq")
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.propagate = propagate
        logger.removeHandler(handler)
        handler.close()


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _sleep_until(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))


def _pid_tag() -> str:
    return format(os.getpid() % 4096, "x")


def _quiet(message: str) -> None:
    """Progress nobody reads."""
