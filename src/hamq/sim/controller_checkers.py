"""Safety checkers for controller mode (seed 001, DESIGN §5), fed by the simulator as things
happen and at the end; each raises ``InvariantViolation``.

- one master per epoch: every acknowledged send names the epoch its master acknowledged it
  in; two members acknowledging in one epoch, or a member acknowledging in an epoch the
  controller never gave it, is a split brain;
- no acknowledged send lost: after healing, the final master serves every send
  acknowledged under ``all_ack_in_sync_state_set`` where its answer said, byte for byte;
- no read truncated: every message a consumer read (it reads only up to the confirm
  offset) is still there on the final master, with the same body, and no queue offset was
  ever read with two bodies;
- after healing every member's log equals the master's over their common range, and every
  controller peer holds the same state;
- synchronised (seed 003): every member of the SyncStateSet the controller applied holds
  every record from the master's need offset on (its log starts at or below it), so an
  election from the set never promotes a mirror lacking what a consumer still needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hamq.controller.codec import encode_snapshot
from hamq.controller.state import ControllerState
from hamq.sim.replica_checkers import (
    AckedMessage,
    InvariantViolation,
    check_readable,
    check_same_bytes,
)
from hamq.store.message_store import MessageStore


class ControllerModeCheckers:
    def __init__(self) -> None:
        self.elected: dict[int, int | None] = {}  # master epoch -> the member elected in it
        self.acking_master: dict[int, int] = {}  # master epoch -> the member that acked in it
        self.acked: list[AckedMessage] = []
        self.read: dict[tuple[int, int], AckedMessage] = {}  # (queue, queue offset) -> read

    def on_elected(self, epoch: int, master_id: int | None) -> None:
        """An ElectMaster event applied on some controller peer (they all agree)."""
        known = self.elected.setdefault(epoch, master_id)
        if known != master_id:
            raise InvariantViolation(
                f"controller peers applied different masters for epoch {epoch}: "
                f"{known} and {master_id}"
            )

    def on_ack(self, epoch: int, member_id: int, message: AckedMessage) -> None:
        if self.elected.get(epoch, member_id) != member_id:
            raise InvariantViolation(
                f"member {member_id} acknowledged a send in epoch {epoch}, whose master "
                f"is {self.elected.get(epoch)}"
            )
        other = self.acking_master.setdefault(epoch, member_id)
        if other != member_id:
            raise InvariantViolation(
                f"two masters acknowledged sends in epoch {epoch}: {other} and {member_id}"
            )
        self.acked.append(message)

    def on_read(self, message: AckedMessage) -> None:
        key = (message.queue_id, message.queue_offset)
        seen = self.read.setdefault(key, message)
        if seen.body != message.body:
            raise InvariantViolation(
                f"queue {message.queue_id} offset {message.queue_offset} was read with two "
                f"bodies ({seen.body[:12]!r}... then {message.body[:12]!r}...)"
            )

    def check_synchronised(self, need_offset: int, log_starts: Mapping[int, int]) -> None:
        """``log_starts``: where the log of each running member of the applied
        SyncStateSet starts."""
        for member_id, start in sorted(log_starts.items()):
            if start > need_offset:
                raise InvariantViolation(
                    f"member {member_id} is in the SyncStateSet but its log starts at "
                    f"{start}, above the need offset {need_offset}: it lacks records a "
                    "consumer still needs"
                )

    def check_final(
        self, master: MessageStore, members: Mapping[int, MessageStore], master_id: int
    ) -> None:
        """After healing: acknowledged sends and reads are on the final master, and every
        member's log agrees with it over their common range."""
        check_readable(master, self.acked)
        try:
            check_readable(master, list(self.read.values()))
        except InvariantViolation as err:
            raise InvariantViolation(f"a message a consumer read was truncated: {err}") from None
        for member_id, store in members.items():
            if member_id != master_id:
                check_same_bytes(master, store, member_id, 0)


def check_same_controller_state(states: Iterable[tuple[int, ControllerState]]) -> None:
    """Every controller peer applied the same events: equal states encode to equal bytes."""
    encoded = {peer: encode_snapshot(state) for peer, state in states}
    if len(set(encoded.values())) > 1:
        raise InvariantViolation(
            "controller peers hold different states after healing: "
            + ", ".join(f"peer {p}: {len(b)} bytes" for p, b in sorted(encoded.items()))
        )
