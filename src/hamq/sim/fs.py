"""A simulated file system for the stores: written and fsynced bytes kept apart.

It implements ``hamq.store.disk.Disk``, so the production commit log, consume queues, Raft
log and state files run on it unchanged. Two faults differ the way they do on a real
machine:
- ``kill()`` — the process dies: open handles are gone, the page cache (everything written)
  survives;
- ``power_loss(rng)`` — the machine dies: each file keeps what was fsynced plus a random
  prefix of its later writes, the last one possibly torn, chosen independently per file (so
  writes persist out of order across files); directory entries (created, removed, renamed
  files) survive only if their directory was fsynced after the change. Directories
  themselves are never lost (the stores create them once, at start); a removed directory
  comes back with the files a power loss kept in it unless its parent was fsynced after.
``crash_after(steps)`` kills the process in the middle of whatever the store is doing:
the write, truncation, fsync, creation, removal or rename that many steps on does not
happen and raises ``ProcessCrash``, as does every later one until ``kill()`` or
``power_loss()`` (a test of every step of a roll, a cut or a checkpoint).
One more fault, ``fail_fsync(path)``: that file's next fsync fails with EIO and, as on
Linux, the writes it should have made durable never will be (the kernel marks their pages
clean), though reads still see them until the next power loss.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hamq.store.disk import Buffer

DEFAULT_CAPACITY_BYTES = 1 << 40


class ProcessCrash(Exception):
    """The simulated process died at this step (see ``SimDisk.crash_after``)."""


@dataclass(slots=True)
class _Inode:
    data: bytearray = field(default_factory=bytearray)  # the page cache: what reads see
    durable: bytes = b""  # what a power loss keeps for sure
    # writes since the last fsync, in order: ("w", offset, bytes) or ("t", size)
    unsynced: list[tuple] = field(default_factory=list)
    mtime: float = 0.0
    dropped: bool = False  # a failed fsync lost writes: reads and durable bytes differ

    def write(self, offset: int, data: bytes) -> None:
        if offset > len(self.data):
            self.data.extend(bytes(offset - len(self.data)))
        self.data[offset : offset + len(data)] = data
        self.unsynced.append(("w", offset, data))

    def truncate(self, size: int) -> None:
        if size <= len(self.data):
            del self.data[size:]
        else:
            self.data.extend(bytes(size - len(self.data)))
        self.unsynced.append(("t", size))

    def fsync(self) -> None:
        self.durable = (
            bytes(self.data) if not self.dropped else bytes(self._replay(len(self.unsynced)).data)
        )
        self.unsynced.clear()

    def fsync_failed(self) -> None:
        """EIO: the writes waiting for this fsync are never written back."""
        self.dropped = True
        self.unsynced.clear()

    def _replay(self, kept: int) -> _Inode:
        """The durable bytes with the first ``kept`` unsynced writes made on them."""
        replay = _Inode(bytearray(self.durable))
        for op in self.unsynced[:kept]:
            if op[0] == "w":
                replay.write(op[1], op[2])
            else:
                replay.truncate(op[1])
        return replay

    def lose_unsynced(self, rng: random.Random) -> None:
        kept = rng.randrange(len(self.unsynced) + 1)
        replay = self._replay(kept)
        if kept < len(self.unsynced) and self.unsynced[kept][0] == "w" and rng.random() < 0.5:
            _, offset, data = self.unsynced[kept]
            replay.write(offset, data[: rng.randrange(len(data) + 1)])  # a torn write
        self.data = replay.data
        self.durable = bytes(self.data)
        self.unsynced.clear()
        self.dropped = False  # the page cache is gone: what reads see is what is durable


class SimFile:
    """One handle; like a descriptor, useless once closed (or once its process died)."""

    __slots__ = ("_append", "_closed", "_disk", "_inode", "path")

    def __init__(self, disk: SimDisk, path: Path, inode: _Inode, append: bool) -> None:
        self.path = path
        self._disk = disk
        self._inode = inode
        self._append = append
        self._closed = False

    def _live(self) -> _Inode:
        if self._closed or id(self) not in self._disk.open_handles:
            raise OSError(errno.EBADF, f"bad file descriptor for {self.path}")
        return self._inode

    def size(self) -> int:
        return len(self._live().data)

    def mtime(self) -> float:
        return self._live().mtime

    def append(self, pieces: Sequence[Buffer]) -> int:
        inode = self._live()
        return self._write(inode, pieces, len(inode.data))

    def pwrite(self, pieces: Sequence[Buffer], offset: int) -> int:
        inode = self._live()
        assert not self._append, "pwrite on an O_APPEND file appends on Linux"
        return self._write(inode, pieces, offset)

    def _write(self, inode: _Inode, pieces: Sequence[Buffer], offset: int) -> int:
        self._disk.step()
        data = b"".join(bytes(p) for p in pieces)
        grow = max(0, offset + len(data) - len(inode.data))
        self._disk.reserve(grow)
        inode.write(offset, data)
        inode.mtime = self._disk.clock()
        return len(data)

    def pread(self, size: int, offset: int) -> bytes:
        return bytes(self._live().data[offset : offset + size])

    def pread_into(self, into: memoryview, offset: int) -> int:
        chunk = self._live().data[offset : offset + len(into)]
        into[: len(chunk)] = chunk
        return len(chunk)

    def truncate(self, size: int) -> None:
        inode = self._live()
        self._disk.step()
        self._disk.reserve(max(0, size - len(inode.data)))
        inode.truncate(size)

    def fsync(self) -> None:
        inode = self._live()
        self._disk.step()
        if _key(self.path) in self._disk.failing_fsyncs:
            self._disk.failing_fsyncs.discard(_key(self.path))
            inode.fsync_failed()
            raise OSError(errno.EIO, f"Input/output error (simulated) syncing {self.path}")
        inode.fsync()

    def dup(self) -> SimFile:
        self._live()
        return self._disk.handle(self.path, self._inode, self._append)

    def close(self) -> None:
        self._live()
        self._closed = True
        self._disk.forget(self)


class SimDisk:
    """The files of one simulated machine."""

    def __init__(
        self, clock: Callable[[], float] = lambda: 0.0, capacity_bytes: int = DEFAULT_CAPACITY_BYTES
    ) -> None:
        self.clock = clock
        self.capacity_bytes = capacity_bytes
        self.names: dict[str, _Inode] = {}  # the page cache's directory entries
        self.durable_names: dict[str, _Inode] = {}  # those a power loss keeps
        self.dirs: set[str] = {"/"}
        # ids of the handles the current process holds (a dead process's handles are not)
        self.open_handles: set[int] = set()
        self.failing_fsyncs: set[str] = set()  # files whose next fsync fails (EIO)
        self.removed_dirs: set[str] = set()  # removed, their parent not fsynced since
        self.steps_to_crash: int | None = None  # see crash_after

    # -- handles ------------------------------------------------------------------------
    def handle(self, path: Path, inode: _Inode, append: bool) -> SimFile:
        file = SimFile(self, path, inode, append)
        self.open_handles.add(id(file))
        return file

    def forget(self, file: SimFile) -> None:
        self.open_handles.discard(id(file))

    def reserve(self, grow: int) -> None:
        # counting is O(files): done only when a seed gave this disk a small capacity
        if (
            grow
            and self.capacity_bytes < DEFAULT_CAPACITY_BYTES
            and self.used_bytes() + grow > self.capacity_bytes
        ):
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")

    def used_bytes(self) -> int:
        return sum(len(inode.data) for inode in self._inodes())

    def _inodes(self) -> list[_Inode]:
        return list({id(i): i for i in self.names.values()}.values())

    # -- faults -------------------------------------------------------------------------
    def kill(self) -> None:
        """The process died: its handles are gone; the page cache stays."""
        self.open_handles.clear()
        self.steps_to_crash = None

    def crash_after(self, steps: int) -> None:
        """The process dies at the ``steps``-th change to the disk from now (0: the next)."""
        self.steps_to_crash = steps

    def step(self) -> None:
        """One change to the disk is about to happen, unless the process dies first."""
        if self.steps_to_crash is None:
            return
        if self.steps_to_crash <= 0:
            raise ProcessCrash("simulated process crash")
        self.steps_to_crash -= 1

    def fail_fsync(self, path: Path) -> None:
        """The next fsync of ``path`` fails with EIO (see the module docstring)."""
        self.failing_fsyncs.add(_key(path))

    def power_loss(self, rng: random.Random) -> None:
        """The machine died: only fsynced data and fsynced directory entries are sure to
        survive; of the rest, each file keeps a random prefix of its writes."""
        self.kill()
        self.names = dict(self.durable_names)
        for name in self.names:  # an unsynced removal of their directory is undone
            self.mkdir(Path(_parent(name)))
        self.removed_dirs.clear()
        for inode in self._inodes():
            inode.lose_unsynced(rng)

    # -- the Disk interface ---------------------------------------------------------------
    def open(self, path: Path, create: bool = True, append: bool = False) -> SimFile:
        key = _key(path)
        inode = self.names.get(key)
        if inode is None:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "No such file", str(path))
            if _parent(key) not in self.dirs:
                raise FileNotFoundError(errno.ENOENT, "No such directory", str(path))
            self.step()
            inode = self.names[key] = _Inode(mtime=self.clock())
        return self.handle(Path(path), inode, append)

    def exists(self, path: Path) -> bool:
        key = _key(path)
        return key in self.names or key in self.dirs

    def listdir(self, path: Path) -> list[str]:
        prefix = _key(path).rstrip("/") + "/"
        return sorted(
            {
                name[len(prefix) :]
                for name in (*self.names, *self.dirs)
                if name.startswith(prefix) and "/" not in name[len(prefix) :] and name != prefix
            }
        )

    def is_dir(self, path: Path) -> bool:
        return _key(path) in self.dirs

    def mkdir(self, path: Path) -> None:
        key = _key(path)
        while key not in self.dirs:
            self.dirs.add(key)
            key = _parent(key)

    def unlink(self, path: Path) -> None:
        self.step()
        if self.names.pop(_key(path), None) is None:
            raise FileNotFoundError(errno.ENOENT, "No such file", str(path))

    def rmtree(self, path: Path) -> None:
        self.step()
        prefix = _key(path).rstrip("/") + "/"
        for name in [n for n in self.names if n.startswith(prefix)]:
            del self.names[name]
        if _key(path) in self.dirs:
            self.removed_dirs.add(_key(path))
        self.dirs = {d for d in self.dirs if not (d + "/").startswith(prefix)}

    def replace(self, src: Path, dst: Path) -> None:
        self.step()
        inode = self.names.pop(_key(src), None)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "No such file", str(src))
        self.names[_key(dst)] = inode

    def fsync_dir(self, path: Path) -> None:
        self.step()
        directory = _key(path)
        for name in [n for n in self.durable_names if _parent(n) == directory]:
            if name not in self.names:
                del self.durable_names[name]
        # subdirectories removed since: their removal, with every file in them, is durable
        removed = [d for d in self.removed_dirs if _parent(d) == directory]
        for gone in removed:
            self.removed_dirs.discard(gone)
            for name in [
                n
                for n in self.durable_names
                if n.startswith(gone + "/") and self.durable_names[n] is not self.names.get(n)
            ]:
                del self.durable_names[name]
        for name, inode in self.names.items():
            if _parent(name) == directory:
                self.durable_names[name] = inode

    def read_bytes(self, path: Path) -> bytes:
        inode = self.names.get(_key(path))
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "No such file", str(path))
        return bytes(inode.data)

    def mtime(self, path: Path) -> float:
        inode = self.names.get(_key(path))
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "No such file", str(path))
        return inode.mtime

    def usage(self, path: Path) -> tuple[int, int]:
        return self.capacity_bytes, self.capacity_bytes - self.used_bytes()


def _key(path: Path | str) -> str:
    return "/" + str(path).strip("/")


def _parent(key: str) -> str:
    return key.rsplit("/", 1)[0] or "/"
