"""Where artefacts live in the cache, and how they get there without ever being half-written.

``<cache_dir>/models/<name>/<variant>/`` holds one artefact. A build writes into a sibling
``<variant>.tmp-XXXX`` directory and renames it into place only once its manifest verifies, so a
crash leaves either the old artefact or the new one, never a mix. One build at a time holds
``<cache_dir>/models/.build.lock``.

Names and variants are single plain path segments (no ``/``, no ``..``, not absolute), and an
artefact directory must resolve inside ``<cache_dir>/models``: a link that leads out of the cache
is refused before anything under it is listed or opened.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.errors import InvalidInput, ModelError

__all__ = [
    "DEFAULT_CACHE_DIR",
    "HOME_ENV",
    "MODELS_DIR",
    "artefact_dir",
    "build_lock",
    "check_name",
    "default_cache_dir",
    "inside_cache",
    "iter_artefacts",
    "model_dir",
    "staging",
]

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "memgate"
"""The model cache when nothing else is said (``memgate`` adds ``$MEMGATE_HOME`` on top)."""
HOME_ENV = "MEMGATE_HOME"


def default_cache_dir() -> Path:
    """``$MEMGATE_HOME`` when set, else ``~/.cache/memgate``: the one model-cache default.

    Read at the edges only: the CLI's flag defaults and the adapters' ``.local()`` factories;
    everything else takes the directory it is given."""
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser() if home else DEFAULT_CACHE_DIR


MODELS_DIR = "models"
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SCRATCH = (".tmp-", ".old-", ".work-")


def _segment(value: str, what: str) -> str:
    if not _SEGMENT.match(value) or any(mark in value for mark in _SCRATCH):
        raise InvalidInput(f"{what} must be a plain name ([A-Za-z0-9._-]), got {value!r}")
    return value


def check_name(value: str, what: str) -> str:
    """``value`` if it is a plain name (one path segment of ``[A-Za-z0-9._-]``), else
    ``InvalidInput`` naming ``what``."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    return _segment(value, what)


def model_dir(cache_dir: Path, name: str) -> Path:
    """``<cache_dir>/models/<name>``: the variants of one model."""
    return Path(cache_dir) / MODELS_DIR / check_name(name, "model name")


def artefact_dir(cache_dir: Path, name: str, variant: str) -> Path:
    """``<cache_dir>/models/<name>/<variant>``: one artefact (model.onnx, tokenizer, manifest)."""
    return model_dir(cache_dir, name) / check_name(variant, "variant")


def inside_cache(cache_dir: Path, path: Path) -> Path:
    """``path``, after checking that it resolves inside ``<cache_dir>/models`` (links are
    followed: one that leads out of the cache is a ``ModelError``)."""
    root = (Path(cache_dir) / MODELS_DIR).resolve()
    resolved = Path(path).resolve()
    if resolved != root and root not in resolved.parents:
        raise ModelError(f"{path} resolves to {resolved}, outside the model cache {root}")
    return Path(path)


def iter_artefacts(cache_dir: Path) -> Iterator[Path]:
    """Every artefact directory under ``cache_dir`` (scratch directories left out), sorted."""
    root = Path(cache_dir) / MODELS_DIR
    if not root.is_dir():
        return
    for name in sorted(p for p in root.iterdir() if p.is_dir() and _SEGMENT.match(p.name)):
        for variant in sorted(name.iterdir()):
            if variant.is_dir() and not any(mark in variant.name for mark in _SCRATCH):
                yield variant


def _fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def staging(final: Path) -> Iterator[Path]:
    """Yield an empty scratch directory next to ``final``; on success it replaces ``final``.

    On any exception the scratch directory is removed and ``final`` is left as it was.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; an artefact is readable like any cache entry
    try:
        yield tmp
        _fsync_tree(tmp)
        old = None
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{final.name}.old-", dir=final.parent))
            old.rmdir()
            final.rename(old)
        tmp.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def build_lock(cache_dir: Path) -> Iterator[None]:
    """Hold the cache's build lock; a second concurrent build fails at once instead of racing."""
    root = Path(cache_dir) / MODELS_DIR
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".build.lock").open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ModelError(f"another model build holds {root / '.build.lock'}") from exc
        try:
            # Scratch directories of builds that died are ours to clear once we hold the lock.
            for scratch in root.glob("*/*"):
                if scratch.is_dir() and any(mark in scratch.name for mark in _SCRATCH):
                    shutil.rmtree(scratch, ignore_errors=True)
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
