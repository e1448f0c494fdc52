"""Typed refusals of the controller, with RocketMQ's response codes so operators and clients
can match them against RocketMQ's documentation."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ControllerCode(IntEnum):
    """RocketMQ's ``ResponseCode.CONTROLLER_*`` values."""

    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    # this peer is not the Raft leader, or stopped leading before the request was applied
    CONTROLLER_NOT_LEADER = 2007
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
    CONTROLLER_BROKER_ID_INVALID = 2014


@dataclass(frozen=True)
class ControllerError:
    """A request the controller refuses: no event is proposed, nothing changes."""

    code: ControllerCode
    remark: str


class ControllerCodecError(ValueError):
    """Bytes that are not a valid event or snapshot (a corrupt or hostile Raft entry)."""


class ControllerRecoveryError(Exception):
    """A peer's files contradict each other (a snapshot past the Raft log it came from):
    starting would serve a state the other peers may not have."""
