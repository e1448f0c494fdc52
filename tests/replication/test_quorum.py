"""The seed's needAckNums computation, driven by the table in ``need_ack_nums.txt``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hamq.replication.quorum import QuorumConfig, decide

TABLE = Path(__file__).with_name("need_ack_nums.txt")


def _rows():
    for lineno, line in enumerate(TABLE.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        config, state, expected = (part.split() for part in line.split("|"))
        yield pytest.param(config, state, expected, id=f"line{lineno}:{' '.join(expected[3:])}")


@pytest.mark.parametrize("config,state,expected", list(_rows()))
def test_need_ack_nums(config, state, expected):
    total, in_sync, minimum, auto = config
    quorum = QuorumConfig(int(total), int(in_sync), int(minimum), auto == "true")
    decision = decide(quorum, int(state[0]), int(state[1]))
    outcome = "refused" if not decision.enough else ("wait" if decision.wait_for_slaves else "ok")
    assert (decision.need_ack_nums, decision.in_sync_replicas, outcome) == (
        int(expected[0]),
        int(expected[1]),
        expected[2],
    )


def test_table_covers_every_outcome():
    outcomes = {p.values[2][2] for p in _rows()}
    assert outcomes == {"ok", "wait", "refused"}
