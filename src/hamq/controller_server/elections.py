"""Accounting of the elections the controller leader applied: counted for the metrics and
logged, loudly when unclean (``enable_elect_unclean_master`` or a policy's
``ha-promote-on-*`` = always: the new master came from outside the SyncStateSet and may
lack acknowledged messages; the event says how much of the old master's log it lacks)."""

from __future__ import annotations

import logging

from hamq.controller.core import GroupChanged
from hamq.controller.events import ElectMaster

log = logging.getLogger(__name__)


class ElectionStats:
    def __init__(self) -> None:
        self.elections = 0
        self.unclean_elections = 0
        self.failed_elections = 0  # nobody could be master: the old epoch was ended only
        # commit-log bytes the old masters had past their unclean successors' ends
        self.unclean_lost_bytes = 0

    def record(self, change: GroupChanged) -> None:
        event = change.event
        if not isinstance(event, ElectMaster):
            return
        self.elections += 1
        group = f"{event.cluster_name}/{event.broker_name}"
        if event.new_master_id is None:
            self.failed_elections += 1
            log.warning(
                "group %s has no master in epoch %d: no alive member of its SyncStateSet",
                group,
                event.new_master_epoch,
            )
        elif event.unclean:
            self.unclean_elections += 1
            lost = event.lost_bytes
            self.unclean_lost_bytes += lost or 0
            log.warning(
                "UNCLEAN election: member %d is master of group %s in epoch %d although it "
                "was not in the SyncStateSet; messages acknowledged by the old master may be "
                "lost (enable_elect_unclean_master or the policy's ha-promote-on-*): %s",
                event.new_master_id,
                group,
                event.new_master_epoch,
                "how much is unknown (a report is missing)"
                if lost is None
                else f"commit log {event.new_master_max_offset}..{event.old_master_max_offset}"
                f" ({lost} bytes) of the old master is not on the new one",
            )
        else:
            log.info(
                "member %d elected master of group %s in epoch %d",
                event.new_master_id,
                group,
                event.new_master_epoch,
            )
