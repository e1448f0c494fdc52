"""Random request sequences: two peers applying the same encoded events stay identical, and
the election and fencing invariants of seed 001 hold after every step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.controller.apply import apply_event
from hamq.controller.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from hamq.controller.decide import (
    decide_alter_sync_state_set,
    decide_apply_broker_id,
    decide_clean_broker_data,
    decide_elect_master,
    decide_register_broker,
)
from hamq.controller.elect import BrokerLiveInfo
from hamq.controller.errors import ControllerError
from hamq.controller.events import AlterSyncStateSet, ElectMaster
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    CleanBrokerDataRequest,
    ElectMasterRequest,
    ElectTrigger,
    RegisterBrokerRequest,
)
from hamq.controller.state import BrokerGroup, ControllerState

CLUSTER, GROUP = "DefaultCluster", "broker-a"
KEY = (CLUSTER, GROUP)
IDS = st.integers(1, 5)
ID_SETS = st.frozensets(IDS)
# Heartbeats: usually most members are alive.
ALIVE = st.frozensets(IDS, max_size=3).map(lambda dead: frozenset(range(1, 6)) - dead)

# None stands for "the id the controller would hand out next", so groups grow.
register = st.tuples(st.just("register"), st.none() | IDS, st.sampled_from(["h1", "h2"]))
elect = st.tuples(
    st.just("elect"),
    st.sampled_from(list(ElectTrigger)),
    st.none() | IDS,
    ALIVE,
    st.dictionaries(IDS, st.tuples(st.integers(0, 3), st.integers(0, 100))),
    st.booleans(),
)
# Requester (None: the current master), its view of the epochs as offsets from the current
# ones (mostly right, so alters get through), the set (plus the requester if asked), who is alive.
MOSTLY_RIGHT = st.sampled_from([0] * 6 + [-1, 1])
alter = st.tuples(
    st.just("alter"),
    st.one_of(st.none(), st.none(), st.none(), IDS),
    MOSTLY_RIGHT,
    MOSTLY_RIGHT,
    ID_SETS,
    st.sampled_from([True] * 4 + [False]),
    ALIVE,
)
clean = st.tuples(st.just("clean"), st.frozensets(IDS, min_size=1), ID_SETS)
operations = st.lists(
    st.one_of(register, register, elect, elect, alter, alter, alter, clean), max_size=40
)

# Every run starts from three registered members and a first master, so elections and
# alters have work to do.
PROLOGUE = [("register", None, "h1")] * 3 + [
    ("elect", ElectTrigger.REGISTER, 1, frozenset({1, 2, 3}), {}, False)
]


def _decide(state: ControllerState, op: tuple, now_ms: int):
    kind = op[0]
    if kind == "register":
        _, wanted, host = op
        broker_id = state.next_broker_id(KEY) if wanted is None else wanted
        address = f"{host}:{broker_id}"
        decision = decide_apply_broker_id(
            state, ApplyBrokerIdRequest(CLUSTER, GROUP, broker_id, address, str(broker_id)), now_ms
        )
        if isinstance(decision, ControllerError):
            return decision
        return [decision, RegisterBrokerRequest(CLUSTER, GROUP, broker_id, address, str(broker_id))]
    if kind == "elect":
        _, trigger, broker_id, alive, live, unclean = op
        infos = {i: BrokerLiveInfo(*v) for i, v in live.items()}
        request = ElectMasterRequest(CLUSTER, GROUP, trigger, broker_id)
        return decide_elect_master(state, request, alive, infos, unclean)
    if kind == "alter":
        _, wanted, master_delta, set_delta, new_set, with_requester, alive = op
        group = state.groups.get(KEY, BrokerGroup(members={}))
        requester = wanted or group.master_id or 1
        request = AlterSyncStateSetRequest(
            CLUSTER,
            GROUP,
            requester,
            group.master_epoch + master_delta,
            new_set | {requester} if with_requester else new_set,
            group.sync_state_set_epoch + set_delta,
        )
        return decide_alter_sync_state_set(state, request, alive)
    _, broker_ids, alive = op
    return decide_clean_broker_data(
        state, CleanBrokerDataRequest(CLUSTER, GROUP, broker_ids), alive
    )


def _check_step(before: BrokerGroup | None, after: BrokerGroup | None, op: tuple, event) -> None:
    if after is not None:
        assert after.master_id is None or after.master_id in after.sync_state_set
        assert after.sync_state_set <= after.members.keys()
    if before is None or after is None:
        return
    assert after.master_epoch >= before.master_epoch
    if after.sync_state_set != before.sync_state_set:
        assert after.sync_state_set_epoch > before.sync_state_set_epoch
    if isinstance(event, ElectMaster) and before.elected:
        assert after.master_epoch == before.master_epoch + 1
    elif isinstance(event, ElectMaster):  # a first election counts past reported epochs
        reported = [v[0] for i, v in op[4].items() if i in before.members]
        assert after.master_epoch == max([before.master_epoch, *reported]) + 1
    if isinstance(event, ElectMaster):
        if event.new_master_id is not None and not event.unclean and before.elected:
            assert event.new_master_id in before.sync_state_set & op[3]
    if op[0] == "alter" and isinstance(event, AlterSyncStateSet):
        # Only the current master at the current epochs gets an alter through.
        assert before.master_id is not None and event.master_id == before.master_id
        assert (event.master_epoch, op[3]) == (before.master_epoch, 0)
        assert after.sync_state_set_epoch == before.sync_state_set_epoch + 1
    elif op[0] == "alter":
        assert after == before


@settings(max_examples=300, deadline=None)
@given(operations)
def test_peers_agree_and_invariants_hold(ops):
    leader, follower = ControllerState(), ControllerState()
    for now_ms, op in enumerate(PROLOGUE + ops):
        pending = _decide(leader, op, now_ms)
        before = leader.groups.get(KEY)
        events = pending if isinstance(pending, list) else [pending]
        last = None
        for item in events:
            event = item
            if isinstance(item, RegisterBrokerRequest):
                event = decide_register_broker(leader, item, now_ms)
            if event is None or isinstance(event, ControllerError):
                continue  # refused, or a registration that changes nothing replicated
            entry = encode_event(event)
            assert apply_event(leader, decode_event(entry)) == apply_event(
                follower, decode_event(entry)
            )
            last = event
        assert leader == follower
        _check_step(before, leader.groups.get(KEY), op, last)
    assert decode_snapshot(encode_snapshot(leader)) == follower
