"""Decide: validate a request against the state (read-only) into an event or a refusal.

Runs on the controller's Raft leader before proposing; ``apply`` re-checks the epochs, so a
decision made stale by a concurrent one is refused at apply time instead of trusted.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import replace

from hamq.controller.elect import BrokerLiveInfo, elect, report_rank
from hamq.controller.errors import ControllerCode, ControllerError
from hamq.controller.events import (
    AlterSyncStateSet,
    ApplyBrokerId,
    CleanBrokerData,
    ElectMaster,
    RegisterBroker,
)
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    CleanBrokerDataRequest,
    ElectMasterRequest,
    ElectTrigger,
    RegisterBrokerRequest,
)
from hamq.controller.state import FIRST_BROKER_CONTROLLER_ID, BrokerGroup, ControllerState

Code = ControllerCode


def _not_registered(cluster_name: str, broker_name: str) -> ControllerError:
    return ControllerError(
        Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
        f"broker group {cluster_name}/{broker_name} is not registered in the controller",
    )


def decide_apply_broker_id(
    state: ControllerState, request: ApplyBrokerIdRequest, now_ms: int
) -> ApplyBrokerId | ControllerError:
    """Grant an id that is free, or already this broker's (same register check code)."""
    group = state.groups.get((request.cluster_name, request.broker_name))
    event = ApplyBrokerId(
        request.cluster_name,
        request.broker_name,
        request.broker_id,
        request.address,
        request.register_check_code,
        now_ms,
    )
    # Any id of a group not known: its members apply their ids again, each with its own
    # code, when the controller lost its state (its data directory wiped).
    member = None if group is None else group.members.get(request.broker_id)
    if request.broker_id >= FIRST_BROKER_CONTROLLER_ID and (
        member is None or member.register_check_code == request.register_check_code
    ):
        return event
    return ControllerError(
        Code.CONTROLLER_BROKER_ID_INVALID,
        f"broker id {request.broker_id} of group {request.broker_name} belongs to another broker",
    )


def decide_register_broker(
    state: ControllerState, request: RegisterBrokerRequest, now_ms: int
) -> RegisterBroker | ControllerError | None:
    """Record a known member's new address; None when its address is the one recorded:
    nothing replicated changes, so the answer comes from the state without a Raft entry
    (members register at every start and after refused restart elections, and the log is
    never compacted). An address change needs the member's register check code: without
    it anyone could point the master's id at its own address and the group would follow.
    ``register_time_ms`` goes with an address change, for display only."""
    group = state.groups.get((request.cluster_name, request.broker_name))
    if group is None or request.broker_id not in group.members:
        return _not_registered(request.cluster_name, request.broker_name)
    member = group.members[request.broker_id]
    if member.address == request.address:
        return None
    if member.register_check_code != request.register_check_code:
        return ControllerError(
            Code.CONTROLLER_BROKER_ID_INVALID,
            f"broker id {request.broker_id} of {request.broker_name} is registered at "
            f"{member.address}; moving it to {request.address} needs its register check code",
        )
    return RegisterBroker(
        request.cluster_name, request.broker_name, request.broker_id, request.address, now_ms
    )


def decide_elect_master(
    state: ControllerState,
    request: ElectMasterRequest,
    alive: Set[int],
    live_info: Mapping[int, BrokerLiveInfo],
    unclean_allowed: bool,
) -> ElectMaster | ControllerError:
    """Elect by ``elect.elect``; an alive master in the set stays (CONTROLLER_MASTER_STILL_EXIST).
    ``unclean_allowed`` (``elect.unclean_allowed``) widens the candidates to every alive
    member; an unclean result carries the range it may lose (``_lost_range``).

    The group's first election takes any alive member, ranked by the (epoch, max offset)
    they report, ties to the registering one: members may already hold data (a group moved
    from master–slave mode, or created again after its metadata was cleaned), and the one
    with the most must win over a lagging member that happened to ask first; a new, empty
    group still elects its first registering member at once. A failed election after a
    master timeout still yields an event with no master: it ends the dead master's epoch,
    fencing it.
    """
    group = state.groups.get((request.cluster_name, request.broker_name))
    if group is None:
        return _not_registered(request.cluster_name, request.broker_name)
    if request.trigger is ElectTrigger.MASTER_RESTART:
        return _decide_restart(group, request, alive, live_info)
    first = not group.elected
    if request.trigger is not ElectTrigger.REGISTER:
        preferred = request.broker_id
    elif first:
        preferred = _best_or_none(group, request.broker_id, alive, live_info)
    else:
        preferred = None  # a registering member never takes mastership from the policy
    pool = replace(group, sync_state_set=frozenset(group.members)) if first else group
    result = elect(pool, alive, live_info, preferred, unclean_allowed)
    if result is not None and result.broker_id == group.master_id:
        return ControllerError(
            Code.CONTROLLER_MASTER_STILL_EXIST,
            f"master {group.master_id} of {request.broker_name} is alive; no election needed",
        )
    if result is not None:
        new_end, old_end = _lost_range(group, result.broker_id, live_info, result.unclean)
        return ElectMaster(
            request.cluster_name,
            request.broker_name,
            result.broker_id,
            (_first_epoch(group, live_info) if first else group.master_epoch) + 1,
            unclean=result.unclean,
            new_master_max_offset=new_end,
            old_master_max_offset=old_end,
        )
    if request.trigger is ElectTrigger.MASTER_TIMEOUT and group.master_id is not None:
        return ElectMaster(
            request.cluster_name, request.broker_name, None, group.master_epoch + 1, False
        )
    return ControllerError(
        Code.CONTROLLER_ELECT_MASTER_FAILED,
        f"no alive member of {request.broker_name} can be master"
        + ("" if preferred is None else f" (preferred {preferred} is not a candidate)"),
    )


def _lost_range(
    group: BrokerGroup, elected: int, live_info: Mapping[int, BrokerLiveInfo], unclean: bool
) -> tuple[int | None, int | None]:
    """What an unclean election may lose: the old master's log past the elected member's
    end, as both last reported them (None where one never reported; both None for a
    clean election, which loses nothing). A group whose master epoch already ended with
    no master (an election failed first, say under when-synced until an operator allowed
    promotion) no longer names the old master: the furthest other member's last report,
    by (epoch, max offset), stands for it, as that is the log the election gives up."""
    if not unclean:
        return None, None

    def max_offset(broker_id: int | None) -> int | None:
        info = None if broker_id is None else live_info.get(broker_id)
        return None if info is None or info.max_offset < 0 else info.max_offset

    old = group.master_id
    if old is None:
        others = [i for i in group.members if i != elected and i in live_info]
        old = max(others, key=lambda i: report_rank(live_info[i]), default=None)
    return max_offset(elected), max_offset(old)


def _first_epoch(group: BrokerGroup, live_info: Mapping[int, BrokerLiveInfo]) -> int:
    """Where a group's first election counts from: past every epoch its members report
    holding. A controller that lost its state (data directory wiped) creates the group
    again at epoch 0 while the members' epoch files and roles hold later epochs: counting
    from 0 would make members see an epoch go backwards (they refuse it) and could name a
    second master of an epoch that already had one."""
    reported = (info.epoch for i, info in live_info.items() if i in group.members)
    return max([group.master_epoch, *reported])


def _best_or_none(
    group: BrokerGroup,
    broker_id: int | None,
    alive: Set[int],
    live_info: Mapping[int, BrokerLiveInfo],
) -> int | None:
    """``broker_id`` if no alive member reports a larger (epoch, max offset) than it; else
    None, and the ranking picks the one that does."""
    if broker_id is None or broker_id not in alive:
        return None
    reported = report_rank(live_info.get(broker_id))
    others = (report_rank(live_info.get(i)) for i in group.members.keys() & alive)
    return broker_id if all(rank <= reported for rank in others) else None


def _decide_restart(
    group: BrokerGroup,
    request: ElectMasterRequest,
    alive: Set[int],
    live_info: Mapping[int, BrokerLiveInfo],
) -> ElectMaster | ControllerError:
    """The master restarted (Kafka's and RocketMQ's rule: a restarted leader never continues
    its epoch). With async flush it may have lost an unflushed tail that the SyncStateSet
    holds and acknowledged; continuing the epoch, it would write other records at those
    offsets and the slaves would cut acknowledged ones to the consistent point. So the
    alive set members compete by their largest (epoch, max offset), the requester with what
    it reported since it came back, and the epoch always moves on, whoever wins.

    Every alive set member must have reported since the requester registered: an older
    report may understate a slave's log (the restarted master would win over the records
    it lost); until then CONTROLLER_ELECT_MASTER_FAILED, and the member asks again. Both
    times are this leader's soft state on its own clock (``registered_ms``, recorded when
    it handled the registration): a leader that did not see the requester register (it
    was elected since) refuses the same way, and the member, refused a few times,
    registers again.
    When the requester is the only alive set member it wins again in a new epoch, which
    starts at its log's end: anything only a dead member holds is cut when that member
    returns (nothing acknowledged under sync flush; with async flush, the power loss took
    it with the member that could have kept it). ``master_epoch`` fences a retry after a
    lost answer: the epoch asked about is over, so it is refused (FENCED_MASTER_EPOCH) and
    the member re-reads its role.
    """
    refusal = _stale_master(group, request.broker_id, request.master_epoch)
    if refusal is not None:
        return refusal
    assert request.broker_id is not None, "the current master's id, checked above"
    requester = live_info.get(request.broker_id)
    registered = None if requester is None else requester.registered_ms
    if registered is None:
        return ControllerError(
            Code.CONTROLLER_ELECT_MASTER_FAILED,
            f"master {request.broker_id} of {request.broker_name} has not registered with "
            "this controller leader since it restarted; register again",
        )
    candidates = group.sync_state_set & alive
    stale = sorted(
        i
        for i in candidates
        if (seen := live_info.get(i)) is None
        or seen.last_seen_ms is None
        or seen.last_seen_ms < registered
    )
    if stale:
        return ControllerError(
            Code.CONTROLLER_ELECT_MASTER_FAILED,
            f"members {stale} of {request.broker_name} have not reported since master "
            f"{request.broker_id} restarted; ask again",
        )
    # No master keeps its place: the ranking alone decides (the requester is a candidate:
    # it is in the set and alive, having just registered).
    result = elect(replace(group, master_id=None), alive, live_info, None, False)
    if result is None:
        return ControllerError(
            Code.CONTROLLER_ELECT_MASTER_FAILED,
            f"master {request.broker_id} of {request.broker_name} is not an alive member "
            "of its SyncStateSet",
        )
    return ElectMaster(
        request.cluster_name,
        request.broker_name,
        result.broker_id,
        group.master_epoch + 1,
        unclean=False,
    )


def decide_alter_sync_state_set(
    state: ControllerState, request: AlterSyncStateSetRequest, alive: Set[int]
) -> AlterSyncStateSet | ControllerError:
    """Fencing: only the current master, at the current master and set epochs, may alter."""
    group = state.groups.get((request.cluster_name, request.broker_name))
    if group is None:
        return ControllerError(
            Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, "broker metadata does not exist"
        )
    refusal = _alter_refusal(group, request, alive)
    if refusal is not None:
        return refusal
    return AlterSyncStateSet(
        request.cluster_name,
        request.broker_name,
        request.master_id,
        request.master_epoch,
        request.new_sync_state_set,
        group.sync_state_set_epoch + 1,
    )


def _alter_refusal(
    group: BrokerGroup, request: AlterSyncStateSetRequest, alive: Set[int]
) -> ControllerError | None:
    # The fencing tokens are checked first: an alter asked again after its answer was lost
    # (the set now equals it, at a newer epoch) is stale, and a master refused as stale
    # re-reads its replica info, where "no change" would leave it on its old view.
    refusal = _stale_master(group, request.master_id, request.master_epoch)
    if refusal is not None:
        return refusal
    if request.sync_state_set_epoch != group.sync_state_set_epoch:
        return ControllerError(
            Code.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
            f"the current SyncStateSet epoch is {group.sync_state_set_epoch}, "
            f"not {request.sync_state_set_epoch}",
        )
    new_set = request.new_sync_state_set
    if new_set == group.sync_state_set:
        return ControllerError(
            Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, "the new SyncStateSet equals the current"
        )
    unknown = sorted(new_set - group.members.keys())
    if unknown:
        return ControllerError(Code.CONTROLLER_INVALID_REPLICAS, f"unknown members {unknown}")
    dead = sorted(new_set - alive)
    if dead:
        return ControllerError(Code.CONTROLLER_BROKER_NOT_ALIVE, f"members {dead} are not alive")
    if group.master_id not in new_set:
        return ControllerError(
            Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
            f"the new SyncStateSet lacks the master {group.master_id}",
        )
    return None


def _stale_master(
    group: BrokerGroup, master_id: int | None, master_epoch: int | None
) -> ControllerError | None:
    """The fencing tokens: the requester must be the current master, at the current epoch."""
    if group.master_id is None or master_id != group.master_id:
        return ControllerError(
            Code.CONTROLLER_INVALID_MASTER,
            f"the current master is {group.master_id}, not {master_id}",
        )
    if master_epoch != group.master_epoch:
        return ControllerError(
            Code.CONTROLLER_FENCED_MASTER_EPOCH,
            f"the current master epoch is {group.master_epoch}, not {master_epoch}",
        )
    return None


def decide_clean_broker_data(
    state: ControllerState, request: CleanBrokerDataRequest, alive: Set[int]
) -> CleanBrokerData | ControllerError:
    """Forget members that are dead (unless ``clean_living_broker``); never the master
    alone, nor a living master with its whole group: forgotten, it would go on
    acknowledging with no election left to fence it. A group cleaned whole leaves its
    last master epoch in ``retired_epochs`` (``apply.py``), so one created again under its
    name continues above it."""
    group = state.groups.get((request.cluster_name, request.broker_name))
    if group is None:
        return ControllerError(
            Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
            f"broker group {request.broker_name} does not exist",
        )
    targets = request.broker_ids or frozenset(group.members)
    if not request.broker_ids and group.master_id in alive:
        return ControllerError(
            Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
            f"master {group.master_id} of {request.broker_name} is alive; stop it before "
            "cleaning the whole group",
        )
    living = sorted(targets & alive)
    if living and not request.clean_living_broker:
        return ControllerError(
            Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
            f"members {living} of {request.broker_name} are alive",
        )
    if request.broker_ids and group.master_id in request.broker_ids:
        return ControllerError(
            Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
            f"member {group.master_id} is the master; elect another or clean the whole group",
        )
    return CleanBrokerData(request.cluster_name, request.broker_name, request.broker_ids)
