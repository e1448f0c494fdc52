"""Policy names: created only if every interface can address them (no "/", no blanks at
the ends, no control characters), while a policy an older version stored under such a
name is still read back from the controller's log and snapshot and can be deleted."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from hamq.cli.policies import clear_policy, set_policy
from hamq.controller.apply import apply_event
from hamq.controller.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from hamq.controller.events import ClearPolicy, SetPolicy
from hamq.controller.state import ControllerState
from hamq.policy.definition import PolicyError, check_policy_name, make_policy

ALL = {"ha-mode": "all"}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a/b", "must not contain '/'"),
        ("/", "must not contain '/'"),
        (" ", "must not be blank"),
        ("   ", "must not be blank"),
        (" ha-all", "start or end with a blank"),
        ("ha-all ", "start or end with a blank"),
        ("", "must be a non-empty string"),
        ("ha\tall", "printable characters"),
        ("ha\x1ball", "printable characters"),
        (5, "must be a non-empty string"),
    ],
)
def test_a_name_hamq_cannot_address_is_refused_naming_the_name(name, message):
    with pytest.raises(PolicyError) as err:
        check_policy_name(name)
    assert err.value.message.startswith(f"policy name = {name!r}: ")
    assert message in err.value.message
    with pytest.raises(PolicyError):
        make_policy("/", name, ".", ALL)  # set-policy, the controller and the API use it


@pytest.mark.parametrize("name", ["ha-all", "ha all", "hé-名前", "a.b_c-d"])
def test_addressable_names_are_accepted(name):
    assert check_policy_name(name) == name


def _stored(name: str):
    """A policy as an older version could have stored it (its name checks were looser)."""
    return dataclasses.replace(make_policy("/", "p", "^ha.", ALL), name=name)


@pytest.mark.parametrize("name", ["a/b", " ", " padded "])
def test_a_policy_stored_by_an_older_version_is_read_back_and_deleted(name):
    policy = _stored(name)
    assert decode_event(encode_event(SetPolicy(policy))) == SetPolicy(policy)
    state = ControllerState()
    assert apply_event(state, SetPolicy(policy))
    state = decode_snapshot(encode_snapshot(state))
    assert state.policies == {("/", name): policy}
    assert apply_event(state, decode_event(encode_event(ClearPolicy("/", name))))
    assert state.policies == {}


def test_clear_policy_does_not_refuse_such_a_name_but_set_policy_does():
    # the name is checked first (it comes first); the bad vhost then stops the command
    # before it would connect anywhere
    args = ["a/b", "--vhost", "a b"]
    cleared = CliRunner().invoke(clear_policy, args)
    assert cleared.exit_code == 2, cleared.output
    assert "vhost = 'a b'" in cleared.output, cleared.output
    refused = CliRunner().invoke(set_policy, [*args[:1], "^ha.", '{"ha-mode": "all"}'])
    assert refused.exit_code == 2, refused.output
    assert "policy name = 'a/b': must not contain '/'" in refused.output, refused.output
