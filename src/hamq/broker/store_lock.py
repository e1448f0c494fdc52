"""One broker per store directory (RocketMQ's ``lock`` file of the store root).

Two brokers started on one store directory would both recover and append to one commit
log; in controller mode the second would also read the first's broker metadata, so the
controller would grant it the same broker id, and both would serve as master when that
id is elected. The broker holds an exclusive ``flock`` on ``<store_dir>/lock`` from before
its store opens until it stops; the kernel drops it when the process dies (``kill -9``
included), so a restart never finds a stale lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from hamq.errors import ConfigError

FILE_NAME = "lock"


class StoreDirLock:
    def __init__(self, store_dir: str | Path) -> None:
        root = Path(store_dir)
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / FILE_NAME
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip()
            self.release()
            raise ConfigError(
                f"store_dir {root} is in use by another broker (pid {holder or 'unknown'}); "
                "every broker needs a store_dir of its own"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)  # who holds it, for that message

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
