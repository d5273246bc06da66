"""Ray backfill under kills: one deciding actor SIGKILLed mid-job, and the driver
(``memgate backfill --engine ray`` in a subprocess, joined to this test's Ray cluster) SIGKILLed
once and run again. Every row must be decided exactly once, as a single-process backfill
decides it: the store's idempotency records, memories and event log are the judge.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _ray_backfill import (
    ENGINE_FLAGS,
    Stored,
    audit_rows,
    local_run,
    ray_cluster,
    ray_run,
    tiny_cache,
)
from integration.test_backfill import crm_rows, good_ids, wait_for_progress, write_lines

from engine.backfill.ray_engine import partition_of

__all__ = ["ray_cluster", "tiny_cache"]  # fixtures used here

ROWS = 600


@pytest.fixture(scope="module")
def reference(tiny_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ray-kill")
    lines = crm_rows(ROWS, seed=3, bad_every=150)
    src = write_lines(tmp / "rows.jsonl", lines)
    local_run(tiny_cache, src, tmp / "local")
    return {"lines": lines, "src": src, "local": Stored(tmp / "local" / "memgate.db")}


def check_exactly_once(data: Path, audit: Path, reference: dict[str, Any]) -> Stored:
    stored = Stored(data / "memgate.db")
    assert set(stored.results) == good_ids(reference["lines"]), "one record per good row"
    assert stored.duplicate_keys == 0
    assert len(stored.memory_rows) == len(set(stored.memory_rows)), "a row stored twice"
    assert stored.forked_keys == 0, "two active heads for one key"
    assert stored.superseders == [], "a memory replaced twice (a forked chain)"
    assert stored.rows_out_of_order() == []
    lines = [r["line"] for r in audit_rows(audit)]
    assert lines == sorted(set(lines)) and len(lines) == ROWS, "every row audited once, in order"
    mine, theirs = stored.decisions(), reference["local"].decisions()
    differ = {r: (mine.get(r), d) for r, d in theirs.items() if mine.get(r) != d}
    assert not differ, f"{len(differ)} rows decided otherwise: {list(differ.items())[:3]}"
    return stored


def partition_rows(lines: list[str], partition: int) -> set[str]:
    """The good rows' ids that the 2-actor job sends to ``partition``."""
    rows = (json.loads(x) for x in lines)
    return {r["id"] for r in rows if r["text"] and partition_of(r["namespace"], 2) == partition}


def decided(db: Path, ids: set[str]) -> int:
    """How many of ``ids`` the store has an idempotency record for (read-only, while the
    actors write)."""
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            keys = conn.execute("SELECT key FROM idempotency").fetchall()
        finally:
            conn.close()
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0
    return sum(1 for (k,) in keys if k.removeprefix("bf:id:") in ids)


def test_an_actor_killed_mid_job_is_replaced_and_no_row_is_lost_or_doubled(
    tiny_cache: Path, ray_cluster: str, reference: dict[str, Any], tmp_path: Path, figures: Any
) -> None:
    runners: list[Any] = []
    result: list[Any] = []
    data = tmp_path / "ray"
    job = threading.Thread(
        target=lambda: result.append(
            ray_run(tiny_cache, reference["src"], data, actors=2, started=runners.append)
        ),
        daemon=True,
    )
    job.start()
    # Kill partition 0's actor only while it provably has work left: fewer of its rows are in
    # the store than it owns, so its last batch has not come back and the driver must see the
    # death. (A kill timed by the checkpoint alone could land after the partition had
    # finished, while the other one held the checkpoint back: then nothing is replaced.)
    mine = partition_rows(reference["lines"], 0)
    deadline = time.monotonic() + 120
    killed = None
    while time.monotonic() < deadline and job.is_alive():
        done = decided(data / "memgate.db", mine) if runners and runners[0].actor_pids else 0
        if len(mine) // 4 < done <= len(mine) - 32:
            killed = runners[0].actor_pids[0]
            os.kill(killed, signal.SIGKILL)
            break
        time.sleep(0.01)
    assert killed is not None, "the job ended before an actor could be killed"
    job.join(timeout=180)
    assert not job.is_alive()
    assert result[0].status == "finished"
    assert runners[0].actor_pids[0] != killed, "partition 0 was given a new actor"
    check_exactly_once(data, data / "audit.jsonl", reference)
    figures.record(
        "5 ray backfill: actor killed",
        rows=ROWS,
        replayed=result[0].replayed_this_run,
        lost=0,
        duplicates=0,
    )


def test_the_driver_killed_and_run_again_decides_every_row_exactly_once(
    tiny_cache: Path, ray_cluster: str, reference: dict[str, Any], tmp_path: Path, figures: Any
) -> None:
    data = tmp_path / "ray"
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "--cache-dir",
        str(tiny_cache),
        "backfill",
        "--input",
        str(reference["src"]),
        "--data-dir",
        str(data),
        "--batch",
        "32",
        "--progress",
        "off",
        "--engine",
        "ray",
        "--address",
        ray_cluster,
        "--actors",
        "2",
        *ENGINE_FLAGS,
    ]
    env = {**os.environ, "MEMGATE_HOME": str(tiny_cache), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "killed-run.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        killed_at = wait_for_progress(proc, data, ROWS // 4, timeout=150)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert killed_at < ROWS
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resuming after line" in again.stderr
    assert "rows in the job" in again.stdout
    (audit,) = (data / "backfill").glob("*.audit.jsonl")
    check_exactly_once(data, audit, reference)
    figures.record(
        "5 ray backfill: driver killed", rows=ROWS, killed_after_line=killed_at, duplicates=0
    )
