"""Disk faults for the chaos suite's test hosts: a slow fsync, a full disk, a corrupted byte
and a power loss, on the real file system under real processes.

The processes of a host run with an ``LD_PRELOAD`` shim (``fsync_shim.c``, compiled on first
use) that wraps ``fsync``/``fdatasync`` — sleeping first while the host's disk is slow —
and records, by inode, the size each regular file had when an fsync of it succeeded, and
the size each ``ftruncate`` left it at (``hosts/<host>/shim/fsync.log``).

The power-loss model. ``power_loss`` is called once the host's processes are SIGKILLed (so
nothing writes any more) and cuts every file under the host's directory to what fsyncs made
durable: replaying the log in order, an fsync raises a file's durable size to the size
recorded, a truncation lowers it; a file never fsynced ends empty. Inodes, not names: an
fsynced temporary file renamed over its target (``store.disk.atomic_write``) keeps its
content under its new name. This covers how hamq writes: the commit-log segments and
consume-queue files (``store/commitlog.py``, ``store/consume_queue.py``) and the Raft /
DLedger log segments (``raft/file_storage.py``) are append-only and fsynced, so an
unfsynced tail is exactly what a power loss may take; the checkpoint, metadata tables,
epoch file and Raft hard state and checkpoint (``store/message_store.py``,
``store/metadata.py``, ``store/epoch_file.py``, ``raft/file_storage.py``) are written with
``atomic_write``, whose temporary file is fsynced before the rename, so they keep the old or
the new content. Its limits, each erring towards keeping data: bytes overwritten in place
and not fsynced keep their new value (hamq overwrites only in files it then fsyncs); a
directory entry (a file created, renamed or removed) stays as it is even if its directory
was never fsynced — a file created and never fsynced is kept, empty; an inode number reused
by a new file after the old one was deleted inherits the old file's durable size until the
new one is fsynced or truncated. Files directly in the host's directory (its processes'
logs, the faketime file) and the shim's directory are the runner's, not the host's disk,
and are left alone.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import os
import random
import shutil
import stat
import subprocess
from importlib import resources
from pathlib import Path

from hamq.chaos.clock_faults import LIBFAKETIME, ClockFaults
from hamq.errors import CrcMismatch
from hamq.protocol.message import check_record_payload, message_bounds, parse_record_header
from hamq.store.commitlog import SEGMENT_NAME_DIGITS

SHIM_SOURCE = "fsync_shim.c"
SHIM_DIR = "shim"  # in the host's directory: the shim's control files and its log
FSYNC_LOG = "fsync.log"
SLOW_MS_FILE = "slow_ms"
DATA_DIR = "data"  # in the host's directory: where its processes keep their stores
BALLAST_FILE = ".hamq-ballast"
_BALLAST_CHUNK = 1 << 20
_COMPILE_TIMEOUT_S = 120
_MOUNT_TIMEOUT_S = 30


class ShimBuildError(RuntimeError):
    """The fsync shim could not be compiled (no C compiler, or it failed)."""


class NoClosedSegment(ValueError):
    """A store has no closed commit-log segment holding a record to corrupt (yet)."""


def shim_library() -> Path:
    """The compiled shim, built on first use into the user's cache directory under a name
    holding the source's hash (a changed source is rebuilt, never mistaken for the old)."""
    source = resources.files("hamq.chaos").joinpath(SHIM_SOURCE).read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hamq"
    library = cache / f"fsync_shim-{digest}.so"
    if library.exists():
        return library
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise ShimBuildError(
            "no C compiler (cc) to build the disk-fault shim: install gcc (apt-get install gcc)"
        )
    cache.mkdir(parents=True, exist_ok=True)
    # built under a name of its own and renamed: parallel test workers may build at once
    stem = f"{library.name}.{os.getpid()}"
    src, out = cache / f"{stem}.c", cache / f"{stem}.so"
    src.write_bytes(source)
    try:
        done = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(src), "-ldl"],
            capture_output=True,
            text=True,
            timeout=_COMPILE_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise ShimBuildError(f"compiling the disk-fault shim failed:\n{done.stderr}")
        os.replace(out, library)
    finally:
        src.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    return library


def durable_sizes(fsync_log: Path) -> dict[tuple[int, int], int]:
    """(st_dev, st_ino) -> the size fsyncs made durable, from the shim's log (see the
    module docstring); files absent never had a successful fsync."""
    sizes: dict[tuple[int, int], int] = {}
    try:
        text = fsync_log.read_text()
    except FileNotFoundError:
        return sizes
    # each line is one write(); one without its newline was cut short (a full disk)
    for line in text.split("\n")[:-1]:
        key, _, size = line.partition("\t")
        dev, _, ino = key.partition(":")
        inode = (int(dev), int(ino))
        if size.startswith("T"):
            sizes[inode] = min(sizes.get(inode, 0), int(size[1:]))
        else:
            sizes[inode] = max(sizes.get(inode, 0), int(size))
    return sizes


def drop_unfsynced(root: Path, fsync_log: Path, keep: Path) -> dict[str, int]:
    """Cut every regular file under ``root``'s subdirectories (but not under ``keep``) to
    its durable size; returns counts of files seen and truncated and of bytes dropped."""
    durable = durable_sizes(fsync_log)
    files = truncated = dropped = 0
    for directory, dirs, names in os.walk(root):
        here = Path(directory)
        if here == keep:
            dirs.clear()
            continue
        if here == root:
            continue  # the runner's files: processes' logs, the faketime file
        for name in names:
            path = here / name
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                continue
            files += 1
            size = min(st.st_size, durable.get((st.st_dev, st.st_ino), 0))
            if size < st.st_size:
                os.truncate(path, size)
                truncated += 1
                dropped += st.st_size - size
    return {"files": files, "truncated": truncated, "bytes_dropped": dropped}


def corrupt_segment(store_dir: Path, rng: random.Random) -> str:
    """Flip one byte of a message body inside a record of a closed commit-log segment (any
    but the newest of its log) of the store in ``store_dir`` — or, for a mirrored node, of
    one of the stores it holds (``<store_dir>/<group>/commitlog``): the record's payload CRC
    no longer matches, its header still parses. Returns "file@offset" (offset within the
    file). ``NoClosedSegment`` when no closed segment holds a record. Every mode keeps its
    messages in such a log (a DLedger member applies its Raft log's entries to it); the
    Raft log itself (``dledger/``, 64 MiB segments: rarely a closed one in a run) is not a
    target."""
    store_dir = Path(store_dir)
    logs = [store_dir / "commitlog"] if (store_dir / "commitlog").is_dir() else []
    logs = logs or sorted(store_dir.glob("*/commitlog"))
    closed = [path for log in logs for path in _segments(log)[:-1]]
    rng.shuffle(closed)
    for path in closed:
        bodies = _body_spans(path.read_bytes())
        if bodies:
            start, end = rng.choice(bodies)
            offset = rng.randrange(start, end)
            with open(path, "r+b") as f:
                f.seek(offset)
                byte = f.read(1)[0]
                f.seek(offset)
                f.write(bytes([byte ^ rng.randint(1, 255)]))
            return f"{path}@{offset}"
    raise NoClosedSegment(
        f"no closed commit-log segment with an intact message in {store_dir} "
        f"(commit logs: {', '.join(str(log) for log in logs) or 'none'}; "
        f"the newest segment of each is still being written)"
    )


def _segments(log: Path) -> list[Path]:
    return sorted(
        log / name
        for name in os.listdir(log)
        if name.isdigit() and len(name) == SEGMENT_NAME_DIGITS
    )


def _body_spans(data: bytes) -> list[tuple[int, int]]:
    """[start, end) of every non-empty message body in a segment's intact records (a
    record an earlier corruption damaged is skipped: each corruption damages one more)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while pos < len(data):
        try:
            header = parse_record_header(data, pos)
        except CrcMismatch:
            break  # a torn tail
        end = pos + header.total_size
        if end > len(data):
            break
        try:
            check_record_payload(data, pos, header)
        except CrcMismatch:
            pos = end  # damaged already
            continue
        mpos = pos + header.payload_start
        for _ in range(header.count):
            _, body_start, mpos = message_bounds(data, mpos, end)
            if mpos > body_start:
                spans.append((body_start, mpos))
        pos = end
    return spans


class DiskFaults:
    """The disk faults of one run: per host a shim directory and a data directory (a tmpfs
    when its size is given), under ``<run_dir>/hosts/<host>``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.clock = ClockFaults(self.run_dir)
        self._mounts: dict[str, Path] = {}  # host -> tmpfs mount point

    def host_dir(self, host: str) -> Path:
        return self.run_dir / "hosts" / host

    def shim_dir(self, host: str) -> Path:
        path = self.host_dir(host) / SHIM_DIR
        path.mkdir(parents=True, exist_ok=True)
        return path

    def env(self, host: str, shim: bool = True, clock: bool = False) -> dict[str, str]:
        """Environment for a process of ``host``: the fsync shim and/or libfaketime preloaded,
        with their control variables. libfaketime always comes with the shim before it
        (inert without ``HAMQ_SHIM_DIR``): its ``clock_nanosleep`` keeps ``time.sleep``
        working under libfaketime."""
        env: dict[str, str] = {}
        if shim:
            env["HAMQ_SHIM_DIR"] = str(self.shim_dir(host))
        if clock:
            env.update(self.clock.env(host))
        if shim or clock:
            env["LD_PRELOAD"] = " ".join(
                [str(shim_library()), *([str(LIBFAKETIME)] if clock else [])]
            )
        return env

    def data_dir(self, host: str, tmpfs_mib: int | None = None) -> Path:
        """The directory for ``host``'s stores; with ``tmpfs_mib``, a tmpfs of that size is
        mounted there (once), so ``fill`` can fill it without touching the real disk."""
        path = self.host_dir(host) / DATA_DIR
        path.mkdir(parents=True, exist_ok=True)
        if tmpfs_mib is not None and host not in self._mounts:
            if tmpfs_mib <= 0:
                raise ValueError(f"a tmpfs needs a positive size, not {tmpfs_mib} MiB")
            _run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_mib}m", "tmpfs", str(path)])
            if not self._mounts:
                atexit.register(self.close)
            self._mounts[host] = path
        return path

    def slow_disk(self, host: str, fsync_ms: int) -> None:
        """Every fsync of ``host``'s processes sleeps ``fsync_ms`` first, from their next call."""
        if fsync_ms < 0:
            raise ValueError(f"fsync delay must be >= 0 ms, not {fsync_ms}")
        path = self.shim_dir(host) / SLOW_MS_FILE
        tmp = path.with_name(f"{SLOW_MS_FILE}.tmp")
        tmp.write_text(str(fsync_ms))
        os.replace(tmp, path)  # the shim never reads half a number

    def fast_disk(self, host: str) -> None:
        (self.shim_dir(host) / SLOW_MS_FILE).unlink(missing_ok=True)

    def fill(self, host: str) -> None:
        """Write a ballast file on ``host``'s tmpfs until the file system is full."""
        mount = self._mounts.get(host)
        if mount is None:
            raise ValueError(f"{host} has no tmpfs data dir to fill: data_dir(host, tmpfs_mib)")
        total, _, _ = shutil.disk_usage(mount)
        chunk = b"\0" * _BALLAST_CHUNK
        fd = os.open(mount / BALLAST_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for _ in range(total // _BALLAST_CHUNK + 2):  # bounded: the disk's size and a bit
                try:
                    os.write(fd, chunk)
                except OSError as err:
                    if err.errno == errno.ENOSPC:
                        return
                    raise
        finally:
            os.close(fd)
        raise OSError(f"{mount} took {total} bytes of ballast and is still not full")

    def free(self, host: str) -> None:
        mount = self._mounts.get(host)
        if mount is not None:
            (mount / BALLAST_FILE).unlink(missing_ok=True)

    def corrupt(self, store_dir: Path, rng: random.Random) -> str:
        return corrupt_segment(store_dir, rng)

    def power_loss(self, host_dir: Path) -> dict[str, int]:
        """Drop what ``host_dir``'s disk never fsynced (the module docstring's model); call
        with the host's processes already SIGKILLed."""
        host_dir = Path(host_dir)
        shim = host_dir / SHIM_DIR
        if not (shim / FSYNC_LOG).exists():
            # the shim creates the log as a process starts: no log means no shim, and
            # cutting every file to 0 would model a disk that never kept anything
            raise FileNotFoundError(
                f"no {FSYNC_LOG} in {shim}: {host_dir.name}'s processes did not run under "
                "the fsync shim (DiskFaults.env), so what they fsynced is unknown"
            )
        return drop_unfsynced(host_dir, shim / FSYNC_LOG, shim)

    def close(self) -> None:
        """Unmount every tmpfs this run mounted (idempotent; the processes using them must
        be stopped first, or the unmount is lazy and the memory freed when they exit)."""
        while self._mounts:
            _, path = self._mounts.popitem()
            if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                _run(["umount", "-l", str(path)])


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_MOUNT_TIMEOUT_S)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
