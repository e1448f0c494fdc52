"""Invariants of the policy world (``policy_world``), checked after every step the
placement driver takes, every tick, and once the faults have stopped.

Safety, per group (the controller's record, through the production ``apply_event``):
- no step stops the master or deletes its store;
- no step takes a group from one or more alive synchronised members (members of its
  SyncStateSet the controller hears from: candidates of a clean election) to none;
- an acknowledged message (held by every member of the master's effective SyncStateSet
  when it was acked) that the consumer has not yet committed past is held, at its offset,
  by some member of the group's SyncStateSet, alive or not. Nodes keep their disks when
  they crash, so no number of crashes excuses a loss: the only one the policies allow is
  an unclean election (``ha-promote-on-failure`` / ``-on-shutdown`` = always), which
  exempts what the group acked before it;
- a topic's groups are distinct: exactly one is writable (the last).
Liveness (a writable group may lose its topic for a while: a step of an old leader still
in flight reaches brokers; the driver must repair it): with every node back and no request
failing, within ``SETTLE_TICKS`` the plan has no steps left, each group has a member on
exactly its wanted nodes, all of them synchronised, its master on one of them, each topic
lives only in its group, read-write there and nowhere else, and a deleted topic in none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hamq.sim.policy_world import PolicyWorld, SimMember

CLUSTER = "hamq"


def _fail(message: str) -> None:
    from hamq.sim.policy_world import Failed

    raise Failed(message)


def synchronised_count(world: PolicyWorld, name: str) -> int:
    """Synchronised members the controller hears from: those a clean election may take."""
    group = world.group(name)
    if group is None:
        return 0
    alive = world.controller_alive((CLUSTER, name))
    return len(group.sync_state_set & group.members.keys() & alive)


def after_step(world: PolicyWorld, step: object, group: str, before: int) -> None:
    """``step`` (an event the driver committed, or its election) was just applied."""
    after = synchronised_count(world, group)
    if before >= 1 and after == 0:
        _fail(f"{step} left group {group} with no alive synchronised member")


def before_store_deleted(world: PolicyWorld, member: SimMember) -> None:
    group = world.group(member.group)
    if group is not None and group.master_id == member.broker_id:
        _fail(f"REMOVE_BROKER stopped master {member.broker_id} of {member.group}")


def every_tick(world: PolicyWorld) -> None:
    _acked_held(world)
    _one_writable_group(world)


def _acked_held(world: PolicyWorld) -> None:
    still = []
    for acked in world.acked:
        data = world.data[acked.group]
        if acked.tick <= data.unclean_tick:
            continue  # the policy allowed an unclean election since: may be lost
        if data.consumed is not None and acked.offset < data.consumed:
            continue  # consumed: no longer needed
        still.append(acked)
        group = world.group(acked.group)
        holders = () if group is None else group.sync_state_set & group.members.keys()
        if not any(world.members[(acked.group, i)].holds(acked.offset, acked.msg) for i in holders):
            _fail(
                f"acked message {acked.msg} at offset {acked.offset} of {acked.group} is held "
                f"by no synchronised member (set {sorted(holders)})"
            )
    world.acked = still


def _one_writable_group(world: PolicyWorld) -> None:
    for decl in world.state.topics.values():
        if len(set(decl.groups)) != len(decl.groups):
            _fail(f"topic {decl.name} is in groups {decl.groups}")


def settled(world: PolicyWorld) -> None:
    plan = world.plan
    if plan is None:
        _fail("no placement round ran")
        return
    if plan.steps:
        _fail(f"not settled after the faults stopped: {[str(s) for s in plan.steps]}")
    for name, wanted in plan.groups.items():
        group = world.group(name)
        if group is None:
            _fail(f"group {name} (wanted on {wanted.nodes}) has no members")
            return
        nodes = sorted(world.members[(name, i)].node for i in group.members)
        if nodes != sorted(wanted.nodes):
            _fail(f"group {name} is on {nodes}, its policy wants {sorted(wanted.nodes)}")
        if group.master_id is None or group.sync_state_set != frozenset(group.members):
            _fail(
                f"group {name}: master {group.master_id}, synchronised "
                f"{sorted(group.sync_state_set)} of {sorted(group.members)}"
            )
    for name, data in world.data.items():
        gone = sorted(t for t in data.perms if ("/", t) not in world.state.topics)
        if gone:
            _fail(f"group {name} still holds deleted topics {gone}")
    for (vhost, topic), target in plan.topic_group.items():
        decl = world.state.topics[(vhost, topic)]
        if decl.groups != (target,):
            _fail(f"topic {topic} is in {decl.groups}, its group is {target}")
        writable = sorted(name for name, data in world.data.items() if data.perms.get(topic) == 6)
        if writable != [target]:
            _fail(f"topic {topic} is writable in {writable}, its group is {target}")
