"""A controller-mode member's broker id on disk: RocketMQ 5's ``TempBrokerMetadata`` and
``BrokerMetadata`` folded into one file with a state.

The id comes from the controller (GET_NEXT_BROKER_ID, then APPLY_BROKER_ID with a random
register check code that proves a later apply of the same id is this member's). The file
is written with ``atomic_write`` *before* the apply ("applying"), and marked "applied" once
the controller granted it: a crash between the two leaves an id and code that a retry
applies again (the controller grants the same id to the same code), so a member never
takes two ids. A restart reuses the id; a file of another group is refused.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from hamq.errors import HamqError
from hamq.store.disk import OS_DISK, Disk, atomic_write

FILE_NAME = "broker_metadata.json"
APPLYING = "applying"
APPLIED = "applied"


class BrokerMetadataError(HamqError):
    """The broker id on disk cannot be used: damaged, of another group, or taken."""


class BrokerIdTaken(BrokerMetadataError):
    """The controller gave the id on disk to another member (this one was cleaned away)."""


@dataclass(frozen=True)
class BrokerMetadata:
    cluster_name: str
    broker_name: str
    broker_id: int
    register_check_code: str
    state: str  # APPLYING or APPLIED

    @property
    def applied(self) -> bool:
        return self.state == APPLIED


def new_register_check_code() -> str:
    return secrets.token_hex(16)


class BrokerMetadataFile:
    """The one broker-metadata file of a store directory."""

    def __init__(self, store_dir: str | Path, disk: Disk = OS_DISK) -> None:
        self.path = Path(store_dir) / FILE_NAME
        self._disk = disk

    def load(self, cluster_name: str, broker_name: str) -> BrokerMetadata | None:
        """The saved id of this group, None if there is none; ``BrokerMetadataError`` for a
        damaged file or one written for another group (taking its id would steal a
        member of that group)."""
        if not self._disk.exists(self.path):
            return None
        try:
            fields = json.loads(self._disk.read_bytes(self.path))
            meta = BrokerMetadata(**fields)
            if not isinstance(meta.broker_id, int) or meta.state not in (APPLYING, APPLIED):
                raise ValueError("bad broker_id or state")
        except (ValueError, TypeError) as err:
            raise BrokerMetadataError(
                f"{self.path} is not a valid broker metadata file ({err}); remove it to "
                "let the controller assign this member a new broker id"
            ) from None
        if (meta.cluster_name, meta.broker_name) != (cluster_name, broker_name):
            raise BrokerMetadataError(
                f"{self.path} holds broker id {meta.broker_id} of group "
                f"{meta.cluster_name}/{meta.broker_name}, but this broker is configured as "
                f"{cluster_name}/{broker_name}: use that group's store_dir, or remove the "
                "file to join this group under a new id"
            )
        return meta

    def save(self, meta: BrokerMetadata) -> None:
        atomic_write(self._disk, self.path, json.dumps(asdict(meta)).encode())

    def remove(self) -> None:
        """Forget an id that was never granted (the controller gave it to another member)."""
        self._disk.unlink(self.path)
        self._disk.fsync_dir(self.path.parent)
