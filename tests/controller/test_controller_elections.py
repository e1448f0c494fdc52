"""Election accounting: every applied election counted, an unclean one loudly."""

from __future__ import annotations

import logging

from hamq.controller.core import GroupChanged
from hamq.controller.events import AlterSyncStateSet, ElectMaster
from hamq.controller_server.elections import ElectionStats

KEY = ("DefaultCluster", "broker-a")


def _elect(master_id: int | None, unclean: bool) -> GroupChanged:
    return GroupChanged(KEY, ElectMaster(*KEY, master_id, 2, unclean), None)


def test_unclean_and_failed_elections_are_counted_and_warned(caplog):
    stats = ElectionStats()
    with caplog.at_level(logging.INFO, logger="hamq.controller_server.elections"):
        stats.record(_elect(2, unclean=False))
        stats.record(_elect(3, unclean=True))
        stats.record(_elect(None, unclean=False))
        stats.record(GroupChanged(KEY, AlterSyncStateSet(*KEY, 2, 2, frozenset({2}), 3), None))
    assert (stats.elections, stats.unclean_elections, stats.failed_elections) == (3, 1, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("UNCLEAN election: member 3 is master of group")
    assert "has no master in epoch 2" in warnings[1]
