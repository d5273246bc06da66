"""``memgate backfill`` end to end: real models, real SQLite, the real CLI in a subprocess for the
crash tests, an in-process gRPC server for the remote path.

The store is the judge: every check of "applied exactly once" reads ``memgate.db`` (memories,
events, reviews, idempotency records per row id), never the job's own counters.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.backfill import BackfillSettings, GateDecider, Job, Source, StreamDecider, parse_map
from engine.backfill.audit import read_records
from engine.backfill.checkpoint import load
from engine.errors import InvalidInput
from engine.types import Decision, Fact

ROOT = Path(__file__).resolve().parents[2]


# -- data ----------------------------------------------------------------------------------------
PEOPLE = ["Alice", "Bob", "Chen", "Dana", "Emeka"]
ATTRS = [
    ("plan", ["Starter", "Growth", "Business", "Enterprise"]),
    ("city", ["Denver", "Chicago", "Austin", "Lisbon"]),
    ("seats", ["5", "12", "40", "90"]),
    ("manager", ["Priya", "Marco", "Yuki"]),
    ("timezone", ["UTC", "UTC+1", "UTC-5"]),
]
TOPICS = [
    "The customer's office is in {}.",
    "The customer prefers {} for invoices.",
    "The customer's renewal is in {}.",
]
VALUES = ["Denver", "Chicago", "email", "paper", "March", "October"]


def crm_rows(n: int, seed: int = 7, bad_every: int = 200) -> list[str]:
    """``n`` JSON lines over 20 namespaces: keyed attribute updates (a later row replaces an
    earlier one by key, or repeats it), episodic events, a few free-text facts the NLI model
    decides, and one bad row (empty text) every ``bad_every`` lines. Row ``i`` has id ``r<i>``
    and ``metadata.row == i``, so the store can be audited per row."""
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        ns = f"tenant{rng.randrange(20)}/crm"
        roll = rng.random()
        if bad_every and i % bad_every == 6:
            row: dict[str, Any] = {"id": f"r{i}", "namespace": ns, "text": ""}
        elif roll < 0.55:
            attr, values = rng.choice(ATTRS)
            who = rng.choice(PEOPLE)
            row = {
                "id": f"r{i}",
                "namespace": ns,
                "text": f"{who}'s {attr} is {rng.choice(values)}.",
                "key": f"{who}.{attr}",
            }
        elif roll < 0.99:
            who = rng.choice(PEOPLE)
            row = {
                "id": f"r{i}",
                "namespace": ns,
                "kind": "episodic",
                "text": f"Call {i} with {who} about ticket {rng.randrange(1000)}.",
            }
        else:
            row = {
                "id": f"r{i}",
                "namespace": ns,
                "text": rng.choice(TOPICS).format(rng.choice(VALUES)),
            }
        row["metadata"] = {"row": i}
        out.append(json.dumps(row))
    return out


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- reading the store ---------------------------------------------------------------------------
class Applied:
    """What the store holds per input row id (from its own tables)."""

    def __init__(self, db: Path) -> None:
        conn = sqlite3.connect(db)
        try:
            self.results = {
                key: json.loads(result)
                for key, result in conn.execute("SELECT key, result FROM idempotency")
            }
            idem_rows = conn.execute("SELECT count(*) FROM idempotency").fetchone()[0]
            self.memory_rows = Counter(
                json.loads(meta).get("row")
                for (meta,) in conn.execute("SELECT metadata FROM memories")
            )
            self.memories = conn.execute("SELECT count(*) FROM memories").fetchone()[0]
            self.events_per_memory = Counter(
                m
                for (m,) in conn.execute(
                    "SELECT memory_id FROM events WHERE type IN ('add', 'replace')"
                )
            )
            self.events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            self.reviews = conn.execute("SELECT count(*) FROM reviews").fetchone()[0]
        finally:
            conn.close()
        assert idem_rows == len(self.results)
        self.by_row = {k.removeprefix("bf:id:"): v for k, v in self.results.items()}
        self.row_of_memory = {
            v["memory_id"]: row for row, v in self.by_row.items() if v.get("memory_id")
        }

    def decisions(self) -> dict[str, tuple[str, str | None]]:
        """row id -> (action, the row whose memory it targets)."""
        return {
            row: (
                v["action"],
                self.row_of_memory.get(v.get("target_id")) if v.get("target_id") else None,
            )
            for row, v in self.by_row.items()
        }

    def check_exactly_once(self, good: set[str]) -> None:
        assert set(self.by_row) == good, "an idempotency record per good row, no more"
        actions = Counter(v["action"] for v in self.by_row.values())
        stored = {row for row, v in self.by_row.items() if v["action"] in ("add", "replace")}
        # one memory per add/replace row, none for skip/review rows, none without a row
        assert self.memories == len(stored)
        assert {f"r{r}" for r in self.memory_rows} == stored
        assert max(self.memory_rows.values()) == 1, "a row stored twice"
        assert all(self.events_per_memory[self.by_row[r]["memory_id"]] == 1 for r in stored)
        assert self.events == len(good), "one event per write"
        assert self.reviews == actions["review"]


def good_ids(lines: Sequence[str]) -> set[str]:
    return {json.loads(x)["id"] for x in lines if json.loads(x)["text"]}


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return list(read_records(path))


# -- running the CLI -----------------------------------------------------------------------------
def cli(input_: Path, data: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "engine",
        "backfill",
        "--input",
        str(input_),
        "--data-dir",
        str(data),
        "--progress",
        "off",
        *extra,
    ]


def cli_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["MEMGATE_HOME"] = str(cache_dir)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def checkpoint_of(data: Path) -> Path | None:
    found = (
        sorted((data / "backfill").glob("*.checkpoint.json"))
        if (data / "backfill").is_dir()
        else []
    )
    return found[0] if found else None


def wait_for_progress(
    proc: subprocess.Popen[bytes], data: Path, beyond: int, timeout: float
) -> int:
    """Bounded wait until the checkpoint says a line past ``beyond`` is done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = checkpoint_of(data)
        if path is not None:
            try:
                cp = load(path)
            except InvalidInput:
                cp = None  # never torn (atomic rename); a reader can still race the first write
            if cp is not None and cp.done_line > beyond:
                return cp.done_line
        if proc.poll() is not None:
            raise AssertionError(f"the job ended (rc {proc.returncode}) before line {beyond}")
        time.sleep(0.02)
    raise AssertionError(f"no progress past line {beyond} in {timeout} s")


def reference_run(
    models: tuple[Any, Any],
    lines: Sequence[str],
    tmp: Path,
    batch: int,
    cache_dir: Path | None = None,
) -> Applied:
    """The same file, uninterrupted, in another data dir (in process, same code path). With
    ``cache_dir``, the gate has the judge served from it for these models, as the CLI's has."""
    from engine.gate.gate import Gate
    from engine.gate.judge.store import find_judge
    from engine.index import IndexManager
    from engine.store import SQLiteStore

    tmp.mkdir()
    src = write_lines(tmp / "rows.jsonl", lines)
    store = SQLiteStore(tmp / "memgate.db")
    judge = None if cache_dir is None else find_judge(cache_dir, *models)
    try:
        gate = Gate(store, IndexManager(store.iter_active_embeddings), *models, judge=judge)
        job = Job(
            Source.open(src),
            BackfillSettings(batch=batch),
            destination="local:reference",
            audit=tmp / "audit.jsonl",
            checkpoint=tmp / "checkpoint.json",
        )
        assert job.run(GateDecider(gate, "strict", apply=True)).status == "finished"
    finally:
        store.close()
    return Applied(tmp / "memgate.db")


# -- crash tests (the real CLI in a subprocess) --------------------------------------------------
def test_kill_9_at_random_moments_then_resume_applies_every_row_exactly_once(
    tmp_path: Path, cache_dir: Path, models: tuple[Any, Any]
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    lines = crm_rows(2000)
    src = write_lines(tmp_path / "rows.jsonl", lines)
    data = tmp_path / "data"
    cmd = cli(src, data, "--batch", "32")
    env = cli_env(cache_dir)
    kills = 0
    done = 0
    for target in (rng.randint(150, 450), rng.randint(650, 1000), rng.randint(1150, 1550)):
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            done = wait_for_progress(proc, data, max(target, done), timeout=60)
            time.sleep(rng.uniform(0.0, 0.25))  # land anywhere in a batch: decide, commit, audit
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert kills == 3
    final = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=120, check=False)
    assert final.returncode == 0, final.stderr.decode()[-2000:]
    assert b"resuming after line" in final.stderr
    cp = load(checkpoint_of(data))  # type: ignore[arg-type]
    assert cp is not None and cp.finished and cp.done_line == 2000

    good = good_ids(lines)
    applied = Applied(data / "memgate.db")
    applied.check_exactly_once(good)
    # every row audited once, in order, bad rows included
    audit = audit_lines(Path(cp.audit))
    assert [a["line"] for a in audit] == list(range(1, 2001)), f"seed {seed}"
    assert sum(a["action"] == "error" for a in audit) == 2000 - len(good)
    # the same decisions as an uninterrupted run of the same file (with the CLI's judge)
    reference = reference_run(models, lines, tmp_path / "reference", batch=32, cache_dir=cache_dir)
    reference.check_exactly_once(good)
    ours, theirs = applied.decisions(), reference.decisions()
    differ = sorted(r for r in good if ours[r] != theirs[r])
    assert not differ, f"seed {seed}: rows {differ[:10]} decided differently"
    audit_actions = {a["id"]: a["action"] for a in audit if a["action"] != "error"}
    assert audit_actions == {r: a for r, (a, _) in ours.items()}


def test_ctrl_c_stops_cleanly_with_a_resumable_checkpoint(tmp_path: Path, cache_dir: Path) -> None:
    lines = crm_rows(600, seed=11)
    src = write_lines(tmp_path / "rows.jsonl", lines)
    data = tmp_path / "data"
    cmd = cli(src, data, "--batch", "16")
    env = cli_env(cache_dir)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_progress(proc, data, 60, timeout=60)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert b"stopping after the batch in flight" in err
    assert b"run the same command again to resume" in err.lower()
    assert b"Traceback" not in err
    assert b"policy  kind" in out  # the summary table is printed on a clean stop too
    cp = load(checkpoint_of(data))  # type: ignore[arg-type]
    assert cp is not None and not cp.finished and 60 < cp.done_line < 600
    assert cp.pending_through is None, "a clean stop leaves nothing in flight"
    assert len(audit_lines(Path(cp.audit))) == cp.rows

    final = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=120, check=False)
    assert final.returncode == 0, final.stderr.decode()[-2000:]
    assert f"resuming after line {cp.done_line:,}".encode() in final.stderr
    Applied(data / "memgate.db").check_exactly_once(good_ids(lines))
    audit = audit_lines(Path(cp.audit))
    assert [a["line"] for a in audit] == list(range(1, 601))
    assert not any(a["replayed"] for a in audit if a["action"] != "error")


# -- in-process jobs on the real gate ------------------------------------------------------------
@pytest.fixture
def run_job(make_gate: Callable[..., Any], tmp_path: Path) -> Callable[..., Any]:
    """Run a job over ``path`` into the store ``memgate.db`` of tmp_path (one gate per test)."""
    gates: dict[str, Any] = {}

    def run(
        path: Path,
        *,
        decider: Any = None,
        stop: threading.Event | None = None,
        fmt: str | None = None,
        **settings: Any,
    ) -> Any:
        if "gate" not in gates:
            gates["gate"] = make_gate()
        job = Job(
            Source.open(path, fmt),
            BackfillSettings(**settings),
            destination="local:test",
            audit=tmp_path / "audit.jsonl",
            checkpoint=tmp_path / "checkpoint.json",
            stop=stop,
        )
        policy = settings.get("policy", "strict")
        apply = not settings.get("dry_run", False)
        return job.run(decider or GateDecider(gates["gate"], policy, apply=apply))

    run.gate = lambda: gates.setdefault("gate", make_gate())  # type: ignore[attr-defined]
    return run


def test_a_later_row_replaces_an_earlier_one_of_its_namespace(tmp_path: Path, run_job: Any) -> None:
    rows = [
        {"namespace": "acme/alice", "text": "Alice's office is in Denver."},
        {"namespace": "acme/bob", "text": "Bob's office is in Denver."},
        {"namespace": "acme/alice", "text": "Alice's plan is Starter.", "key": "plan"},
        {"namespace": "acme/alice", "text": "Alice's office is in Chicago now."},
        {"namespace": "acme/alice", "text": "Alice's plan is Growth.", "key": "plan"},
        {"namespace": "acme/alice", "text": "Alice's plan is Growth.", "key": "plan"},
    ]
    src = write_lines(tmp_path / "rows.jsonl", [json.dumps(r) for r in rows])
    for batch in (1, 256):  # across batches and within one batch
        (tmp_path / "checkpoint.json").unlink(missing_ok=True)
        result = run_job(src, batch=batch, fields=parse_map("id="))
        assert result.status == "finished"
        audit = audit_lines(tmp_path / "audit.jsonl")
        if batch == 1:
            assert [a["action"] for a in audit] == [
                "add",
                "add",
                "add",
                "replace",
                "replace",
                "skip",
            ]
            by_line = {a["line"]: a for a in audit}
            assert by_line[4]["target"] == by_line[1]["memory_id"]  # same namespace only
            assert by_line[5]["target"] == by_line[3]["memory_id"]
            assert by_line[4]["similarity"] is not None and by_line[4]["contradiction"] > 0.5
        else:  # the second pass: every row is a replay of the first (same job, same keys)
            assert all(a["replayed"] for a in audit)


def test_bad_rows_are_reported_by_line_and_skipped_without_poisoning_their_batch(
    tmp_path: Path, run_job: Any
) -> None:
    long_text = "x" * 9000
    lines = [
        json.dumps({"namespace": "acme/a", "text": "Good one.", "kind": "episodic"}),
        json.dumps({"namespace": "acme/a"}),  # missing text
        json.dumps({"namespace": "acme/a", "text": "Kind?", "kind": "rumour"}),
        "{not json",
        json.dumps({"namespace": "acme/a", "text": long_text}),
        json.dumps({"namespace": "acme/a", "text": "Meta.", "metadata": "a string"}),
        json.dumps({"namespace": "acme/a", "text": "Meta.", "metadata": [1, 2]}),
        json.dumps({"namespace": "bad namespace!", "text": "x"}),
        json.dumps({"namespace": "acme/a", "text": "Good two.", "kind": "episodic"}),
    ]
    data = ("\n".join(lines) + "\n").encode() + b'{"namespace": "acme/a", "text": "caf\xe9"}\n'
    data += json.dumps({"namespace": "acme/a", "text": "Good three.", "kind": "episodic"}).encode()
    src = tmp_path / "rows.jsonl"
    src.write_bytes(data + b"\n")
    result = run_job(src, batch=256, fields=parse_map("id="))
    assert result.status == "finished"
    audit = audit_lines(tmp_path / "audit.jsonl")
    errors = {a["line"]: a["error"] for a in audit if a["action"] == "error"}
    assert sorted(errors) == [2, 3, 4, 5, 6, 7, 8, 10]
    assert "missing text" in errors[2]
    assert "unknown kind 'rumour'" in errors[3]
    assert "bad JSON" in errors[4]
    assert "9000 characters" in errors[5]
    assert "metadata is not valid JSON" in errors[6]
    assert "metadata must be a JSON object" in errors[7]
    assert "namespace" in errors[8]
    assert "invalid UTF-8" in errors[10]
    assert [a["line"] for a in audit if a["action"] == "add"] == [1, 9, 11]
    assert result.tally.actions == Counter({"add": 3, "error": 8})


def test_on_error_fail_applies_the_rows_before_and_resumes_at_the_fixed_row(
    tmp_path: Path, run_job: Any
) -> None:
    lines = [
        json.dumps({"namespace": "acme/a", "text": f"Event {i}.", "kind": "episodic"})
        for i in range(1, 11)
    ]
    lines[6] = json.dumps({"namespace": "acme/a", "text": "", "kind": "episodic"})
    src = write_lines(tmp_path / "rows.jsonl", lines)
    result = run_job(src, batch=4, on_error="fail", fields=parse_map("id="))
    assert result.status == "failed"
    assert result.failed.line == 7 and "missing text" in result.failed.error
    assert [a["line"] for a in audit_lines(tmp_path / "audit.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert load(tmp_path / "checkpoint.json").done_line == 6  # type: ignore[union-attr]

    lines[6] = json.dumps({"namespace": "acme/a", "text": "Event 7.", "kind": "episodic"})
    write_lines(src, lines)
    with pytest.raises(InvalidInput, match="--resume-changed"):
        run_job(src, batch=4, on_error="fail", fields=parse_map("id="))
    result = run_job(src, batch=4, on_error="fail", fields=parse_map("id="), resume_changed=True)
    assert result.status == "finished" and result.resumed_after == 6
    audit = audit_lines(tmp_path / "audit.jsonl")
    assert [a["line"] for a in audit] == list(range(1, 11))
    assert not any(a["replayed"] for a in audit)
    store = run_job.gate().store
    assert store.count_active("acme/a") == 10


class Killed(BaseException):
    """The process died (nothing after the raise runs: no audit line, no checkpoint)."""


class CrashAfterCommit:
    """A decider whose process 'dies' right after the store committed batch ``n``."""

    def __init__(self, inner: GateDecider, n: int) -> None:
        self.inner, self.n, self.calls = inner, n, 0

    def decide(self, facts: Sequence[Fact]) -> list[Decision]:
        decisions = self.inner.decide(facts)
        self.calls += 1
        if self.calls == self.n:
            raise Killed  # after the commit, before the audit and the checkpoint
        return decisions


def test_the_batch_in_flight_at_a_crash_is_replayed_whole_and_alone(
    tmp_path: Path, run_job: Any, models: tuple[Any, Any]
) -> None:
    lines = crm_rows(300, seed=3, bad_every=0)
    src = write_lines(tmp_path / "rows.jsonl", lines)
    gate = run_job.gate()
    with pytest.raises(Killed):
        run_job(src, batch=40, decider=CrashAfterCommit(GateDecider(gate, "strict", apply=True), 3))
    cp = load(tmp_path / "checkpoint.json")
    assert cp is not None and cp.pending_through is not None
    assert len(audit_lines(tmp_path / "audit.jsonl")) == cp.rows == cp.done_line == 80
    # The first batch of the restart is exactly the one in flight: its facts are all replays,
    # and none of them shares a batch with a new fact (which could otherwise target the
    # unstored copy of a replayed one). A new --batch is ignored: the job cuts the same batches.
    result = run_job(src, batch=64)
    assert result.status == "finished" and result.batch == 40
    assert result.replayed_this_run == 40
    audit = audit_lines(tmp_path / "audit.jsonl")
    assert [a["line"] for a in audit] == list(range(1, 301))
    assert [a["line"] for a in audit if a["replayed"]] == list(range(81, 121))
    gate.store.close()
    Applied(tmp_path / "memgate.db").check_exactly_once(good_ids(lines))


def test_csv_gzip_and_parquet_inputs_with_a_field_map(tmp_path: Path, run_job: Any) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    body = [
        ("acme/a", "Alice's plan is Starter.", "plan", '{"src": "crm"}', "c1"),
        ("acme/a", "Alice's plan is Growth.", "plan", "", "c2"),
        ("acme/b", 'Bob said "hi",\nthen left.', "", "", "c3"),
    ]
    csv_path = tmp_path / "rows.csv"
    import csv

    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["ns", "body", "attr", "meta", "row_id"])
        w.writerows(body)
    fields = parse_map("namespace=ns,text=body,key=attr,metadata=meta,id=row_id")
    result = run_job(csv_path, fields=fields)
    audit = audit_lines(tmp_path / "audit.jsonl")
    assert [(a["line"], a["id"], a["action"]) for a in audit] == [
        (2, "c1", "add"),
        (3, "c2", "replace"),
        (4, "c3", "add"),
    ]
    assert result.status == "finished"
    mem = run_job.gate().store.get("acme/a", audit[0]["memory_id"])
    assert mem.metadata == {"src": "crm"} and mem.source == "backfill:rows.csv:2"

    gz = tmp_path / "more.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(
            json.dumps({"namespace": "acme/a", "text": "Alice's plan is Business.", "key": "plan"})
            + "\n"
        )
    (tmp_path / "checkpoint.json").unlink()
    run_job(gz, fields=parse_map("id="))
    assert audit_lines(tmp_path / "audit.jsonl")[0]["action"] == "replace"

    table = pa.table(
        {
            "tenant": ["acme/c", "acme/c"],
            "body": ["Carol's plan is Starter.", "Carol's plan is Starter."],
            "attr": ["plan", "plan"],
            "meta": [{"n": 1}, {"n": 2}],
        }
    )
    pq_path = tmp_path / "rows.parquet"
    pq.write_table(table, pq_path)
    (tmp_path / "checkpoint.json").unlink()
    run_job(pq_path, fields=parse_map("namespace=tenant,text=body,key=attr,metadata=meta"))
    audit = audit_lines(tmp_path / "audit.jsonl")
    assert [(a["line"], a["action"]) for a in audit] == [(1, "add"), (2, "skip")]


def test_dry_run_stores_nothing_and_keeps_no_checkpoint(tmp_path: Path, run_job: Any) -> None:
    lines = crm_rows(40, seed=5, bad_every=0)
    src = write_lines(tmp_path / "rows.jsonl", lines)
    result = run_job(src, dry_run=True)
    assert result.status == "finished" and result.checkpoint is None
    assert not (tmp_path / "checkpoint.json").exists()
    assert len(audit_lines(tmp_path / "audit.jsonl")) == 40
    store = run_job.gate().store
    assert store.namespaces() == []


def test_a_checkpoint_refuses_another_command_and_a_second_process(
    tmp_path: Path, run_job: Any
) -> None:
    from engine.backfill.checkpoint import JobLock
    from engine.errors import Conflict

    src = write_lines(tmp_path / "rows.jsonl", crm_rows(10, bad_every=0))
    run_job(src)
    with pytest.raises(InvalidInput, match="--policy strict"):
        run_job(src, policy="review")
    with pytest.raises(InvalidInput, match="another --map"):
        run_job(src, fields=parse_map("id="))
    with JobLock(tmp_path / "checkpoint.json"), pytest.raises(Conflict, match="another backfill"):
        run_job(src)
    result = run_job(src)  # a finished job run again: nothing new after its last line
    assert result.status == "finished" and result.rows_this_run == 0 and result.tally.rows == 10


def test_cli_in_process_prints_the_summary(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.cli import main

    lines = crm_rows(30, seed=9, bad_every=0)
    src = write_lines(tmp_path / "rows.jsonl", lines)
    rc = main(
        [
            "--cache-dir",
            str(cache_dir),
            "backfill",
            "--input",
            str(src),
            "--data-dir",
            str(tmp_path / "data"),
            "--batch",
            "8",
            "--audit",
            str(tmp_path / "a.jsonl"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "policy  kind" in out and "top namespaces by facts" in out
    assert "episodic" in out and "total" in out
    assert len(audit_lines(tmp_path / "a.jsonl")) == 30
    assert checkpoint_of(tmp_path / "data") is not None


# -- over gRPC -----------------------------------------------------------------------------------
@pytest.fixture
def server(make_gate: Callable[..., Any]) -> Iterator[Any]:
    from engine.server.codegen import ensure

    ensure()
    from engine.server import ServerSettings, ServerThread

    gate = make_gate("served.db")
    st = ServerThread(gate, ServerSettings(port=0, max_queue_delay_s=None))
    st.start()
    st.gate = gate  # type: ignore[attr-defined]
    yield st
    st.stop(grace=0)


class StopAfter:
    """A stream decider that asks the job to stop after ``n`` decisions (a Ctrl-C)."""

    def __init__(self, inner: StreamDecider, stop: threading.Event, n: int) -> None:
        self.inner, self.stop, self.n = inner, stop, n

    def decide_stream(self, facts: Any) -> Iterator[Decision]:
        for i, d in enumerate(self.inner.decide_stream(facts), 1):
            if i == self.n:
                self.stop.set()
            yield d


def grpc_job(src: Path, work: Path, target: str, stop: threading.Event | None = None) -> Job:
    """The job ``memgate backfill --target`` runs: windows of 16 through the Backfill RPC."""
    return Job(
        Source.open(src),
        BackfillSettings(batch=16),
        destination=f"grpc:{target}",
        audit=work / "audit.jsonl",
        checkpoint=work / "checkpoint.json",
        stop=stop,
    )


def test_backfill_over_grpc_streams_in_order_and_resumes(tmp_path: Path, server: Any) -> None:
    from engine.client import MemgateClient

    lines = crm_rows(120, seed=13, bad_every=50)
    src = write_lines(tmp_path / "rows.jsonl", lines)

    def job(stop: threading.Event | None = None) -> Job:
        return grpc_job(src, tmp_path, server.target, stop)

    with MemgateClient(server.target, timeout=None) as client:
        stop = threading.Event()
        first = job(stop).run(StopAfter(StreamDecider(client, "strict", dry_run=False), stop, 40))
        assert first.status == "stopped"
        cp = load(tmp_path / "checkpoint.json")
        assert cp is not None and 40 <= cp.rows < 120
        # What was sent after the last checkpoint is replayed one fact at a time.
        second = job().run(StreamDecider(client, "strict", dry_run=False))
    assert second.status == "finished"
    audit = audit_lines(tmp_path / "audit.jsonl")
    assert [a["line"] for a in audit] == list(range(1, 121))
    server.stop(grace=0)
    server.gate.store.close()
    Applied(tmp_path / "served.db").check_exactly_once(good_ids(lines))


class DropAfter:
    """A stream decider whose connection drops after ``n`` decisions (facts still in flight
    may or may not be committed by the server)."""

    def __init__(self, inner: StreamDecider, n: int) -> None:
        self.inner, self.n = inner, n

    def decide_stream(self, facts: Any) -> Iterator[Decision]:
        for i, d in enumerate(self.inner.decide_stream(facts), 1):
            if i > self.n:
                raise Killed
            yield d


def test_a_stream_cut_mid_flight_resumes_exactly_once(tmp_path: Path, server: Any) -> None:
    from engine.client import MemgateClient

    lines = crm_rows(150, seed=19, bad_every=0)
    src = write_lines(tmp_path / "rows.jsonl", lines)

    def job() -> Job:
        return grpc_job(src, tmp_path, server.target)

    with MemgateClient(server.target, timeout=None) as client:
        with pytest.raises(Killed):
            job().run(DropAfter(StreamDecider(client, "strict", dry_run=False), 60))
        cp = load(tmp_path / "checkpoint.json")
        assert cp is not None and cp.done_line == 48  # 3 windows of 16 acknowledged
        assert cp.pending_through is not None and cp.pending_through > 60
        result = job().run(StreamDecider(client, "strict", dry_run=False))
    assert result.status == "finished"
    assert result.replayed_this_run >= 60 - 48  # decided before the cut, not checkpointed
    audit = audit_lines(tmp_path / "audit.jsonl")
    assert [a["line"] for a in audit] == list(range(1, 151))
    server.stop(grace=0)
    server.gate.store.close()
    Applied(tmp_path / "served.db").check_exactly_once(good_ids(lines))


def test_backfill_over_grpc_matches_in_process_decisions(
    tmp_path: Path, server: Any, models: tuple[Any, Any]
) -> None:
    from engine.client import MemgateClient

    lines = crm_rows(80, seed=17, bad_every=0)
    src = write_lines(tmp_path / "rows.jsonl", lines)
    with MemgateClient(server.target, timeout=None) as client:
        result = Job(
            Source.open(src),
            BackfillSettings(batch=32),
            destination=f"grpc:{server.target}",
            audit=tmp_path / "audit.jsonl",
            checkpoint=tmp_path / "checkpoint.json",
        ).run(StreamDecider(client, "strict", dry_run=False))
    assert result.status == "finished"
    server.stop(grace=0)
    server.gate.store.close()
    remote = Applied(tmp_path / "served.db")
    remote.check_exactly_once(good_ids(lines))
    local = reference_run(models, lines, tmp_path / "local", batch=32)
    # Keyed and episodic rows do not depend on how the server cut its batches.
    keyed = {
        json.loads(x)["id"] for x in lines if "key" in json.loads(x) or "kind" in json.loads(x)
    }
    assert {r: remote.decisions()[r] for r in keyed} == {r: local.decisions()[r] for r in keyed}


def test_cli_target_runs_the_job_through_a_server(
    tmp_path: Path, server: Any, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.cli import main

    lines = crm_rows(40, seed=23, bad_every=0)
    src = write_lines(tmp_path / "rows.jsonl", lines)
    argv = ["backfill", "--input", str(src), "--target", server.target, "--batch", "8"]
    argv += ["--data-dir", str(tmp_path / "state")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"-> grpc:{server.target}" in out
    cp = load(checkpoint_of(tmp_path / "state"))  # type: ignore[arg-type]
    assert cp is not None and cp.finished and cp.destination == f"grpc:{server.target}"
    assert not (tmp_path / "state" / "memgate.db").exists()  # the server's store, not a local one
    server.stop(grace=0)
    server.gate.store.close()
    Applied(tmp_path / "served.db").check_exactly_once(good_ids(lines))


def _job_through_core(
    tmp_path: Path, models: tuple[Any, Any], lines: list[str], engine_of: Callable[[Any], Any]
) -> Any:
    """Run ``lines`` as a 16-row job through the engine core that ``engine_of(gate)`` builds,
    into ``tmp_path / "memgate.db"``: the in-process path of ``memgate backfill``."""
    from engine.backfill import EngineDecider
    from engine.core import SyncEngine
    from engine.gate.gate import Gate
    from engine.index import IndexManager
    from engine.store import SQLiteStore

    src = write_lines(tmp_path / "rows.jsonl", lines)
    store = SQLiteStore(tmp_path / "memgate.db")
    try:
        gate = Gate(store, IndexManager(store.iter_active_embeddings), *models)
        with SyncEngine(engine_of(gate)) as core:
            return Job(
                Source.open(src),
                BackfillSettings(batch=16),
                destination="local:test",
                audit=tmp_path / "audit.jsonl",
                checkpoint=tmp_path / "checkpoint.json",
            ).run(EngineDecider(core, "strict", apply=True))
    finally:
        store.close()


def test_in_process_engine_stream_matches_the_bare_gate_and_applies_exactly_once(
    tmp_path: Path, models: tuple[Any, Any]
) -> None:
    """In process through the engine core (the server's stream path, per-fact release): every
    row applied once, and keyed / episodic rows decided as the bare gate decides them."""
    from engine.app import build_engine

    lines = crm_rows(80, seed=23, bad_every=30)
    result = _job_through_core(tmp_path, models, lines, build_engine)
    assert result.status == "finished"
    assert [a["line"] for a in audit_lines(tmp_path / "audit.jsonl")] == list(range(1, 81))
    engine_run = Applied(tmp_path / "memgate.db")
    engine_run.check_exactly_once(good_ids(lines))
    local = reference_run(models, lines, tmp_path / "local", batch=16)
    keyed = {
        json.loads(x)["id"]
        for x in lines
        if json.loads(x)["text"] and ("key" in json.loads(x) or "kind" in json.loads(x))
    }
    assert {r: engine_run.decisions()[r] for r in keyed} == {r: local.decisions()[r] for r in keyed}


def test_the_cli_s_in_process_job_runs_batches_of_its_batch_size_exactly_once(
    tmp_path: Path, models: tuple[Any, Any]
) -> None:
    """``memgate backfill`` in process runs the core with ``engine.backfill.core_settings``:
    its stream's facts share model batches (the server's default cut one fact per batch, a
    fifth of batch triage's speed), and every row is still applied exactly once, in order."""
    from engine.app import build_engine
    from engine.backfill import core_settings

    batches: list[int] = []

    def engine_of(gate: Any) -> Any:
        engine = build_engine(
            gate, core_settings(16), on_batch=lambda facts, entries, s: batches.append(facts)
        )
        # The first batch is held 0.3 s, as a slow model would hold it, so the stream's next
        # facts are queued by the time it ends (on these tiny stores a batch is faster than
        # the job feeds facts, and every batch would be cut alone either way).
        run_batch = engine.batcher._run
        held = threading.Event()

        def slow_first(group: Any, works: Any) -> Any:
            if not held.is_set():
                held.set()
                time.sleep(0.3)
            return run_batch(group, works)

        engine.batcher._run = slow_first
        return engine

    lines = crm_rows(80, seed=29, bad_every=30)
    result = _job_through_core(tmp_path, models, lines, engine_of)
    assert result.status == "finished"
    assert [a["line"] for a in audit_lines(tmp_path / "audit.jsonl")] == list(range(1, 81))
    Applied(tmp_path / "memgate.db").check_exactly_once(good_ids(lines))
    # the queued facts went 16 at a time, across namespaces (77 facts: one per batch before)
    assert max(batches) == 16 and len(batches) <= 10, batches
