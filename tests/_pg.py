"""A throwaway PostgreSQL cluster for the tests: Debian's ``initdb`` + ``pg_ctl``, a free port,
127.0.0.1 only, a temporary directory, torn down at the end.

PostgreSQL refuses to run as root, and CI runs as root: then the cluster runs as an
unprivileged system user (``memgate-pg``, created with ``useradd`` when missing) through
``runuser``. Without PostgreSQL binaries :func:`find_bin` returns None and the callers skip
with a message that says how to get them (``.ci/run`` installs Debian's ``postgresql``).

A killed run (``kill -9`` of pytest, a CI timeout) cannot stop its server, which ``pg_ctl``
detached: each cluster writes its owner process into ``<root>/owner.json``, and a new cluster
first stops and removes those whose owner is gone (:func:`reap_stale`). A normal exit, or
SIGTERM, stops the server through ``atexit``.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

__all__ = ["PgCluster", "find_bin", "free_port", "pg_cluster", "pg_dsn", "reap_stale"]

USER = "memgate-pg"
SKIP_REASON = (
    "no PostgreSQL binaries (initdb, pg_ctl): install Debian's `postgresql` package "
    "(`make system-deps`) to run the PostgreSQL store tests"
)


def find_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (newest major version first)."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    which = shutil.which("pg_ctl")
    if which:
        candidates.append(Path(os.path.realpath(which)).parent)
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sbin(tool: str) -> str:
    """``tool`` from PATH, or from the sbin folders a user's PATH may lack (``runuser`` and
    ``useradd`` live in /usr/sbin)."""
    found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    return found or tool


def _ensure_user() -> None:
    try:
        subprocess.run(["id", "-u", USER], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        subprocess.run(
            [
                _sbin("useradd"),
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ],
            check=True,
            capture_output=True,
        )


def _started(pid: int) -> str | None:
    """When process ``pid`` started (its ``/proc`` start time), None when there is none: a
    pid and its start time name one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def reap_stale(tmp: Path | None = None) -> list[Path]:
    """Stop (immediate shutdown) and remove the clusters whose owner process is gone."""
    reaped = []
    for owner in Path(tmp or tempfile.gettempdir()).glob("memgate-pg-*/owner.json"):
        try:
            info = json.loads(owner.read_text())
            alive = _started(int(info["pid"])) == info["started"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # another user's, or being written
        if alive:
            continue
        root = owner.parent
        try:
            postmaster = int((root / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            postmaster = 0
        if postmaster and _comm(postmaster) == "postgres":
            os.kill(postmaster, signal.SIGQUIT)  # immediate shutdown
            for _ in range(300):
                if _started(postmaster) is None:
                    break
                time.sleep(0.1)
        shutil.rmtree(root, ignore_errors=True)
        reaped.append(root)
    return reaped


_LIVE: set[PgCluster] = set()
"""Clusters of this process not closed yet (what a SIGTERM stops before the process ends)."""


def _exit(signum: int, frame: object) -> None:
    """Stop this process's servers, then end as the signal's default action would.

    Raising SystemExit here instead would be caught as one failing test by a pytest run, which
    then carries on: SIGTERM must still end the run."""
    for cluster in list(_LIVE):
        try:
            cluster.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _exit_on_sigterm() -> None:
    """SIGTERM (while it has its default action) first stops this process's servers, then
    ends the process as before (see :func:`_exit`)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit)


class PgCluster:
    """One PostgreSQL server on 127.0.0.1:``port``, its data in a temporary directory.

    ``dsn(db)`` names a database of it (user ``memgate``, password ``secret-pw``: the tests
    check that the password never appears in errors or logs). ``stop()`` / ``start()`` take the
    server away and bring it back on the same port (database-outage tests)."""

    password = "secret-pw"
    user = "memgate"

    def __init__(self, bindir: Path, *, fsync: bool = True) -> None:
        reap_stale()
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="memgate-pg-"))
        me = os.getpid()
        (self.root / "owner.json").write_text(json.dumps({"pid": me, "started": _started(me)}))
        self._closed = False
        atexit.register(self.close)
        _LIVE.add(self)
        _exit_on_sigterm()
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            _ensure_user()
            shutil.chown(self.root, USER, USER)
        self.root.chmod(0o700)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self._as_root:
            shutil.chown(pwfile, USER, USER)
        self._run(
            [
                "initdb",
                "-D",
                str(self.data),
                "-U",
                self.user,
                "--pwfile",
                str(pwfile),
                "-A",
                "scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-instructions",
            ]
        )
        pwfile.unlink()
        conf = self.data / "postgresql.conf"
        with conf.open("a") as f:
            f.write(
                "\nlisten_addresses = '127.0.0.1'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\n"
                "max_connections = 200\n"
                "shared_buffers = 64MB\n"
                f"fsync = {'on' if fsync else 'off'}\n"
                "log_min_messages = warning\n"
            )
        self.start()

    def _run(self, argv: Sequence[str], timeout: float = 120) -> None:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if self._as_root:
            cmd = [_sbin("runuser"), "-u", USER, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")

    def start(self) -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"])

    def stop(self, mode: str = "fast") -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def dsn(self, db: str = "postgres") -> str:
        return (
            f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{db}?connect_timeout=5"
        )

    def create_database(self, name: str) -> str:
        """A fresh database ``name``; returns its DSN."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` even if connections remain (best effort: the cluster is temporary)."""
        import psycopg

        try:
            with psycopg.connect(self.dsn(), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error:
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        _LIVE.discard(self)
        deadline = time.monotonic() + 60
        try:
            self.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        while time.monotonic() < deadline and (self.data / "postmaster.pid").exists():
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)


# -- pytest fixtures (imported by tests/conftest.py) ---------------------------------------

_databases = itertools.count()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One throwaway PostgreSQL server for the session; skips when there are no binaries."""
    bindir = find_bin()
    if bindir is None:
        pytest.skip(SKIP_REASON)
    cluster = PgCluster(bindir)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def pg_dsn(pg_cluster: PgCluster) -> Iterator[str]:
    """The DSN of a fresh, empty database on the session's server, dropped afterwards."""
    name = f"t{os.getpid()}_{next(_databases)}"
    yield pg_cluster.create_database(name)
    pg_cluster.drop_database(name)
