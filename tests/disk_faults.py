"""The real disk, watched: ``RecordingDisk`` notes every write, truncation and fsync in the
order the stores make them (so a test can check what was durable before what), and fails
appends with ENOSPC while ``full`` is set, as a file system running out of space does."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

from hamq.store.disk import Buffer, OsDisk, OsFile

Event = tuple[str, str]  # (operation, file name)


class RecordingDisk(OsDisk):
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.full = False

    def open(self, path: Path, create: bool = True, append: bool = False) -> OsFile:
        file = super().open(path, create, append)
        return RecordingFile(self, file.path, file.fd)

    def fsync_dir(self, path: Path) -> None:
        self.events.append(("fsync_dir", Path(path).name))
        super().fsync_dir(path)

    def unlink(self, path: Path) -> None:
        self.events.append(("unlink", Path(path).name))
        super().unlink(path)

    def names(self, operation: str) -> list[str]:
        """File names of the recorded ``operation`` events, in order."""
        return [name for op, name in self.events if op == operation]


class RecordingFile(OsFile):
    __slots__ = ("disk",)

    def __init__(self, disk: RecordingDisk, path: Path, fd: int) -> None:
        super().__init__(path, fd)
        self.disk = disk

    def append(self, pieces: Sequence[Buffer]) -> int:
        if self.disk.full:
            super().append([bytes(pieces[0])[:10]])  # a few bytes reach the file first
            raise OSError(errno.ENOSPC, "No space left on device")
        self.disk.events.append(("append", self.path.name))
        return super().append(pieces)

    def pwrite(self, pieces: Sequence[Buffer], offset: int) -> int:
        self.disk.events.append(("pwrite", self.path.name))
        return super().pwrite(pieces, offset)

    def truncate(self, size: int) -> None:
        self.disk.events.append(("truncate", self.path.name))
        super().truncate(size)

    def fsync(self) -> None:
        self.disk.events.append(("fsync", self.path.name))
        super().fsync()

    def dup(self) -> OsFile:
        return RecordingFile(self.disk, self.path, os.dup(self.fd))
