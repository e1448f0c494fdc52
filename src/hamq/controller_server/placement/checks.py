"""The driver's last word before a step that could lose data: the group as the
controller sees it at that moment, not as the plan saw it a round ago, decides whether a
member may leave or the master may move."""

from __future__ import annotations

from hamq.controller.state import BrokerGroup
from hamq.errors import HamqError


class StepRefused(HamqError):
    """A step the driver will not take now: the group as the controller sees it makes the
    step unsafe or impossible (tried again next round, against fresh observations)."""


def removal_refusal(group: BrokerGroup, broker_id: int, alive: frozenset[int]) -> str | None:
    """Why ``broker_id`` must not leave ``group`` now, or None: never the master, and a
    synchronised member only while another synchronised one is alive (an unsynchronised
    one may always go: it takes no synchronised copy with it)."""
    if broker_id == group.master_id:
        return f"member {broker_id} is the master"
    if broker_id in group.sync_state_set and not (group.sync_state_set & alive) - {broker_id}:
        return f"member {broker_id} is synchronised and no other synchronised member is alive"
    return None


def election_refusal(group: BrokerGroup, broker_id: int, alive: frozenset[int]) -> str | None:
    """Why the master must not move to ``broker_id`` now, or None: only to an alive
    synchronised member (the controller would refuse anything else too, less clearly)."""
    if broker_id not in group.members:
        return f"member {broker_id} is not in the group"
    if broker_id not in group.sync_state_set:
        return f"member {broker_id} is not synchronised"
    if broker_id not in alive:
        return f"member {broker_id} is not alive"
    return None
