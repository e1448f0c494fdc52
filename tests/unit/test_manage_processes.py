"""Counting a cluster's broker processes from its registered members (hamq.manage.processes)."""

from __future__ import annotations

from hamq.manage.processes import process_count


def member(address: str, pid: int | None) -> dict:
    return {"address": address, "alive": pid is not None, "pid": pid}


def test_a_containers_members_count_once_and_a_silent_member_as_its_own():
    members = [
        member("127.0.0.1:10911", 100),  # container 1: master of a, slave of b
        member("127.0.0.1:10912", 100),
        member("127.0.0.1:10921", 200),  # container 2
        member("127.0.0.1:10922", 200),
        member("10.0.0.2:10911", 100),  # same pid on another host: another process
        member("127.0.0.1:10931", None),  # killed: no pid to share
    ]
    assert process_count(members) == 4
