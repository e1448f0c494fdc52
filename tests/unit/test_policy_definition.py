"""Policy definitions are checked where they are set: the seed's three examples parse as
written, and every bad key or value is refused with a message naming it."""

from __future__ import annotations

import pytest

from hamq.errors import InvalidArgument
from hamq.policy.definition import (
    DEFAULT_VHOST,
    HaDefinition,
    HaMode,
    PolicyError,
    check_vhost,
    effective_policy,
    make_policy,
    parse_definition,
    split_wire_name,
    wire_name,
)
from hamq.policy.placement import group_for_node, group_for_policy, rules_for_group

# ../shared/seeds/003: rabbitmqctl set_policy ha-all / ha-two / ha-nodes
SEED_EXAMPLES = {
    "ha-all": ("^ha.", {"ha-mode": "all"}),
    "ha-two": ("^two.", {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"}),
    "ha-nodes": ("^nodes.", {"ha-mode": "nodes", "ha-params": ["rabbit@nodeA", "rabbit@nodeB"]}),
}


@pytest.mark.parametrize("name", sorted(SEED_EXAMPLES))
def test_the_seeds_examples_parse_and_show_as_written(name):
    pattern, raw = SEED_EXAMPLES[name]
    policy = make_policy(DEFAULT_VHOST, name, pattern, raw)
    assert policy.definition.to_json() == raw
    assert parse_definition(policy.definition.to_json()) == policy.definition


def test_the_seeds_examples_mean_what_the_seed_says():
    two = parse_definition(SEED_EXAMPLES["ha-two"][1])
    assert (two.ha_mode, two.ha_params, two.ha_sync_mode) == (HaMode.EXACTLY, 2, "automatic")
    nodes = parse_definition(SEED_EXAMPLES["ha-nodes"][1])
    assert nodes.ha_params == ("rabbit@nodeA", "rabbit@nodeB")
    assert parse_definition({"ha-mode": "all"}) == HaDefinition(ha_mode=HaMode.ALL)


def test_defaults_are_hamqs_documented_ones():
    rules = parse_definition({"ha-mode": "all"})
    assert rules.ha_sync_mode == "manual"
    assert rules.ha_sync_batch_size == 4096
    # RabbitMQ's failure default is "always"; hamq promises no acknowledged loss
    assert rules.ha_promote_on_shutdown == rules.ha_promote_on_failure == "when-synced"
    assert rules.queue_master_locator is None


def test_every_key_is_read():
    raw = {
        "ha-mode": "nodes",
        "ha-params": ["hamq@a", "hamq@b", "hamq@a"],
        "ha-sync-mode": "automatic",
        "ha-sync-batch-size": 1_000_000,
        "ha-promote-on-shutdown": "always",
        "ha-promote-on-failure": "always",
        "queue-master-locator": "min-masters",
    }
    rules = parse_definition(raw)
    assert rules == HaDefinition(
        HaMode.NODES, ("hamq@a", "hamq@b"), "automatic", 1_000_000, "always", "always",
        "min-masters",
    )  # fmt: skip
    assert rules.to_json() == {**raw, "ha-params": ["hamq@a", "hamq@b"]}


def test_a_locator_alone_is_a_definition_without_mirrors():
    rules = parse_definition({"queue-master-locator": "random"})
    assert rules.ha_mode is None and rules.to_json() == {"queue-master-locator": "random"}


BAD_DEFINITIONS = [
    ({}, "definition is empty"),
    ({"ha-mod": "all"}, "definition key 'ha-mod' is not known (did you mean 'ha-mode'?)"),
    ({"max-length": 5}, "definition key 'max-length' is not known"),
    ({"ha-params": 2}, "ha-params: ha-mode is required"),
    ({"ha-sync-mode": "automatic"}, "ha-sync-mode: ha-mode is required"),
    ({"ha-mode": "some"}, "ha-mode = 'some': must be one of 'all', 'exactly', 'nodes'"),
    ({"ha-mode": 1}, "ha-mode = 1: must be one of"),
    ({"ha-mode": "all", "ha-params": 2}, "ha-params = 2: not allowed with ha-mode 'all'"),
    ({"ha-mode": "exactly"}, "ha-params: required with ha-mode 'exactly'"),
    ({"ha-mode": "exactly", "ha-params": 0}, "ha-params = 0: must be a positive integer"),
    ({"ha-mode": "exactly", "ha-params": "2"}, "ha-params = '2': must be a positive integer"),
    ({"ha-mode": "exactly", "ha-params": True}, "ha-params = True: must be a positive integer"),
    ({"ha-mode": "nodes"}, "ha-params: required with ha-mode 'nodes'"),
    ({"ha-mode": "nodes", "ha-params": []}, "ha-params = []: ha-mode 'nodes' needs a non-empty"),
    ({"ha-mode": "nodes", "ha-params": "hamq@a"}, "needs a non-empty list of node names"),
    ({"ha-mode": "nodes", "ha-params": ["nodeA"]}, "ha-params: node 'nodeA' must look like"),
    ({"ha-mode": "nodes", "ha-params": [3]}, "ha-params: node 3 must look like hamq@host"),
    ({"ha-mode": "all", "ha-sync-mode": "auto"}, "ha-sync-mode = 'auto': must be one of"),
    ({"ha-mode": "all", "ha-sync-batch-size": 0}, "ha-sync-batch-size = 0: must be a positive"),
    ({"ha-mode": "all", "ha-sync-batch-size": 1.5}, "ha-sync-batch-size = 1.5: must be a"),
    ({"ha-mode": "all", "ha-sync-batch-size": 1_000_001}, "must be at most 1000000"),
    ({"ha-mode": "all", "ha-promote-on-shutdown": "never"}, "ha-promote-on-shutdown = 'never'"),
    ({"ha-mode": "all", "ha-promote-on-failure": "yes"}, "ha-promote-on-failure = 'yes'"),
    ({"queue-master-locator": "any"}, "queue-master-locator = 'any': must be one of"),
]


@pytest.mark.parametrize(("raw", "message"), BAD_DEFINITIONS)
def test_a_bad_definition_is_refused_naming_the_key(raw, message):
    with pytest.raises(PolicyError) as err:
        parse_definition(raw)
    assert message in err.value.message
    assert isinstance(err.value, InvalidArgument)  # answered as INVALID_ARGUMENT


def test_a_definition_that_is_not_an_object_is_refused():
    with pytest.raises(PolicyError, match="definition must be a JSON object, got list"):
        parse_definition(["ha-mode", "all"])  # type: ignore[arg-type]


ALL = {"ha-mode": "all"}
BAD_POLICIES = [
    (("v/1", "p", ".", ALL), {}, "vhost = 'v/1': must be '/' or 1-64"),
    (("", "p", ".", ALL), {}, "vhost = '': must be"),
    (("/", "", ".", ALL), {}, "policy name = '': must be a non-empty string"),
    (("/", "p\n", ".", ALL), {}, "policy name = 'p\\n': at most 255 printable"),
    (("/", "p" * 256, ".", ALL), {}, "at most 255 printable characters"),
    (("/", "p", "(", ALL), {}, "pattern = '(': not a regular expression"),
    (("/", "p", 5, ALL), {}, "pattern = 5: must be a string"),
    (("/", "p", ".", ALL), {"priority": "1"}, "priority = '1': must be an integer"),
    (("/", "p", ".", ALL), {"priority": True}, "priority = True: must be an integer"),
    (("/", "p", ".", ALL), {"apply_to": "exchanges"}, "apply-to = 'exchanges': must be one of"),
    (("/", "p", ".", {"ha-mode": "x"}), {}, "ha-mode = 'x'"),
]


@pytest.mark.parametrize(("args", "kwargs", "message"), BAD_POLICIES)
def test_a_bad_policy_is_refused_naming_the_field(args, kwargs, message):
    with pytest.raises(PolicyError) as err:
        make_policy(*args, **kwargs)
    assert message in err.value.message


def test_apply_to_queues_is_rabbitmqs_word_for_topics():
    assert make_policy("/", "p", ".", ALL, apply_to="queues").apply_to == "topics"
    assert make_policy("/", "p", ".", ALL, apply_to="all").apply_to == "all"


def test_the_highest_priority_matching_policy_applies_and_ties_go_to_the_first_name():
    low = make_policy("/", "low", "^orders", ALL, priority=1)
    zed = make_policy("/", "zed", "orders", ALL, priority=7)
    abe = make_policy("/", "abe", "ders$", ALL, priority=7)
    other_vhost = make_policy("v1", "top", ".", ALL, priority=99)
    policies = [low, zed, abe, other_vhost]
    assert effective_policy(policies, "/", "orders") is abe
    assert effective_policy(reversed(policies), "/", "orders") is abe  # order does not matter
    assert effective_policy(policies, "/", "orders.eu") is zed  # re.search: anywhere in it
    assert effective_policy(policies, "/", "x") is None
    assert effective_policy(policies, "v1", "orders") is other_vhost


def test_vhosts_and_wire_names():
    assert check_vhost("/") == "/" and check_vhost("tenant-1.eu") == "tenant-1.eu"
    with pytest.raises(PolicyError):
        check_vhost("a" * 65)
    assert wire_name("/", "orders") == "orders"
    assert wire_name("v1", "orders") == "v1%orders"
    assert split_wire_name("orders") == ("/", "orders")
    assert split_wire_name("v1%orders") == ("v1", "orders")
    # retry and dead-letter topics keep their prefix, as RocketMQ's NamespaceUtil reads them
    assert split_wire_name("%RETRY%v1%g") == ("v1", "%RETRY%g")
    assert split_wire_name("%DLQ%g") == ("/", "%DLQ%g")
    with pytest.raises(PolicyError):
        split_wire_name("bad/vhost%t")


def test_group_names_are_stable_broker_names_and_distinct():
    names = {
        group_for_policy("/", "ha-all"),
        group_for_policy("v1", "ha-all"),
        group_for_policy("/", "ha all"),
        group_for_policy("/", "ha/all"),
        group_for_node("hamq@a"),
        group_for_node("hamq_a@x"),
    }
    assert len(names) == 6
    assert group_for_policy("/", "ha-all") == "ha_ha-all-2d373228fd"  # stored in state: stable
    for name in [*names, group_for_policy("/", "é" * 300)]:
        assert len(name) <= 64 and all(c.isalnum() or c in "_-" for c in name), name


def test_rules_for_group_are_the_mirroring_policys():
    two = make_policy("/", "ha-two", "^two", SEED_EXAMPLES["ha-two"][1])
    locator_only = make_policy("/", "loc", ".", {"queue-master-locator": "random"})
    policies = [two, locator_only]
    assert rules_for_group(policies, group_for_policy("/", "ha-two")) == two.definition
    assert rules_for_group(policies, group_for_policy("/", "loc")) is None
    assert rules_for_group(policies, group_for_node("hamq@a")) is None
