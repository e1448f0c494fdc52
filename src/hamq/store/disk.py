"""The file-system calls the stores make, behind one small interface.

Production uses ``OS_DISK`` (plain ``os`` calls on descriptors); the simulator passes a
``hamq.sim.fs.SimDisk`` that keeps written and fsynced bytes apart and can lose what was
never fsynced (power loss) or keep it (a killed process). Only what the commit log, the
consume queues, the Raft log and the small state files need is here: the interface is the
contract the simulator must honour, so it stays narrow.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

Buffer = bytes | bytearray | memoryview


class DiskFile(Protocol):
    """One open file. Writes reach the page cache; ``fsync`` makes them durable."""

    path: Path

    def size(self) -> int: ...

    def mtime(self) -> float:
        """The file's mtime, by handle: cheaper than ``Disk.mtime`` by path (no lookup)."""

    def append(self, pieces: Sequence[Buffer]) -> int:
        """Write ``pieces`` at the end of a file opened with ``append=True`` (one
        ``writev``); returns bytes written."""

    def pwrite(self, pieces: Sequence[Buffer], offset: int) -> int:
        """Write ``pieces`` at ``offset`` (one ``pwritev``); returns bytes written."""

    def pread(self, size: int, offset: int) -> bytes: ...

    def pread_into(self, into: memoryview, offset: int) -> int:
        """Fill ``into`` from ``offset``; returns the bytes read (short at end of file)."""

    def truncate(self, size: int) -> None: ...

    def fsync(self) -> None: ...

    def dup(self) -> DiskFile:
        """A second handle on the same file: another thread may fsync it after this one
        is closed (a truncation) without touching a reused descriptor."""

    def close(self) -> None: ...


class Disk(Protocol):
    def open(self, path: Path, create: bool = True, append: bool = False) -> DiskFile:
        """Open read-write (``FileNotFoundError`` when missing and not ``create``).
        ``append``: every ``append`` call writes at the end (O_APPEND); such a file takes
        no ``pwrite`` (Linux would append those too)."""

    def exists(self, path: Path) -> bool: ...

    def listdir(self, path: Path) -> list[str]:
        """Names in a directory, sorted; [] when it does not exist."""

    def is_dir(self, path: Path) -> bool: ...

    def mkdir(self, path: Path) -> None:
        """Create a directory and its parents (no error if it exists)."""

    def unlink(self, path: Path) -> None: ...

    def rmtree(self, path: Path) -> None:
        """Remove a directory and everything in it (no error if it is gone)."""

    def replace(self, src: Path, dst: Path) -> None: ...

    def fsync_dir(self, path: Path) -> None:
        """Make the directory's entries (created, removed, renamed files) durable."""

    def read_bytes(self, path: Path) -> bytes: ...

    def mtime(self, path: Path) -> float: ...

    def usage(self, path: Path) -> tuple[int, int]:
        """(total, free) bytes of the file system holding ``path``."""


class OsFile:
    __slots__ = ("fd", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def mtime(self) -> float:
        return os.fstat(self.fd).st_mtime

    def append(self, pieces: Sequence[Buffer]) -> int:
        return os.writev(self.fd, pieces)

    def pwrite(self, pieces: Sequence[Buffer], offset: int) -> int:
        return os.pwritev(self.fd, pieces, offset)

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def pread_into(self, into: memoryview, offset: int) -> int:
        return os.preadv(self.fd, [into], offset)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def fsync(self) -> None:
        os.fdatasync(self.fd)

    def dup(self) -> OsFile:
        return OsFile(self.path, os.dup(self.fd))

    def close(self) -> None:
        os.close(self.fd)


class OsDisk:
    """The real file system."""

    def open(self, path: Path, create: bool = True, append: bool = False) -> OsFile:
        flags = os.O_RDWR | (os.O_CREAT if create else 0) | (os.O_APPEND if append else 0)
        return OsFile(Path(path), os.open(path, flags, 0o644))

    def exists(self, path: Path) -> bool:
        return os.path.exists(path)

    def listdir(self, path: Path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def is_dir(self, path: Path) -> bool:
        return os.path.isdir(path)

    def mkdir(self, path: Path) -> None:
        os.makedirs(path, exist_ok=True)

    def unlink(self, path: Path) -> None:
        os.unlink(path)

    def rmtree(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_bytes(self, path: Path) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def mtime(self, path: Path) -> float:
        return os.stat(path).st_mtime

    def usage(self, path: Path) -> tuple[int, int]:
        usage = shutil.disk_usage(path)
        return usage.total, usage.free


OS_DISK: Disk = OsDisk()

# What to do after a failed fsync, for its error message: a restart in the same boot would
# read back, and recovery accept, writes the page cache kept but the disk never got.
AFTER_FAILED_FSYNC = (
    "restart only after a reboot or after dropping the page cache "
    "(echo 1 > /proc/sys/vm/drop_caches)"
)


def write_all(file: DiskFile, pieces: Sequence[Buffer], offset: int | None = None) -> int:
    """Write every byte of ``pieces`` (at the end, or at ``offset``), finishing short
    writes; returns the size written. ENOSPC and other errors raise ``OSError``."""
    total = 0
    iov_max = 1024  # Linux's IOV_MAX: pieces one writev may take
    for first in range(0, len(pieces), iov_max):
        chunk = list(pieces[first : first + iov_max])
        size = sum(map(len, chunk))
        written = file.append(chunk) if offset is None else file.pwrite(chunk, offset + total)
        if written != size:
            rest = b"".join(chunk)[written:]
            while rest:
                n = (
                    file.append([rest])
                    if offset is None
                    else file.pwrite([rest], offset + total + size - len(rest))
                )
                if n <= 0:
                    raise OSError(f"no progress writing {file.path}")
                rest = rest[n:]
        total += size
    return total


def atomic_write(disk: Disk, path: Path, data: bytes) -> None:
    """Crash-safe small-file write: a temporary file, fsync, rename, fsync the directory —
    a crash leaves the old or the new content, never half of one."""
    path = Path(path)
    # Unique per writer: a checkpoint thread and a shutdown may write the same file at once.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    file = disk.open(tmp)
    try:
        file.truncate(0)
        write_all(file, [data], 0)
        file.fsync()
    finally:
        file.close()
    disk.replace(tmp, path)
    disk.fsync_dir(path.parent)
