"""``hamq.manage.groups.group_view``: one group view from the controller's sync-state data
or, without it, from each member's runtime info, in every replication mode (the API tests
on a real cluster see the controller mode only)."""

from __future__ import annotations

from hamq.manage.groups import CONTROLLER, DLEDGER, MASTER_SLAVE, controller_members, group_view


def row(addr: str, registered_id: int, broker_role: str, epoch: int, **extra) -> dict:
    """A ``member_rows`` row: registration plus the runtime info fields the view reads."""
    return {
        "cluster": "c",
        "broker_name": "g",
        "broker_id": registered_id,
        "address": addr,
        "broker_role": broker_role,
        "role": {"broker_id": extra.pop("own_id", registered_id), "epoch": epoch},
        "commitlog_max_offset": 100,
        "ha": {},
        "controller": None,
        **extra,
    }


def test_master_slave_group_from_its_members():
    view = group_view(
        "g",
        [
            row("a:1", 0, "sync_master", 3, ha={"role": "master", "epoch": 3}),
            row("a:2", 1, "slave", 3),
            {"cluster": "c", "broker_name": "g", "broker_id": 2, "address": "a:3", "error": "x"},
        ],
        None,
    )
    assert (view["mode"], view["master_id"], view["master_addr"]) == (MASTER_SLAVE, 0, "a:1")
    assert view["master_epoch"] == 3 and view["sync_state_set"] is None
    assert [(m["broker_id"], m["role"], m["alive"]) for m in view["members"]] == [
        (0, "master", True),
        (1, "slave", True),
        (2, "down", False),
    ]
    assert view["members"][2]["error"] == "x"


def test_dledger_members_are_named_by_their_raft_ids():
    view = group_view(
        "g",
        [
            row("a:1", 0, "leader", 5, ha={"role": "dledger", "member_id": 2}),
            row("a:2", 1, "follower", 5, ha={"role": "dledger", "member_id": 1}),
        ],
        None,
    )
    assert (view["mode"], view["master_id"]) == (DLEDGER, 2)
    assert [(m["broker_id"], m["role"]) for m in view["members"]] == [(1, "slave"), (2, "master")]


def test_controller_group_read_from_its_members_when_no_controller_is_configured():
    replicas = {"sync_state_set": [1, 3], "sync_state_set_epoch": 4, "confirm_offset": 90}
    view = group_view(
        "g",
        [
            row("a:1", 0, "async_master", 2, own_id=1, controller=replicas),
            row("a:2", 2, "slave", 2, controller=replicas | {"confirm_offset": 80}),
            row("a:3", 3, "slave", 2, controller=replicas),
        ],
        None,
    )
    assert (view["mode"], view["master_id"], view["confirm_offset"]) == (CONTROLLER, 1, 90)
    assert (view["sync_state_set"], view["sync_state_set_epoch"]) == ([1, 3], 4)
    assert [(m["broker_id"], m["in_sync"]) for m in view["members"]] == [
        (1, True),
        (2, False),
        (3, True),
    ]


def test_the_controllers_word_wins_and_names_members_that_are_down():
    decided = {
        "cluster_name": "c",
        "broker_name": "g",
        "master_id": 2,
        "master_addr": "a:2",
        "master_epoch": 7,
        "sync_state_set": [2],
        "sync_state_set_epoch": 9,
        "members": [
            {"broker_id": 2, "address": "a:2", "alive": True, "epoch": 7},
            {"broker_id": 1, "address": "a:1", "alive": False, "epoch": 6},
        ],
    }
    for m in decided["members"]:
        m |= {"max_offset": 50, "confirm_offset": 40 + m["broker_id"]}
    view = group_view("g", [row("a:2", 0, "async_master", 7, own_id=2)], decided)
    assert (view["mode"], view["master_id"], view["confirm_offset"]) == (CONTROLLER, 2, 42)
    down, master = view["members"]
    assert (down["broker_id"], down["alive"], down["role"], down["error"]) == (
        1,
        False,
        "down",
        "not registered",
    )
    assert (master["broker_role"], master["in_sync"]) == ("async_master", True)
    assert [m["role"] for m in controller_members(decided)] == ["down", "master"]
