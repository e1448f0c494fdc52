"""``hamq admin set-policy`` refuses a definition that cannot be right before it asks the
controller: one line naming the key, exit code 2, no traceback (rabbitmqctl's behaviour)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hamq.cli.main import cli
from hamq.cli.policies import _pid_text, _table
from hamq.manage.queues import member_nodes, mirrors

# Nothing listens here: a definition that got as far as the controller would fail with
# exit code 1 (connection refused), not 2.
NOBODY = "127.0.0.1:1"


@pytest.mark.parametrize(
    ("definition", "named"),
    [
        ('{"ha-mode":"exactly"}', "ha-params"),
        ('{"ha-mode":"exactly","ha-params":0}', "ha-params"),
        ('{"ha-mode":"nodes","ha-params":"hamq@node1"}', "ha-params"),
        ('{"ha-mode":"all","ha-sync-mode":"sometimes"}', "ha-sync-mode"),
        ('{"ha-mode":"all","ha-sync-batch-size":-1}', "ha-sync-batch-size"),
        ('{"ha-mode":"all","ha-promote-on-shutdown":"never"}', "ha-promote-on-shutdown"),
        ('{"ha-mode":"all","ha-colour":"blue"}', "ha-colour"),
        ('{"ha-mode":"sometimes"}', "ha-mode"),
        ('{"ha-mode":', "JSON"),
        ('["ha-mode"]', "JSON object"),
    ],
)
def test_bad_definition_is_one_line_naming_the_key(definition, named):
    result = CliRunner().invoke(
        cli, ["admin", "set-policy", "p", r"^ha\.", definition, "--controller", NOBODY]
    )
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    "args",
    [
        ["set-policy", "p", "(", '{"ha-mode":"all"}'],
        ["set-policy", "p", "^a", '{"ha-mode":"all"}', "--vhost", "no spaces"],
        ["list-queues", "--vhost", "a/b"],
        ["add-vhost", "x" * 65],
    ],
)
def test_bad_pattern_or_vhost_is_refused_before_asking(args):
    result = CliRunner().invoke(cli, ["admin", *args, "--controller", NOBODY])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_list_queues_columns_from_a_group():
    """pid is the master, slave_pids the alive others, synchronised_slave_pids those of
    them in the SyncStateSet; each names its node (from the nodes' heartbeats)."""
    group = {
        "master_id": 1,
        "master_addr": "127.0.0.1:1001",
        "sync_state_set": [1, 3],
        "members": [
            {"broker_id": 1, "address": "127.0.0.1:1001", "alive": True},
            {"broker_id": 2, "address": "127.0.0.1:1002", "alive": True},
            {"broker_id": 3, "address": "127.0.0.1:1003", "alive": True},
            {"broker_id": 4, "address": "127.0.0.1:1004", "alive": False},
        ],
    }
    node_of = member_nodes(
        [
            {"node": f"hamq@node{i}", "members": [{"address": f"127.0.0.1:100{i}"}]}
            for i in (1, 2, 3)
        ]
    )
    row = {"name": "ha.orders", **mirrors(group, node_of)}
    assert _table(
        ["name", "pid", "slave_pids", "synchronised_slave_pids"],
        [[_pid_text(row[c]) for c in ("name", "pid", "slave_pids", "synchronised_slave_pids")]],
    ).splitlines() == [
        "name\tpid\tslave_pids\tsynchronised_slave_pids",
        "ha.orders\t<hamq@node1 127.0.0.1:1001>\t"
        "[<hamq@node2 127.0.0.1:1002>, <hamq@node3 127.0.0.1:1003>]\t"
        "[<hamq@node3 127.0.0.1:1003>]",
    ]
    assert mirrors({**group, "master_id": None, "master_addr": None}, node_of)["pid"] is None
