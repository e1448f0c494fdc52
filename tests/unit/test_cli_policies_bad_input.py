"""Every ``hamq admin`` policy command with bad input or no controller: one line, exit code
2 for input that cannot be right (refused before anything is sent), 1 when the controller or
node cannot be reached; never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hamq.cli.main import cli

# Nothing listens here (port 1 is privileged and unused on the test machines).
NOBODY = "127.0.0.1:1"
ALL = '{"ha-mode":"all"}'


def _run(args: list[str]):
    result = CliRunner().invoke(cli, ["admin", *args, "--controller", NOBODY])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["set-policy", "", ".", ALL], "policy name"),
        (["set-policy", "p", ".", ALL, "--priority", str(2**40)], "--priority"),
        (["set-policy", "p", "(a)\\1", ALL], "not a regular expression hamq runs"),
        (["set-policy", "p", "(x{1000}){1000}", ALL], "invalid repetition size"),
        (["set-policy", "p", ".", '{"ha-mode":"all","ha-params":null,"x":1}'], "'x'"),
        (["set-policy", "p", ".", '{"ha-mode":["all"]}'], "ha-mode"),
        (["set-policy", "p", ".", "[" * 100_000 + "]" * 100_000], "nested too deeply"),
        (["clear-policy", ""], "policy name"),
        (["list-policies", "--vhost", "a b"], "vhost"),
        (["declare-topic", "t", "--node", "nohost"], "--node"),
        (["declare-topic", "a b", "--node", NOBODY], "topic"),
        (["declare-topic", "x%y"], "must not contain '%'"),
        (["declare-topic", "t", "--vhost", "v", "--node", NOBODY, "--queues", "0"], "--queues"),
        (["sync-queue", "a/b"], "topic"),
        (["cancel-sync-queue", "t" * 200], "topic"),
        (["add-vhost", "a%b"], "vhost"),
    ],
)
def test_bad_input_is_exit_2_before_anything_is_sent(args, words):
    result = _run(args)
    assert result.exit_code == 2, result.output
    assert words in result.output
    if "--" not in words:  # click's own option errors print a usage line first
        assert len(result.output.strip().splitlines()) == 1, result.output


# One of each path (the controller client retries for its timeout, so not every command).
@pytest.mark.parametrize(
    "args",
    [
        ["set-policy", "p", ".", ALL],
        ["declare-topic", "t", "--node", NOBODY],
    ],
)
def test_an_unreachable_controller_or_node_is_exit_1_in_one_line(args):
    result = _run(args)
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
