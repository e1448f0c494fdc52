"""``hamq dev --mode container``: two broker containers hosting two master–slave groups
crosswise, seed 004's picture for local escape. Container 1 holds the master of broker-a
and the slave of broker-b, container 2 the reverse; the name server routes a masterless
group's slave as a read-only master (``support_acting_master``), and every member may act
(``enable_slave_acting_master``). Removing broker-a's master from container 1
(``hamq admin container remove-broker``) makes broker-a's slave act in container 2, where
broker-b's master lives: its due delay messages escape locally, into that master."""

from __future__ import annotations

from pathlib import Path

GROUPS = ("broker-a", "broker-b")
GROUP_SIZE = 2  # a master and a slave
CONTAINER_PORT_OFFSET = 1000  # container k's own port: port base + 1000 + k


def member_name(broker_name: str, broker_id: int) -> str:
    return f"{broker_name}-{broker_id}"


def container_members(index: int) -> list[str]:
    """The members container ``index`` (0 or 1) hosts: master of one group, slave of the
    other."""
    master, slave = GROUPS[index], GROUPS[1 - index]
    return [member_name(master, 0), member_name(slave, 1)]


def container_settings(port_base: int, root: Path, namesrv: list[str]) -> dict[str, dict]:
    """Each container's config: name -> settings (its members' files are in ``root``)."""
    return {
        f"container-{index + 1}": {
            "listen": f"127.0.0.1:{port_base + CONTAINER_PORT_OFFSET + index + 1}",
            "namesrv": namesrv,
            "brokers": [str(root / f"{name}.toml") for name in container_members(index)],
            # add-broker may put a member's store in the data directory, nowhere else
            "store_root": str(root),
        }
        for index in range(len(GROUPS))
    }
