"""What brokers, admins and the controller's own heartbeat scan ask of the state machine."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class ApplyBrokerIdRequest:
    """A new member asks for ``broker_id`` (RocketMQ's ``ApplyBrokerIdRequestHeader``)."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    register_check_code: str


@dataclass(frozen=True)
class RegisterBrokerRequest:
    """A member with an id registers (at start, or from a new address). Moving the id to
    another address needs the register check code its id was applied with, which only that
    member holds; "" (none) can only confirm the recorded address."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    register_check_code: str = ""


class ElectTrigger(Enum):
    """Why an election runs: it decides what ``broker_id`` means and what a failure does."""

    # A member registered and found no master; its id is taken only on the group's first election.
    REGISTER = "register"
    # ``hamq admin elect-master``: ``broker_id`` is the preferred member, None for any.
    ADMIN = "admin"
    # The controller saw the master's heartbeat time out; a failure still ends its epoch.
    MASTER_TIMEOUT = "master_timeout"
    # The master itself, restarted: it may have lost an unflushed tail its SyncStateSet
    # holds, so it never continues its epoch; ``broker_id`` is the requester (who must be
    # the master) and ``master_epoch`` the epoch it asks to end (a retry is fenced).
    MASTER_RESTART = "restart"


@dataclass(frozen=True)
class ElectMasterRequest:
    """An election; ``broker_id`` (and ``master_epoch``) are read according to ``trigger``."""

    cluster_name: str
    broker_name: str
    trigger: ElectTrigger
    broker_id: int | None = None
    master_epoch: int | None = None


@dataclass(frozen=True)
class AlterSyncStateSetRequest:
    """A master's new SyncStateSet with the epochs it believes current (the fencing tokens)."""

    cluster_name: str
    broker_name: str
    master_id: int
    master_epoch: int
    new_sync_state_set: frozenset[int]
    sync_state_set_epoch: int


@dataclass(frozen=True)
class CleanBrokerDataRequest:
    """Forget dead members (``hamq admin clean-broker-metadata``); no ids = the whole group."""

    cluster_name: str
    broker_name: str
    broker_ids: frozenset[int] = frozenset()
    clean_living_broker: bool = False


@dataclass(frozen=True)
class BrokerHeartbeat:
    """A member's report to every controller peer (also what a registration says about its
    log): soft state that only decides liveness and elections, never replicated."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    epoch: int
    max_offset: int
    confirm_offset: int = 0


@dataclass(frozen=True)
class BrokerShutdown:
    """A member stopping cleanly (SIGTERM) at the master epoch it knows: if it is the
    master of that epoch, its group's next election follows the policy's
    ``ha-promote-on-shutdown`` instead of ``ha-promote-on-failure``. Soft state."""

    cluster_name: str
    broker_name: str
    broker_id: int
    epoch: int
