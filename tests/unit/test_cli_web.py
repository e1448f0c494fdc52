"""``hamq web`` refuses a listen address it cannot serve on in one line, without a
traceback: a malformed one is bad usage (exit 2), a taken port exit 1."""

from __future__ import annotations

import socket

from click.testing import CliRunner

from hamq.cli.main import cli


def test_a_malformed_listen_address_is_bad_usage():
    result = CliRunner().invoke(cli, ["web", "--listen", "nohost"])
    assert result.exit_code == 2, result.output
    assert "--listen" in result.output


def test_a_taken_port_is_one_line_naming_it():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        result = CliRunner().invoke(cli, ["web", "--listen", listen, "--controller", listen])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"Error: cannot serve on {listen}: Address already in use"
    ]
