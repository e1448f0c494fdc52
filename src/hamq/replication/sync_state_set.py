"""The master's view of its SyncStateSet in controller mode (seed 001), sans-IO: which
members may be elected after it, how far all of them hold the log (the confirm offset),
and when to ask the controller to expand or shrink the set.

The controller owns the set; the master proposes changes and learns the outcome
(``apply``). Two sets matter here: the one the controller applied, and the one the master
proposed and is waiting on. The controller may apply a proposal before the master hears
back, so a proposed member may already be electable: until the answer comes, the master
counts the union of both (the *effective* set) for the confirm offset and for all-ack. A
superset is always safe: it only makes sends wait longer and reads see less. A shrink
therefore takes effect only once applied, and an expand at once.

The seed's rules, per slave (RocketMQ ``HAConnection`` / ``AutoSwitchHAService``):

- each transfer records the master's max offset and the time (``lastMasterMaxOffset``,
  ``lastTransferTimeMs``); an ack at or past that offset means the slave had caught up at
  that time (``lastCaughtUpTimeMs``);
- expand: a connected slave outside the set joins once its ack offset reaches the confirm
  offset. It is checked on every ack, as RocketMQ's ``maybeExpandInSyncStateSet`` does,
  because under a steady stream of sends the two are equal only between writes;
- shrink: a member leaves when it is disconnected or ``now - lastCaughtUpTimeMs`` exceeds
  ``ha_max_time_slave_not_catchup_ms``. Leaving at the disconnect (the seed waits out the
  timeout) chooses availability over keeping the set: all-ack sends stop waiting for a
  member that cannot ack. It is safe because a shrink counts only once the controller
  applied it, so the member stays electable and counted until then.

Synchronised gating (seed 003, mirrored-queue policies): a slave also reports where its
log starts. Once the master has told the set its group's *need offset*
(``set_need_offset``, see ``replication/need_offset.py``), a slave joins only if its log
starts at or below it, and a member leaves when the need offset drops below its log start
(a new consumer group, an offset reset): so the set holds exactly the synchronised
members, and an election from it never promotes a mirror that lacks messages a consumer
still needs. Before the first need offset (master–slave mode, the simulator's plain
worlds) nothing is gated.

Time comes in as ``now_ms``; nothing here touches a socket, a clock or a file.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SlaveCatchUp:
    """One slave's progress as the set rules read it (kept by broker id, across sessions:
    a member's last ack still bounds what it holds while it reconnects)."""

    ack_offset: int
    last_caught_up_ms: int
    connected: bool
    last_transfer_max_offset: int = 0  # the master's max offset at the last transfer
    last_transfer_ms: int = 0
    log_start: int = 0  # the slave's commit-log min offset, as it last reported it


class SyncStateSet:
    def __init__(self, master_id: int, max_time_not_catchup_ms: int, floor: int = 0) -> None:
        """``floor``: what every member is known to hold before it attaches in this epoch
        (the confirm offset this member knew as a slave: the whole old set held it)."""
        self.master_id = master_id
        self.floor = floor
        self.max_time_not_catchup_ms = max_time_not_catchup_ms
        self.applied: frozenset[int] = frozenset({master_id})
        self.epoch = 0  # the sync-state-set epoch of ``applied``
        # What the master proposed since the last apply (the union of its proposals: an
        # earlier one may be the one the controller applies).
        self.proposed: frozenset[int] = frozenset()
        self.slaves: dict[int, SlaveCatchUp] = {}
        self._effective = self.applied
        self.need_offset: int | None = None  # None: not known yet, nothing gated

    def set_need_offset(self, offset: int) -> None:
        """The master computed its group's need offset (every check period)."""
        self.need_offset = offset

    def holds_needed(self, broker_id: int) -> bool:
        """Whether the member's log starts at or below the need offset (the master does)."""
        slave = self.slaves.get(broker_id)
        if broker_id == self.master_id or self.need_offset is None:
            return True
        return slave is not None and slave.log_start <= self.need_offset

    @property
    def effective(self) -> frozenset[int]:
        """The members counted for the confirm offset and all-ack: applied ∪ proposed."""
        return self._effective

    # -- what the controller decided ---------------------------------------------------------
    def apply(self, ids: frozenset[int], epoch: int) -> bool:
        """The controller applied ``ids`` at sync-state-set ``epoch``. False (nothing
        changes) for an epoch older than the one held: a late answer to an older alter.

        Only a newer epoch answers the proposals: each was sent with the epoch held when
        it was made, so the controller applied it as this epoch or refused it. The epoch
        held, announced again (a poll, a repeated notification), answers none: a proposal
        may be at the controller right now, and its members go on counting."""
        if epoch < self.epoch:
            return False
        if self.master_id not in ids:
            raise ValueError(
                f"sync state set {sorted(ids)} does not contain its master {self.master_id}"
            )
        if epoch > self.epoch:
            self.proposed = frozenset()
        self.applied, self.epoch = frozenset(ids), epoch
        self._effective = self.applied | self.proposed
        return True

    def refused(self) -> None:
        """The controller refused the proposal sent with the held epoch for a reason other
        than a stale epoch (a member not alive, unknown, no change): it is still at this
        epoch, so it applied none of the proposals, and they stop counting. (A proposal
        whose answer was lost keeps counting: the controller may have applied it.)"""
        self.proposed = frozenset()
        self._effective = self.applied

    # -- slave progress ----------------------------------------------------------------------
    def on_connect(self, broker_id: int, ack_offset: int, now_ms: int, log_start: int = 0) -> None:
        """A slave attached; ``ack_offset`` is where its log agrees with ours,
        ``log_start`` where its log starts after the attach."""
        slave = self.slaves.get(broker_id)
        if slave is None:
            self.slaves[broker_id] = SlaveCatchUp(ack_offset, now_ms, True, log_start=log_start)
        else:
            # A cut during its handshake can take its log below its last ack.
            slave.ack_offset, slave.connected = ack_offset, True
            slave.log_start = log_start

    def on_disconnect(self, broker_id: int) -> None:
        slave = self.slaves.get(broker_id)
        if slave is not None:
            slave.connected = False

    def on_transfer(self, broker_id: int, master_max_offset: int, now_ms: int) -> None:
        slave = self.slaves.get(broker_id)
        if slave is not None:
            slave.last_transfer_max_offset, slave.last_transfer_ms = master_max_offset, now_ms

    def on_ack(self, broker_id: int, ack_offset: int, log_start: int | None = None) -> None:
        """A slave acked ``ack_offset`` (as far as it was shipped); ``log_start``: where its
        log starts now (retention there moves it), None when the ack does not say."""
        slave = self.slaves.get(broker_id)
        if slave is None:
            return
        slave.ack_offset = max(slave.ack_offset, ack_offset)
        if log_start is not None:
            slave.log_start = log_start
        if slave.ack_offset >= slave.last_transfer_max_offset:
            slave.last_caught_up_ms = max(slave.last_caught_up_ms, slave.last_transfer_ms)

    def maybe_expand(self, broker_id: int, master_max_offset: int) -> bool:
        """After an ack: True when the slave has just joined the effective set (its ack
        reached the confirm offset); propose the new set to the controller."""
        slave = self.slaves.get(broker_id)
        if (
            slave is None
            or broker_id in self._effective
            or not slave.connected
            or slave.ack_offset < self.confirm_offset(master_max_offset)
            or not self.holds_needed(broker_id)
        ):
            return False
        self._propose(self._effective | {broker_id})
        return True

    # -- decisions ---------------------------------------------------------------------------
    def confirm_offset(self, master_max_offset: int) -> int:
        """The offset every member of the effective set holds: the least ack offset, the
        master counting its own max offset. A member that never attached holds nothing
        we know of beyond the floor."""
        least = self.min_member_ack()
        return master_max_offset if least is None else min(master_max_offset, least)

    def min_member_ack(self) -> int | None:
        """The least ack offset among the effective set's slaves (all-ack: a send ending
        at or below it is held by every member); None when the master is alone in it."""
        acks = [
            self.slaves[m].ack_offset if m in self.slaves else self.floor
            for m in self._effective
            if m != self.master_id
        ]
        return min(acks) if acks else None

    def change(self, now_ms: int, master_max_offset: int) -> frozenset[int] | None:
        """The set to propose to the controller now, or None when the applied one stands:
        members out of sync (disconnected, or not caught up for too long) leave, connected
        slaves whose ack reached the confirm offset join; gated on the need offset, a
        member whose log starts above it leaves and a slave joins only below it. A join
        counts at once (the effective set grows); a leave only once applied."""
        confirm = self.confirm_offset(master_max_offset)
        wanted = {self.master_id}
        for broker_id in self._effective | self.slaves.keys():
            slave = self.slaves.get(broker_id)
            if broker_id == self.master_id or slave is None or not slave.connected:
                continue  # a disconnected member leaves at once (module docstring: why)
            if slave.ack_offset >= master_max_offset:
                # holds everything now: an idle master ships nothing, and its last
                # transfer's time must not make a slave that has it all look behind
                slave.last_caught_up_ms = max(slave.last_caught_up_ms, now_ms)
            if not self.holds_needed(broker_id):
                continue
            if broker_id in self._effective:
                if now_ms - slave.last_caught_up_ms <= self.max_time_not_catchup_ms:
                    wanted.add(broker_id)
            elif slave.ack_offset >= confirm:
                wanted.add(broker_id)
        proposal = frozenset(wanted)
        if proposal == self.applied:
            return None
        self._propose(proposal)
        return proposal

    def _propose(self, proposal: frozenset[int]) -> None:
        self.proposed |= proposal
        self._effective = self.applied | self.proposed
