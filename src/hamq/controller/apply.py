"""Apply an event to the state: deterministic, so every controller peer agrees.

An event decided against a state that a concurrent event has since changed is refused here
(``False``, nothing changes) instead of trusted: the leader may decide two requests before
either is committed, and the log order, not the decide order, is what counts.
"""

from __future__ import annotations

from dataclasses import replace

from hamq.controller.catalog import apply_catalog
from hamq.controller.events import (
    GROUP_EVENTS,
    AlterSyncStateSet,
    ApplyBrokerId,
    CleanBrokerData,
    ElectMaster,
    Event,
    GroupEvent,
    RegisterBroker,
)
from hamq.controller.state import BrokerGroup, BrokerMember, ControllerState


def apply_event(state: ControllerState, event: Event) -> bool:
    """Apply ``event`` to ``state``; return whether it changed anything."""
    if not isinstance(event, GROUP_EVENTS):
        return apply_catalog(state, event)
    key = (event.cluster_name, event.broker_name)
    group = state.groups.get(key)
    if isinstance(event, ApplyBrokerId):
        member = BrokerMember(event.address, event.register_check_code, event.register_time_ms)
        if group is None:
            epoch = state.retired_epochs.pop(key, 0)
            state.groups[key] = BrokerGroup(
                members={event.broker_id: member}, master_epoch=epoch, first_epoch=epoch
            )
            return True
        old = group.members.get(event.broker_id)
        if old is not None and old.register_check_code != event.register_check_code:
            return False  # the id went to another broker first
        state.groups[key] = replace(group, members={**group.members, event.broker_id: member})
        return True
    if group is None:
        return False
    new_group = _apply_to_group(group, event)
    if new_group is None:
        return False
    if new_group.members:
        state.groups[key] = new_group
    else:
        del state.groups[key]
        if group.master_epoch > 0:
            state.retired_epochs[key] = group.master_epoch
    return True


def _apply_to_group(group: BrokerGroup, event: GroupEvent) -> BrokerGroup | None:
    if isinstance(event, RegisterBroker):
        old = group.members.get(event.broker_id)
        if old is None:
            return None
        member = replace(old, address=event.address, register_time_ms=event.register_time_ms)
        return replace(group, members={**group.members, event.broker_id: member})
    if isinstance(event, ElectMaster):
        # A group's first election may start past its members' reported epochs
        # (``decide._first_epoch``); every later one is exactly the next epoch.
        if not (
            event.new_master_epoch == group.master_epoch + 1
            or (not group.elected and event.new_master_epoch > group.master_epoch)
        ):
            return None
        if event.new_master_id is None:
            # Nobody could take over: the master is gone but the set is kept, so a member of
            # it that comes back alive can still be elected cleanly (RocketMQ does the same).
            return replace(group, master_id=None, master_epoch=event.new_master_epoch)
        if event.new_master_id not in group.members:
            return None
        return replace(
            group,
            master_id=event.new_master_id,
            master_epoch=event.new_master_epoch,
            sync_state_set=frozenset({event.new_master_id}),
            sync_state_set_epoch=group.sync_state_set_epoch + 1,
        )
    if isinstance(event, AlterSyncStateSet):
        if (
            event.master_id != group.master_id
            or event.master_epoch != group.master_epoch
            or event.new_sync_state_set_epoch != group.sync_state_set_epoch + 1
            or event.master_id not in event.new_sync_state_set
            or not event.new_sync_state_set <= group.members.keys()
        ):
            return None
        return replace(
            group,
            sync_state_set=event.new_sync_state_set,
            sync_state_set_epoch=event.new_sync_state_set_epoch,
        )
    if isinstance(event, CleanBrokerData):
        if not event.broker_ids:
            return replace(group, members={})
        if group.master_id in event.broker_ids:
            return None  # would leave a master outside the members; decide refuses it too
        members = {i: m for i, m in group.members.items() if i not in event.broker_ids}
        new_set = group.sync_state_set - event.broker_ids
        if new_set == group.sync_state_set:
            return replace(group, members=members)
        # A changed set gets a new epoch, so an alter decided against the old one is fenced.
        return replace(
            group,
            members=members,
            sync_state_set=new_set,
            sync_state_set_epoch=group.sync_state_set_epoch + 1,
        )
    return None
