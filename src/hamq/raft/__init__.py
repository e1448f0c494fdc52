"""Sans-IO Raft with DLedger's replication states (EntryDispatcher, EntryHandler,
QuorumAckChecker), plus the log storage its drivers persist into."""

from hamq.errors import ConfigError
from hamq.raft.config import RaftConfig
from hamq.raft.errors import (
    CorruptLogError,
    LogIndexError,
    MessageDecodeError,
    NotLeaderError,
    RaftError,
    TransferInProgressError,
    UnknownPeerError,
)
from hamq.raft.file_storage import FileStorage
from hamq.raft.log import EMPTY_INDEX, Checkpoint, Entry, EntryId, HardState
from hamq.raft.messages import Message, MessageType, ResponseCode
from hamq.raft.node import RawNode, Rng, Role
from hamq.raft.quorum import QuorumAckChecker, quorum_index
from hamq.raft.ready import FailedProposal, FailureReason, Ready
from hamq.raft.storage import LogStorage, MemoryStorage

__all__ = [
    "EMPTY_INDEX",
    "Checkpoint",
    "ConfigError",
    "CorruptLogError",
    "Entry",
    "EntryId",
    "FailedProposal",
    "FailureReason",
    "FileStorage",
    "HardState",
    "LogIndexError",
    "LogStorage",
    "MemoryStorage",
    "Message",
    "MessageDecodeError",
    "MessageType",
    "NotLeaderError",
    "QuorumAckChecker",
    "RaftConfig",
    "RaftError",
    "RawNode",
    "Ready",
    "ResponseCode",
    "Rng",
    "Role",
    "TransferInProgressError",
    "UnknownPeerError",
    "quorum_index",
]
