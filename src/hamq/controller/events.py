"""Events: the only way the controller state changes, and what a Raft entry carries.

Each event carries the epochs it was decided against (or will set), so ``apply`` can refuse
one that a concurrent event made stale: all peers refuse the same ones, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ApplyBrokerId:
    """A new member takes ``broker_id`` in its group (creating the group if first)."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    register_check_code: str
    register_time_ms: int


@dataclass(frozen=True)
class RegisterBroker:
    """A known member registers again, maybe from a new address."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    register_time_ms: int


@dataclass(frozen=True)
class ElectMaster:
    """A new master epoch begins; ``new_master_id`` None records that no one could be elected.

    ``unclean`` says the master came from outside the SyncStateSet
    (``enable_elect_unclean_master``), so drivers can warn and count the possible loss.
    """

    cluster_name: str
    broker_name: str
    new_master_id: int | None
    new_master_epoch: int
    unclean: bool


@dataclass(frozen=True)
class AlterSyncStateSet:
    """The current master's new SyncStateSet, fenced by its master epoch and set epoch."""

    cluster_name: str
    broker_name: str
    master_id: int
    master_epoch: int
    new_sync_state_set: frozenset[int]
    new_sync_state_set_epoch: int


@dataclass(frozen=True)
class CleanBrokerData:
    """Forget some members of a group, or the whole group when ``broker_ids`` is empty."""

    cluster_name: str
    broker_name: str
    broker_ids: frozenset[int]


Event = ApplyBrokerId | RegisterBroker | ElectMaster | AlterSyncStateSet | CleanBrokerData
