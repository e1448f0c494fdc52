"""Typed errors of the Raft core: bad input from the caller, or a damaged log on disk.

Invariant violations inside the core are `assert`s, not these classes: they are bugs,
while these are conditions a caller can provoke and handle. A bad `RaftConfig` raises
`hamq.errors.ConfigError`, the one configuration error of the code base.
"""


class RaftError(Exception):
    """Base class of every error the Raft package raises on purpose."""


class NotLeaderError(RaftError):
    """A proposal or a leadership transfer reached a member that is not the leader."""

    def __init__(self, leader_id: int | None) -> None:
        super().__init__(f"not the leader (leader is {leader_id})")
        self.leader_id = leader_id


class TransferInProgressError(RaftError):
    """Proposals are refused while leadership moves, so the target can catch up."""


class UnknownPeerError(RaftError):
    """A member id that is not part of the configured group."""


class LogIndexError(RaftError):
    """An index outside the stored log, or an append that would leave a gap."""


class CorruptLogError(RaftError):
    """A stored record fails its CRC somewhere other than the torn tail."""


class MessageDecodeError(RaftError):
    """Bytes that do not decode to a Raft message."""
