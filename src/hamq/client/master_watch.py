"""Which broker groups changed master, as a consumer's routes show it: RabbitMQ's
``x-cancel-on-ha-failover`` (seed 003) for consumers created with
``cancel_on_ha_failover=True``.

A change is a route naming another brokerId-0 address for a broker group than the newest
route seen before it did, whichever topic it is for (a group has one master for all its
topics, so one failover is one change). Routes are ordered by when they were fetched: a
cached route of another topic, fetched before the failover and looked at after it, is
older than what the watch holds and does not look like a failover back. A group with no
master in a route (between the old master's loss and the election) is no change yet: the
master may be back at its address, and only a new address says another member took over.
Nor is a group routed read-only (none of its queues writable): that is how the name
server routes seed 004's acting master, a slave standing in while the master is away,
which keeps the invisible times of what is popped (nothing is requeued) and gives way
when the master comes back at its address. (A topic retired from the group, read-only
while it drains, is watched through the group's other topics.) A member restarted and
elected again at the same address is not seen (its unacked pop messages are still
redelivered at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hamq.client.core import MASTER_ID, TopicRoute


@dataclass
class MasterWatch:
    # broker name -> (its brokerId-0 address, when the route naming it was fetched)
    masters: dict[str, tuple[str, float]] = field(default_factory=dict)

    def observe(self, route: TopicRoute) -> list[str]:
        """The broker groups whose master ``route`` shows at another address than the
        newest route seen before it (sorted); newer addresses are remembered either way."""
        changed = []
        writable = {mq.broker_name for mq in route.write_queues}
        read_only = {mq.broker_name for mq in route.read_queues} - writable
        for broker_name, members in sorted(route.brokers.items()):
            addr = members.get(MASTER_ID)
            known = self.masters.get(broker_name)
            if (
                addr is None
                or broker_name in read_only  # an acting master (module docstring)
                or (known is not None and route.fetched_at <= known[1])
            ):
                continue
            if known is not None and known[0] != addr:
                changed.append(broker_name)
            self.masters[broker_name] = (addr, route.fetched_at)
        return changed


def failover_notice(group: str, broker_name: str) -> str:
    """The reason a cancelled consumer is given (the callback's argument, the error's
    message)."""
    return (
        f"consumer group {group}: the master of broker group {broker_name} changed "
        "(HA failover); subscribe again to go on consuming"
    )
