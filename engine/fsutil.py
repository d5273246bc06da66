"""Atomic, durable file replacement: the one helper every writer of state files uses.

``write_atomic``: a unique temporary file in the target's directory, written in full, fsynced,
renamed over the target, then the directory fsynced. After a ``kill -9`` or a power cut at any
moment the target is the old file or the new one, never a mix or a prefix. Used by the index
snapshots (:mod:`engine.index.snapshot`) and the backfill checkpoint
(:mod:`engine.backfill.checkpoint`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["fsync_dir", "write_atomic"]


def write_atomic(
    path: Path,
    data: bytes | str,
    *,
    durable: bool = True,
    tmp_suffix: str = ".tmp",
    mode: int = 0o600,
) -> None:
    """Replace ``path`` by ``data`` (a ``str`` is written as UTF-8) atomically.

    ``durable=False`` skips both fsyncs: still atomic for a killed process (the page cache
    outlives it), not for a power cut, which may then find the previous file.
    ``tmp_suffix``: how the temporary file's name ends, so a directory's owner can sweep what a
    crashed writer left. ``mode``: permissions of the new file (before the umask)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{tmp_suffix}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable (a no-op where directories cannot be
    opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
