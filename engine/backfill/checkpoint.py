"""The checkpoint of a backfill job: one small JSON file, replaced atomically.

It says how far the job got, in input lines:

* ``done_line``: every record at or before it is decided, committed and written to the audit
  file, whose length was then ``audit_offset`` bytes;
* ``pending_through``: records in ``(done_line, pending_through]`` may have been sent to the
  gate and committed, but are not known to be. A restart sends exactly that range first, as one
  gate batch (in-process) or one fact at a time (over gRPC), so every fact of it is either all
  replayed (idempotency keys) or all new; a replayed fact never shares a gate batch with a new
  fact that could have depended on it.

Order of writes, so that a kill at any moment leaves a resumable state: the store commits a batch
(one transaction, fsynced by SQLite); then its audit lines are written and flushed; then the
checkpoint is written to a temporary file and renamed over the old one. A restart truncates the
audit file to ``audit_offset`` and replays the pending range.

A killed process loses nothing it wrote (the page cache outlives it), so fsyncs only matter for
a power cut: the audit file, the checkpoint and its directory are fsynced at most every
``sync_every_s`` (default 1 s) and at the end. After a power cut a restart may find an older
checkpoint and replay more batches; that is still exactly once, because the batch size of a job
is fixed by its first run (a resumed in-process job cuts the same batches again, so replays
never mix with new facts).

:class:`JobLock` keeps two processes off one checkpoint (``flock``, released by the kernel
even on ``kill -9``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import IO, Any

from engine.errors import Conflict, InvalidInput
from engine.fsutil import write_atomic

__all__ = ["VERSION", "Checkpoint", "CheckpointWriter", "JobLock", "atomic_write", "load"]

VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """Where a job stands. Lines are the readers' record lines (1-based)."""

    job: str
    """The input's fingerprint (first 64 KiB), which also names its idempotency keys."""
    input: str
    """Absolute path of the input."""
    destination: str
    """``local:<data dir>`` or ``grpc:<host:port>``."""
    policy: str
    fields: dict[str, str | None]
    audit: str
    """Path of the audit file."""
    batch: int
    """Facts per gate batch when this was written (informational)."""
    head: str = ""
    """Fingerprint of the input when last run (differs from ``job`` after --resume-changed)."""
    done_line: int = 0
    audit_offset: int = 0
    pending_through: int | None = None
    rows: int = 0
    """Records done (decided or reported bad)."""
    finished: bool = False
    version: int = VERSION
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"


def load(path: Path) -> Checkpoint | None:
    """The checkpoint at ``path``; None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        raw = json.loads(text)
        if raw.get("version") != VERSION:
            raise ValueError(f"version {raw.get('version')!r}")
        known = {f.name for f in fields(Checkpoint)}
        return Checkpoint(**{k: v for k, v in raw.items() if k in known})
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidInput(
            f"checkpoint {path} cannot be read ({exc}); remove it to start the job over"
        ) from None


def atomic_write(path: Path, text: str, *, durable: bool = True) -> None:
    """tmp -> fsync -> rename -> fsync(dir) (:func:`engine.fsutil.write_atomic`): the file is the
    old or the new one, never torn. ``durable=False`` skips both fsyncs: still atomic for a
    killed process, not for a power cut (which may then find the previous checkpoint)."""
    write_atomic(path, text, durable=durable, mode=0o644)


class CheckpointWriter:
    """The one writer of a job's checkpoint; thread-safe (the gRPC path reserves ranges from the
    request thread while the main thread records what is done)."""

    def __init__(self, path: Path, state: Checkpoint, *, enabled: bool = True) -> None:
        self.path = path
        self._state = state
        self._lock = threading.Lock()
        self._enabled = enabled

    @property
    def state(self) -> Checkpoint:
        return self._state

    def save(self, durable: bool = True, **changes: Any) -> Checkpoint:
        with self._lock:
            return self._save(changes, durable)

    def close(self) -> None:
        """No write after this one returns (a request thread that outlives its job)."""
        with self._lock:
            self._enabled = False

    def reserve(self, through: int) -> None:
        """Records up to line ``through`` may be sent from now on."""
        with self._lock:
            if through > (self._state.pending_through or 0):
                self._save({"pending_through": through}, durable=True)

    def _save(self, changes: dict[str, Any], durable: bool) -> Checkpoint:
        self._state = replace(self._state, **changes, updated_at=time.time())
        if self._enabled:
            atomic_write(self.path, self._state.to_json(), durable=durable)
        return self._state


class JobLock:
    """An exclusive ``flock`` on ``<checkpoint>.lock`` for the life of the job."""

    def __init__(self, checkpoint: Path) -> None:
        self.path = checkpoint.with_name(checkpoint.name + ".lock")
        self._file: IO[str] | None = None

    def __enter__(self) -> JobLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no protection, as before
            return self
        self._file = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            self._file = None
            raise Conflict(
                f"another backfill holds {self.path}: wait for it, or give this one another "
                "--checkpoint"
            ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()  # closing releases the lock
            self._file = None
