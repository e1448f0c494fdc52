"""Which member becomes master (RocketMQ's ``DefaultElectPolicy``).

Pure: liveness (from heartbeats) and each broker's reported (epoch, max offset) come in as
arguments, because they are the controller leader's soft state, never replicated.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

from hamq.controller.state import BrokerGroup
from hamq.policy.definition import HaDefinition

# Sorts a member that never reported its log after every member that did.
_NO_LIVE_INFO = (-1, -1)


@dataclass(frozen=True)
class BrokerLiveInfo:
    """What a member last reported in its heartbeat: its epoch, its log's max offset and
    when the report arrived; ``registered_ms`` is when this controller leader last handled
    a registration from it. Both are on the leader's own clock (None where unknown), so
    only they may be compared with each other."""

    epoch: int
    max_offset: int
    last_seen_ms: int | None = None
    registered_ms: int | None = None


@dataclass(frozen=True)
class ElectResult:
    """The chosen member, and whether it came from outside the SyncStateSet."""

    broker_id: int
    unclean: bool


def unclean_allowed(
    rules: HaDefinition | None,
    group: BrokerGroup,
    shutdown_epoch: int | None,
    enable_elect_unclean_master: bool,
) -> bool:
    """Whether an election of ``group`` may take a member outside its SyncStateSet.

    A group placed by a policy follows the policy's promotion rules (RabbitMQ's): after a
    clean shutdown of its master (the master's CONTROLLER_BROKER_SHUTDOWN for the epoch
    that ended) ``ha-promote-on-shutdown``, after a failure ``ha-promote-on-failure``; each
    "always" allows an unsynchronised member, "when-synced" leaves the group without a
    master instead. Other groups keep the global ``enable_elect_unclean_master``. The epoch
    that ended is the current one while the group names a master, else the one before (a
    master timeout with no candidate ends the epoch and names nobody).
    """
    if rules is None:
        return enable_elect_unclean_master
    ended = group.master_epoch if group.master_id is not None else group.master_epoch - 1
    clean = shutdown_epoch is not None and shutdown_epoch == ended
    rule = rules.ha_promote_on_shutdown if clean else rules.ha_promote_on_failure
    return rule == "always"


def report_rank(info: BrokerLiveInfo | None) -> tuple[int, int]:
    """What an election ranks a member by, largest first: its reported (epoch, max offset)."""
    return _NO_LIVE_INFO if info is None else (info.epoch, info.max_offset)


def elect(
    group: BrokerGroup,
    alive: Set[int],
    live_info: Mapping[int, BrokerLiveInfo],
    preferred_id: int | None,
    enable_elect_unclean_master: bool,
) -> ElectResult | None:
    """Pick a master: alive SyncStateSet members first, then (if unclean is enabled) any
    alive member; None if nobody qualifies.

    An alive old master in the candidates is kept unless another id is preferred: moving
    mastership away from a healthy master only costs a failover.
    """
    clean = _try_elect(group, group.sync_state_set & alive, live_info, preferred_id)
    if clean is not None:
        return ElectResult(clean, unclean=False)
    if not enable_elect_unclean_master:
        return None
    unclean = _try_elect(group, group.members.keys() & alive, live_info, preferred_id)
    return None if unclean is None else ElectResult(unclean, unclean=True)


def _try_elect(
    group: BrokerGroup,
    candidates: Set[int],
    live_info: Mapping[int, BrokerLiveInfo],
    preferred_id: int | None,
) -> int | None:
    candidates = candidates & group.members.keys()
    if not candidates:
        return None
    if group.master_id in candidates and preferred_id in (None, group.master_id):
        return group.master_id
    if preferred_id is not None:
        return preferred_id if preferred_id in candidates else None

    def rank(broker_id: int) -> tuple[int, int, int]:
        epoch, offset = report_rank(live_info.get(broker_id))
        # Largest (epoch, max offset) wins; the smallest id breaks ties so every run agrees.
        return (-epoch, -offset, broker_id)

    return min(candidates, key=rank)
