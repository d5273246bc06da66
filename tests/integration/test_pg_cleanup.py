"""The tests' throwaway PostgreSQL server (tests/_pg.py) does not outlive its run: a run killed
with SIGKILL leaves its server behind and the next cluster reaps it, a SIGTERM stops it on the
way out. Real servers (Debian's initdb + pg_ctl), each owned by a child Python process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pg import SKIP_REASON, _comm, _started, find_bin, reap_stale

TESTS = Path(__file__).resolve().parents[1]
OWNER = (
    "import sys, time; sys.path.insert(0, {tests!r}); from _pg import PgCluster, find_bin; "
    "c = PgCluster(find_bin()); print(c.root, flush=True)\n"
    "for _ in range(300):\n"
    "    try:\n"
    "        time.sleep(1)\n"
    "    except BaseException:\n"  # what pytest does with a SystemExit inside a test
    "        pass\n"
)

pytestmark = pytest.mark.skipif(find_bin() is None, reason=SKIP_REASON)


@pytest.fixture
def tmp() -> Iterator[Path]:
    # Short: the server's unix socket lives in the cluster's directory (a 107-byte limit).
    path = Path(tempfile.mkdtemp(prefix="pgc-"))
    if os.geteuid() == 0:
        path.chmod(0o755)  # the server's user must reach its directory inside
    yield path
    reap_stale(path)
    shutil.rmtree(path, ignore_errors=True)


def _owner(tmp: Path) -> tuple[subprocess.Popen[str], Path, int]:
    """A child process holding a started cluster under ``tmp``: (process, root, postmaster)."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER.format(tests=str(TESTS))],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    root = Path(proc.stdout.readline().strip())
    assert root.parent == tmp, root
    postmaster = int((root / "data" / "postmaster.pid").read_text().split()[0])
    assert _comm(postmaster) == "postgres"
    return proc, root, postmaster


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()


def _gone(pid: int, tries: int = 300) -> bool:
    for _ in range(tries):
        if _started(pid) is None:
            return True
        time.sleep(0.1)
    return False


def test_a_killed_runs_server_is_reaped_by_the_next_start(tmp: Path) -> None:
    proc, root, postmaster = _owner(tmp)
    try:
        assert reap_stale(tmp) == []  # its owner is alive: left alone
        proc.kill()
        proc.wait(30)
        time.sleep(0.5)
        assert _comm(postmaster) == "postgres"  # pg_ctl detached it: the kill left it running
        assert reap_stale(tmp) == [root]
        assert _gone(postmaster) and not root.exists()
    finally:
        _end(proc)


def test_sigterm_stops_the_server_on_the_way_out(tmp: Path) -> None:
    proc, root, postmaster = _owner(tmp)
    try:
        proc.send_signal(signal.SIGTERM)
        # The owner swallows every exception, as pytest does: SIGTERM must still end it, by
        # the signal itself, after its server is stopped.
        assert proc.wait(90) == -signal.SIGTERM
        assert _gone(postmaster) and not root.exists()
    finally:
        _end(proc)
