"""Crash-safe small-file writes: write a temporary file, fsync it, rename, fsync the directory."""
from __future__ import annotations

import os
import threading
from pathlib import Path


def atomic_write(path: str | Path, data: bytes) -> None:
    path = Path(path)
    # Unique per writer: a checkpoint thread and a shutdown may write the same file at once.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
