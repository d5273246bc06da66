"""Shared pieces of the Ray backfill tests (tests/integration/test_backfill_ray.py and
tests/reliability/test_backfill_ray_kill.py): a tiny model cache built once per session, a real
local Ray cluster, and the local and Ray runs of one file, compared through the store.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.app import EngineSettings
from engine.backfill import BackfillSettings, GateDecider, Job, JobResult, Source
from engine.runtime.loader import ModelChoice
from engine.runtime.session import SessionSettings

NLI = "nli-deberta-v3-small"
ENGINE_FLAGS = ("--nli", NLI, "--allow-random-weights", "--threads", "1")


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reliability suite's tiny random-weight models, built once per session."""
    from reliability._proc import tiny_models

    root = tmp_path_factory.getbasetemp() / "ray-tiny-models"
    if not (root / "models" / NLI).is_dir():
        tiny_models(root)
    return root


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A real local Ray cluster for the module (2 CPUs, no dashboard); yields its address."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def engine_settings(cache: Path, data: Path) -> EngineSettings:
    return EngineSettings(
        data_dir=data,
        cache_dir=cache,
        models=ModelChoice(nli=NLI, allow_random_weights=True),
        session=SessionSettings(intra_op_threads=1),
    )


def make_job(src: Path, data: Path, batch: int = 32, stop: threading.Event | None = None) -> Job:
    return Job(
        Source.open(src),
        BackfillSettings(batch=batch),
        destination=f"local:{data.resolve()}",
        audit=data / "audit.jsonl",
        checkpoint=data / "checkpoint.json",
        stop=stop,
    )


def local_run(cache: Path, src: Path, data: Path, batch: int = 32) -> JobResult:
    """The reference: one process, the local backfill's own code path."""
    from engine.app import open_engine

    with open_engine(engine_settings(cache, data)) as eng:
        job = make_job(src, data, batch)
        return job.run(GateDecider(eng.gate, "strict", apply=True))


def ray_run(
    cache: Path,
    src: Path,
    data: Path,
    *,
    actors: int = 2,
    batch: int = 32,
    stop: threading.Event | None = None,
    started: Callable[[Any], None] | None = None,
) -> JobResult:
    from engine.backfill.ray_engine import RayBackfill, RaySettings

    runner = RayBackfill(
        make_job(src, data, batch, stop),
        engine_settings(cache, data),
        str(data / "memgate.db"),
        RaySettings(actors=actors),
    )
    if started is not None:
        started(runner)
    return runner.run()


class Stored:
    """Per input row id, what the store decided: from its idempotency records, memories and
    events, never from the job's counters."""

    def __init__(self, db: Path) -> None:
        conn = sqlite3.connect(db)
        try:
            keys = [k for (k,) in conn.execute("SELECT key FROM idempotency")]
            self.results = {
                k.removeprefix("bf:id:"): json.loads(r)
                for k, r in conn.execute("SELECT key, result FROM idempotency")
            }
            self.duplicate_keys = len(keys) - len(set(keys))
            memories = conn.execute("SELECT id, namespace, text, metadata FROM memories").fetchall()
            self.events = conn.execute(
                "SELECT namespace, seq, memory_id FROM events WHERE type IN ('add', 'replace') "
                "ORDER BY namespace, seq"
            ).fetchall()
            heads = conn.execute(
                "SELECT namespace, key, count(*) FROM memories WHERE status = 'active' "
                "AND key IS NOT NULL GROUP BY namespace, key HAVING count(*) > 1"
            ).fetchall()
            self.forked_keys = len(heads)
            self.superseders = conn.execute(
                "SELECT supersedes, count(*) FROM memories WHERE supersedes IS NOT NULL "
                "GROUP BY supersedes HAVING count(*) > 1"
            ).fetchall()
        finally:
            conn.close()
        self.row_of_memory = {m: json.loads(meta)["row"] for m, _, _, meta in memories}
        self.text_of_row = {json.loads(meta)["row"]: t for _, _, t, meta in memories}
        self.memory_rows = [json.loads(meta)["row"] for _, _, _, meta in memories]

    def decisions(self) -> dict[str, tuple[str, int | None, str | None]]:
        """row id -> (action, the row whose memory it targets, the stored text)."""
        out = {}
        for row, r in self.results.items():
            target = r.get("target_id")
            number = int(row.removeprefix("r"))
            out[row] = (
                r["action"],
                self.row_of_memory.get(target) if target else None,
                self.text_of_row.get(number),
            )
        return out

    def rows_out_of_order(self) -> list[tuple[str, int, int]]:
        """(namespace, row, the later row committed before it) for every namespace whose
        writes the event log shows out of input order."""
        seen: dict[str, int] = defaultdict(int)
        bad = []
        for ns, _, memory in self.events:
            row = self.row_of_memory.get(memory)
            if row is None:
                continue
            if row < seen[ns]:
                bad.append((ns, row, seen[ns]))
            seen[ns] = max(seen[ns], row)
        return bad


def audit_rows(path: Path) -> list[dict[str, Any]]:
    from engine.backfill.audit import read_records

    return list(read_records(path))
