"""Builds controller states the way production will: decide, encode, decode, apply."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hamq.controller.apply import apply_event
from hamq.controller.codec import decode_event, encode_event
from hamq.controller.decide import (
    decide_alter_sync_state_set,
    decide_apply_broker_id,
    decide_elect_master,
    decide_register_broker,
)
from hamq.controller.errors import ControllerError
from hamq.controller.events import Event
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    ElectMasterRequest,
    ElectTrigger,
    RegisterBrokerRequest,
)
from hamq.controller.state import ControllerState

CLUSTER, GROUP = "DefaultCluster", "broker-a"
KEY = (CLUSTER, GROUP)


def _commit(state: ControllerState, decision: Event | ControllerError) -> Event:
    """Apply a decision as a Raft peer would, through its encoded bytes."""
    assert not isinstance(decision, ControllerError), decision
    event = decode_event(encode_event(decision))
    assert event == decision
    assert apply_event(state, event)
    return event


def _add_members(state: ControllerState, ids: range) -> None:
    for broker_id in ids:
        address = f"127.0.0.1:{10900 + broker_id}"
        request = ApplyBrokerIdRequest(CLUSTER, GROUP, broker_id, address, f"{address};{broker_id}")
        _commit(state, decide_apply_broker_id(state, request, now_ms=1000 + broker_id))
        # its registration at the same address changes nothing replicated
        register = RegisterBrokerRequest(
            CLUSTER, GROUP, broker_id, address, request.register_check_code
        )
        assert decide_register_broker(state, register, now_ms=2000 + broker_id) is None


@pytest.fixture
def commit() -> Callable[[ControllerState, Event | ControllerError], Event]:
    return _commit


@pytest.fixture
def three_members() -> ControllerState:
    """Members 1, 2, 3 with ids granted and no election yet."""
    state = ControllerState()
    _add_members(state, range(1, 4))
    return state


@pytest.fixture
def group_of_three() -> ControllerState:
    """Members 1, 2, 3; 1 elected first; the set grown to all three (epochs 1 and 2)."""
    state = ControllerState()
    _add_members(state, range(1, 4))
    alive = {1, 2, 3}
    first = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.REGISTER, broker_id=1)
    _commit(state, decide_elect_master(state, first, alive, {}, False))
    grow = AlterSyncStateSetRequest(CLUSTER, GROUP, 1, 1, frozenset({1, 2, 3}), 1)
    _commit(state, decide_alter_sync_state_set(state, grow, alive))
    return state
