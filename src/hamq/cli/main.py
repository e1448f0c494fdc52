"""The ``hamq`` command."""

from __future__ import annotations

import click

from hamq.cli.admin import admin
from hamq.cli.bench import bench
from hamq.cli.chaos import chaos
from hamq.cli.messages import MESSAGE_COMMANDS
from hamq.cli.policies import POLICY_COMMANDS
from hamq.cli.servers import broker, container, controller, dev, namesrv
from hamq.cli.tools import cluster, consume, produce, topic
from hamq.cli.web import web


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hamq")
def cli() -> None:
    """hamq: a highly available, replicated message queue."""


for command in (
    namesrv,
    controller,
    broker,
    container,
    dev,
    topic,
    produce,
    consume,
    cluster,
    bench,
    admin,
    web,
    chaos,
):
    cli.add_command(command)
for command in POLICY_COMMANDS:  # vhosts, policies and mirrors (seed 003)
    admin.add_command(command)
for command in MESSAGE_COMMANDS:  # the message browser and offset reset
    admin.add_command(command)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
