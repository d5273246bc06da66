"""Backfill without models: readers, row validation and keys, checkpoint and audit files, batch
cutting, and the job loops driven by fake deciders."""

from __future__ import annotations

import csv
import gzip
import json
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backfill import BackfillSettings, Job, Source, parse_map
from engine.backfill.audit import AuditLog, Tally, read_records
from engine.backfill.checkpoint import Checkpoint, CheckpointWriter, atomic_write, load
from engine.backfill.readers import count_rows, detect_format, fingerprint
from engine.backfill.readers import read_records as records
from engine.backfill.rows import FieldMap, Row, idempotency_key, to_row
from engine.errors import InvalidInput
from engine.gate.gate import GateSettings
from engine.types import Decision, Fact


def lines_of(path: Path, **kw: Any) -> list[tuple[int, Any, Any]]:
    fmt, gz = detect_format(path)
    return [(r.line, r.values, r.error) for r in records(path, fmt, gz, **kw)]


# -- formats -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.jsonl", ("jsonl", False)),
        ("a.ndjson", ("jsonl", False)),
        ("a.JSONL.gz", ("jsonl", True)),
        ("a.csv", ("csv", False)),
        ("a.csv.gz", ("csv", True)),
        ("a.tsv", ("tsv", False)),
        ("a.parquet", ("parquet", False)),
        ("a.pq", ("parquet", False)),
    ],
)
def test_format_from_the_name(name: str, expected: tuple[str, bool]) -> None:
    assert detect_format(Path(name)) == expected


def test_unknown_formats_are_refused_with_the_way_out() -> None:
    with pytest.raises(InvalidInput, match="--format"):
        detect_format(Path("facts.txt"))
    assert detect_format(Path("facts.txt"), "jsonl") == ("jsonl", False)
    with pytest.raises(InvalidInput, match="not supported"):
        detect_format(Path("a.parquet.gz"))


# -- JSON Lines ----------------------------------------------------------------------------------
def test_jsonl_records_carry_their_physical_line(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(
        b'{"text": "a"}\n\n  \n{bad\n[1, 2]\n{"text": "caf\xe9"}\n{"text": "b"}'  # no final \n
    )
    got = lines_of(path)
    assert got[0] == (1, {"text": "a"}, None)
    assert got[1][0] == 4 and "bad JSON" in got[1][2]
    assert got[2] == (5, None, "a row must be a JSON object, got an array")
    assert got[3][0] == 6 and "invalid UTF-8" in got[3][2]
    assert got[4] == (7, {"text": "b"}, None)
    assert count_rows(path, "jsonl", False) == 7


def test_resuming_skips_lines_without_parsing_them(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text('{broken\n{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    assert lines_of(path, start_after=1) == [(2, {"text": "a"}, None), (3, {"text": "b"}, None)]
    assert lines_of(path, start_after=3) == []


def test_gzip_reads_like_plain(tmp_path: Path) -> None:
    body = "".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(50))
    plain = tmp_path / "f.jsonl"
    plain.write_text(body, encoding="utf-8")
    gz = tmp_path / "f.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(body)
    assert lines_of(gz) == lines_of(plain)
    assert lines_of(gz, start_after=40) == lines_of(plain, start_after=40)
    assert count_rows(gz, "jsonl", True) == 50


# -- CSV -----------------------------------------------------------------------------------------
def test_csv_records_start_at_their_first_line(tmp_path: Path) -> None:
    path = tmp_path / "f.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["namespace", "text"])
        w.writerow(["a", "one"])
        w.writerow(["a", "two\nlines"])
        w.writerow(["a", "three"])
        f.write("a,b,c\n")
    got = lines_of(path)
    assert got[:3] == [
        (2, {"namespace": "a", "text": "one"}, None),
        (3, {"namespace": "a", "text": "two\nlines"}, None),
        (5, {"namespace": "a", "text": "three"}, None),
    ]
    assert got[3] == (6, None, "3 fields; the header has 2")
    assert lines_of(path, start_after=3) == got[2:]
    assert count_rows(path, "csv", False) == 5  # physical lines less the header


def test_csv_invalid_utf8_is_one_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "f.tsv"
    path.write_bytes(b"namespace\ttext\na\tok\na\tbad \xff byte\na\tfine\n")
    got = lines_of(path)
    assert [g[0] for g in got] == [2, 3, 4]
    assert got[1][2] == "invalid UTF-8 in column 'text'"
    assert got[2][1] == {"namespace": "a", "text": "fine"}


# -- Parquet -------------------------------------------------------------------------------------
def test_parquet_rows_and_resume_across_row_groups(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"text": [f"t{i}" for i in range(1, 26)], "other": list(range(25))})
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=7)
    assert count_rows(path, "parquet", False) == 25
    got = lines_of(path, fields=frozenset({"text", "namespace"}))
    assert got[0] == (1, {"text": "t1"}, None) and got[-1] == (25, {"text": "t25"}, None)
    resumed = lines_of(path, start_after=16, fields=frozenset({"text"}))
    assert [g[0] for g in resumed] == list(range(17, 26))
    assert resumed[0][1] == {"text": "t17"}


def test_parquet_without_pyarrow_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(InvalidInput, match=r"pip install 'memgate\[parquet\]'"):
        Source.open(path)


# -- job names -----------------------------------------------------------------------------------
def test_the_job_name_is_the_head_of_the_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    head = b'{"text": "x"}\n' * 5000  # > 64 KiB
    a.write_bytes(head)
    b.write_bytes(head + b'{"text": "appended"}\n')
    assert fingerprint(a) == fingerprint(b)  # appending keeps the job
    b.write_bytes(b'{"text": "y"}\n' + head)
    assert fingerprint(a) != fingerprint(b)


# -- rows ----------------------------------------------------------------------------------------
def test_parse_map() -> None:
    assert parse_map(None) == FieldMap()
    m = parse_map("namespace=tenant, text=body,key=,id=row_id")
    assert (m.namespace, m.text, m.key, m.id, m.kind) == ("tenant", "body", None, "row_id", "kind")
    assert m.columns() == {"tenant", "body", "row_id", "kind", "metadata", "source"}
    for bad, match in [
        ("colour=c", "fields:"),
        ("text", "field=column"),
        ("text=a,text=b", "twice"),
        ("text=", "cannot be switched off"),
    ]:
        with pytest.raises(InvalidInput, match=match):
            parse_map(bad)


def row(values: dict[str, Any], fmap: FieldMap | None = None, **kw: Any) -> Row:
    opts: dict[str, Any] = {"job": "j0b", "source": "backfill:f", "settings": GateSettings()}
    opts.update(kw)
    return to_row(9, values, fmap or FieldMap(), **opts)


def test_a_good_row_becomes_a_fact_with_a_key_and_a_source() -> None:
    r = row({"namespace": "acme/a", "text": "Hi.", "kind": "", "key": 7, "metadata": '{"a": 1}'})
    assert r.error is None and r.fact == Fact(
        "acme/a", "Hi.", "semantic", "7", {"a": 1}, "backfill:f:9", "bf:j0b:9"
    )
    r = row({"namespace": "acme/a", "text": b"Hi.", "id": "r1", "source": "crm"})
    assert r.row_id == "r1" and r.fact is not None
    assert r.fact.idempotency_key == "bf:id:r1" and r.fact.source == "crm"
    r = row({"text": "Hi.", "metadata": [("k", "v")]}, default_namespace="dflt")
    assert r.fact is not None and r.fact.namespace == "dflt" and r.fact.metadata == {"k": "v"}


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"namespace": "a"}, "missing text"),
        ({"namespace": "a", "text": "  "}, "empty"),
        ({"text": "x"}, "missing namespace"),
        ({"namespace": "a", "text": "x", "kind": "rumour"}, "unknown kind 'rumour'"),
        ({"namespace": "a", "text": "x" * 8193}, "8193 characters"),
        ({"namespace": "a", "text": b"\xff"}, "text is not valid UTF-8"),
        ({"namespace": "a", "text": ["x"]}, "text must be a string"),
        ({"namespace": "a", "text": "x", "metadata": "{"}, "metadata is not valid JSON"),
        ({"namespace": "a", "text": "x", "metadata": "[1]"}, "must be a JSON object"),
        ({"namespace": "a", "text": "x", "metadata": 3}, "must be a JSON object"),
        ({"namespace": "a", "text": "x", "metadata": {"b": "x" * 20000}}, "bytes of JSON"),
        ({"namespace": "a", "text": "x", "metadata": {"b": {1, 2}}}, "not JSON"),
        ({"namespace": "no spaces", "text": "x"}, "namespace must be"),
    ],
)
def test_bad_rows_say_why(values: dict[str, Any], error: str) -> None:
    r = row(values)
    assert r.fact is None and r.error is not None and error in r.error


def test_a_mapped_column_is_named_when_missing() -> None:
    r = row({"namespace": "a"}, parse_map("text=body"))
    assert r.error == "missing text (column 'body')"


def test_idempotency_keys() -> None:
    assert idempotency_key("j", 12, None) == "bf:j:12"
    assert idempotency_key("j", 12, "r12") == "bf:id:r12"
    long_key = idempotency_key("j", 12, "x" * 300)
    assert long_key.startswith("bf:idh:") and len(long_key) <= 256


# -- checkpoint and audit files ------------------------------------------------------------------
def state(**kw: Any) -> Checkpoint:
    base: dict[str, Any] = {
        "job": "j",
        "input": "/in",
        "destination": "local:/d",
        "policy": "strict",
        "fields": FieldMap().describe(),
        "audit": "/a",
        "batch": 8,
    }
    base.update(kw)
    return Checkpoint(**base)


def test_checkpoint_round_trip_and_atomic_replace(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    assert load(path) is None
    writer = CheckpointWriter(path, state())
    writer.save(done_line=10, audit_offset=99)
    writer.reserve(20)
    writer.reserve(15)  # never moves back
    cp = load(path)
    assert cp is not None and (cp.done_line, cp.audit_offset, cp.pending_through) == (10, 99, 20)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp.json"]  # no temporary left
    atomic_write(path, "{not json")
    with pytest.raises(InvalidInput, match="remove it"):
        load(path)
    atomic_write(path, json.dumps({"version": 99}))
    with pytest.raises(InvalidInput, match="version"):
        load(path)


def test_audit_resume_truncates_what_a_killed_run_wrote_after_its_checkpoint(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as audit:
        audit.write({"line": 1, "action": "add", "namespace": "a", "kind": "semantic"})
        offset = audit.sync()
        audit.write({"line": 2, "action": "add"})
        path_bytes = audit.sync()
    assert path_bytes > offset
    with AuditLog(path, truncate_to=offset) as audit:
        assert not audit.short
        audit.write({"line": 2, "action": "skip", "namespace": "a", "kind": "semantic"})
    assert [r["action"] for r in read_records(path)] == ["add", "skip"]
    tally = Tally.from_audit(path, path.stat().st_size)
    assert tally.actions == {"add": 1, "skip": 1} and tally.namespaces == {"a": 2}
    with AuditLog(tmp_path / "gone.jsonl", truncate_to=10) as gone:
        assert gone.short  # the audit file went missing: the summary will say so
    with AuditLog(path) as audit:  # a fresh job starts a fresh file
        pass
    assert path.stat().st_size == 0


# -- batch cutting -------------------------------------------------------------------------------
def job_for(tmp_path: Path, batch: int, **kw: Any) -> Job:
    path = tmp_path / "in.jsonl"
    if not path.exists():
        path.write_text("{}\n", encoding="utf-8")
    return Job(
        Source.open(path),
        BackfillSettings(batch=batch, **kw),
        destination="local:test",
        audit=tmp_path / "audit.jsonl",
        checkpoint=tmp_path / "cp.json",
    )


@settings(max_examples=200, deadline=None)
@given(
    good=st.lists(st.booleans(), max_size=60),
    batch=st.integers(1, 9),
    first=st.one_of(st.none(), st.integers(0, 70)),
)
def test_chunks_keep_order_hold_batch_facts_and_replay_the_pending_range_whole(
    tmp_path_factory: pytest.TempPathFactory, good: list[bool], batch: int, first: int | None
) -> None:
    job = job_for(tmp_path_factory.mktemp("c"), batch)
    fact = Fact("a", "x")
    rows = [Row(i + 1, fact if g else None, None, None if g else "bad") for i, g in enumerate(good)]
    chunks = list(job._chunks(iter(rows), first))
    assert [r for c in chunks for r in c] == rows
    assert all(chunks)
    if first is not None and chunks and rows[0].line <= first:
        assert chunks[0][-1].line == min(first, rows[-1].line)  # exactly the pending range
        chunks = chunks[1:]
    for c in chunks[:-1]:
        assert sum(r.fact is not None for r in c) == batch
        assert c[-1].fact is not None  # a batch ends at its last fact
    if chunks:
        assert sum(r.fact is not None for r in chunks[-1]) <= batch


# -- job loops with fake deciders ----------------------------------------------------------------
def decided(fact: Fact, action: str = "add") -> Decision:
    return Decision(action, fact, None, (), "strict", "fake", memory_id="mem_x")  # type: ignore[arg-type]


class Batches:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def decide(self, facts: Sequence[Fact]) -> list[Decision]:
        self.calls.append([f.text for f in facts])
        return [decided(f) for f in facts]


def write_rows(tmp_path: Path, n: int, bad: Iterable[int] = ()) -> Path:
    skip = set(bad)
    lines = [
        json.dumps({"namespace": "a", "text": "" if i in skip else f"t{i}"})
        for i in range(1, n + 1)
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_in_process_batches_in_file_order_and_checkpoints_each(tmp_path: Path) -> None:
    write_rows(tmp_path, 10, bad=[3])
    fake = Batches()
    result = job_for(tmp_path, 4).run(fake)
    assert result.status == "finished"
    assert fake.calls == [["t1", "t2", "t4", "t5"], ["t6", "t7", "t8", "t9"], ["t10"]]
    cp = load(tmp_path / "cp.json")
    assert cp is not None and cp.finished and cp.done_line == 10 and cp.rows == 10
    assert cp.audit_offset == (tmp_path / "audit.jsonl").stat().st_size
    assert [r["line"] for r in read_records(tmp_path / "audit.jsonl")] == list(range(1, 11))


def test_a_stop_request_ends_after_the_batch_in_flight(tmp_path: Path) -> None:
    write_rows(tmp_path, 10)
    stop = threading.Event()

    class StopInSecond(Batches):
        def decide(self, facts: Sequence[Fact]) -> list[Decision]:
            if len(self.calls) == 1:
                stop.set()
            return super().decide(facts)

    job = job_for(tmp_path, 3)
    job.stop = stop
    result = job.run(StopInSecond())
    assert result.status == "stopped" and result.done_line == 6
    cp = load(tmp_path / "cp.json")
    assert cp is not None and not cp.finished and cp.pending_through is None


class Stream:
    """A streaming decider shaped like gRPC: a thread pulls facts as flow control allows while
    decisions are yielded. Records how many facts had been pulled when each decision went out."""

    def __init__(self, crash_after: int | None = None) -> None:
        self.pulled_at_decision: list[int] = []
        self.crash_after = crash_after

    def decide_stream(self, facts: Iterable[Fact]) -> Iterator[Decision]:
        import queue

        q: queue.Queue[Fact | None] = queue.Queue()
        pulled = [0]
        done = [False]
        moved = threading.Condition()

        def pump() -> None:
            try:
                for f in facts:
                    with moved:
                        pulled[0] += 1
                        moved.notify_all()
                    q.put(f)
            finally:
                with moved:
                    done[0] = True
                    moved.notify_all()
                q.put(None)

        threading.Thread(target=pump, daemon=True).start()
        n = 0
        while (f := q.get()) is not None:
            n += 1
            # Let the pump pull ahead when flow control allows it (bounded wait, no timing
            # assertion): without this, whether it ran ahead depended on thread scheduling.
            with moved:
                moved.wait_for(lambda n=n: pulled[0] > n or done[0], timeout=0.1)
            self.pulled_at_decision.append(pulled[0])
            if self.crash_after is not None and n > self.crash_after:
                raise RuntimeError("the connection dropped")
            yield decided(f)


def test_the_stream_replays_the_uncertain_range_one_fact_at_a_time(tmp_path: Path) -> None:
    # 80 rows: whatever the pump had pulled when the connection dropped, rows remain after the
    # uncertain range, so the resumed job always reaches its streaming phase.
    write_rows(tmp_path, 80, bad=[5])
    with pytest.raises(RuntimeError):
        job_for(tmp_path, 8).run(Stream(crash_after=20))
    cp = load(tmp_path / "cp.json")
    assert cp is not None and cp.pending_through is not None
    assert cp.pending_through > cp.done_line  # sent, maybe applied, not known to be
    uncertain = cp.pending_through - cp.done_line
    assert len(list(read_records(tmp_path / "audit.jsonl"))) > cp.rows  # cut on resume

    stream = Stream()
    result = job_for(tmp_path, 8).run(stream)
    assert result.status == "finished"
    lockstep = [line for line in range(cp.done_line + 1, cp.pending_through + 1) if line != 5]
    # While in the uncertain range, the next fact is sent only after the previous decision.
    for k in range(len(lockstep) - 1):
        assert stream.pulled_at_decision[k] == k + 1
    assert max(b - a for a, b in enumerate(stream.pulled_at_decision, 1)) > 1  # then streaming
    assert uncertain >= 8
    assert [r["line"] for r in read_records(tmp_path / "audit.jsonl")] == list(range(1, 81))


def test_a_new_audit_path_on_resume_starts_a_new_file_and_says_it_lacks_rows(
    tmp_path: Path,
) -> None:
    write_rows(tmp_path, 9)
    stop = threading.Event()

    class StopFirst(Batches):
        def decide(self, facts: Sequence[Fact]) -> list[Decision]:
            stop.set()
            return super().decide(facts)

    job = job_for(tmp_path, 3)
    job.stop = stop
    assert job.run(StopFirst()).status == "stopped"
    moved = Job(
        Source.open(tmp_path / "in.jsonl"),
        BackfillSettings(batch=3),
        destination="local:test",
        audit=tmp_path / "elsewhere.jsonl",
        checkpoint=tmp_path / "cp.json",
    )
    result = moved.run(Batches())
    assert result.status == "finished" and result.audit_incomplete
    assert [r["line"] for r in read_records(tmp_path / "elsewhere.jsonl")] == list(range(4, 10))
    assert [r["line"] for r in read_records(tmp_path / "audit.jsonl")] == [1, 2, 3]


def test_public_names_resolve() -> None:
    import importlib

    names = ["engine.backfill" + n for n in ("", ".readers", ".rows", ".checkpoint", ".audit")]
    for name in [*names, "engine.backfill.job", "engine.cli.backfill", "engine.fsutil"]:
        module = importlib.import_module(name)
        for public in module.__all__:
            assert hasattr(module, public), f"{name}.{public}"
