"""A backfill job: rows of a file -> gate decisions, in file order, exactly once.

::

    reader (records, in line order) -> to_row (validate, idempotency key) -> chunks of N facts
        -> decider (in-process gate batch, or the gRPC Backfill stream)
        -> audit file (flushed) -> checkpoint (atomic rename; both fsynced about once a second)

Order within a namespace is kept because batches go to the gate in file order and the gate
decides a batch in order (the server's Backfill stream does the same, fact by fact).

Exactly once: every fact carries an idempotency key (:mod:`engine.backfill.rows`), the store
commits a gate batch in one transaction together with its idempotency records, and the
checkpoint (:mod:`engine.backfill.checkpoint`) is written only after the batch's commit and its
audit lines. A job killed at any moment and started again replays what may have been applied
(``pending_through``) as replays of the first result, then goes on.

The deciders are collaborators: :class:`EngineDecider` (in process, the engine core's stream:
the same dynamic batching, admission and per-fact release as the server), :class:`StreamDecider`
(``MemgateClient.backfill``) and :class:`GateDecider` (one bare ``Gate.triage`` per batch, no
core); tests pass their own.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, cast

from engine.backfill.audit import AuditLog, Tally, decision_record, error_record
from engine.backfill.checkpoint import Checkpoint, CheckpointWriter, JobLock, load
from engine.backfill.readers import (
    Format,
    Record,
    count_rows,
    detect_format,
    fingerprint,
    read_records,
)
from engine.backfill.rows import FieldMap, Row, to_row
from engine.errors import InvalidInput
from engine.gate.gate import GateSettings
from engine.gate.policy import POLICY_NAMES
from engine.types import Decision, Fact

__all__ = [
    "BackfillSettings",
    "BatchDecider",
    "EngineDecider",
    "GateDecider",
    "Job",
    "JobResult",
    "NullProgress",
    "Progress",
    "RunState",
    "Source",
    "StreamDecider",
    "core_settings",
    "StreamingDecider",
]

_MAX_BATCH = 2048


@dataclass(frozen=True)
class BackfillSettings:
    """How a job reads and decides. Every field is range-checked."""

    policy: str = "strict"
    """A policy name (``engine.gate.policy.POLICY_NAMES``: strict, review, review-uncertain,
    seed, seed-review)."""
    dry_run: bool = False
    """Decide only: nothing is stored, no checkpoint is kept (each batch is decided against the
    store as it was, not against earlier batches of the file)."""
    batch: int = 256
    """Facts per gate batch in process; over gRPC, facts per checkpoint (two batches are kept
    in flight on the stream: match the server's ``--max-batch-facts``)."""
    on_error: Literal["skip", "fail"] = "skip"
    """A bad row is reported and skipped, or stops the job (rows before it are applied)."""
    fields: FieldMap = field(default_factory=FieldMap)
    default_namespace: str | None = None
    """Namespace of rows without one (no namespace column, or an empty cell)."""
    sync_every_s: float = 1.0
    """Most seconds between fsyncs of the audit file and the checkpoint (0: every batch). A
    kill loses nothing either way; after a power cut up to this much is replayed."""
    resume_changed: bool = False
    """Resume although the input's first 64 KiB changed since the checkpoint."""
    limits: GateSettings = field(default_factory=GateSettings)
    """Text and metadata limits rows are validated against (the gate's)."""

    def __post_init__(self) -> None:
        if self.policy not in POLICY_NAMES:
            choices = ", ".join(POLICY_NAMES)
            raise InvalidInput(f"policy must be one of {choices}, got {self.policy!r}")
        if not 1 <= self.batch <= _MAX_BATCH:
            raise InvalidInput(f"batch must be in [1, {_MAX_BATCH}], got {self.batch}")
        if not 0.0 <= self.sync_every_s <= 3600.0:
            raise InvalidInput(f"sync_every_s must be in [0, 3600], got {self.sync_every_s}")
        if self.on_error not in ("skip", "fail"):
            raise InvalidInput(f"on_error must be skip or fail, got {self.on_error!r}")


@dataclass(frozen=True)
class Source:
    """The input file: format, job name, row count (None: unknown)."""

    path: Path
    format: Format
    gzip: bool
    job: str
    total: int | None

    @classmethod
    def open(cls, path: Path, fmt: str | None = None, *, count: bool = True) -> Source:
        path = Path(path).resolve()
        if not path.is_file():
            raise InvalidInput(f"no such input file: {path}")
        kind, gz = detect_format(path, fmt)
        total = count_rows(path, kind, gz) if count else None
        return cls(path, kind, gz, fingerprint(path), total)

    def position(self, line: int) -> int:
        """Progress position of a record line (CSV: the header is not a row)."""
        return max(0, line - 1) if self.format in ("csv", "tsv") else line


class BatchDecider(Protocol):
    """Decides (and, unless dry run, commits) one batch, all or nothing."""

    def decide(self, facts: Sequence[Fact]) -> list[Decision]: ...


class StreamingDecider(Protocol):
    """Decides a stream of facts; a decision comes back only once its fact is committed."""

    def decide_stream(self, facts: Iterable[Fact]) -> Iterator[Decision]: ...


class GateDecider:
    """In process: one ``Gate.triage`` call (one store transaction) per batch."""

    def __init__(self, gate: Any, policy: str, *, apply: bool) -> None:
        self._gate, self._policy, self._apply = gate, policy, apply

    def decide(self, facts: Sequence[Fact]) -> list[Decision]:
        return list(self._gate.triage(facts, self._policy, apply=self._apply).decisions)


def core_settings(batch: int) -> Any:
    """The engine core an in-process job runs on: batches of up to ``batch`` facts of its one
    stream, two batches in flight. The server's default (``QueueSettings.max_source_facts``
    = 1) releases a remote stream's decisions fact by fact, but a local job has no caller
    waiting on each decision and checkpoints per batch: one-fact batches ran it at about a
    fifth of batch triage's facts/s (``benchmarks/bench_backfill.py``)."""
    from engine.core import CoreSettings, QueueSettings

    return CoreSettings(
        batching=QueueSettings(max_batch_facts=batch, max_source_facts=batch),
        stream_window=2 * batch,
        max_queued_facts=max(1024, 2 * batch),
    )


class EngineDecider:
    """In process, through the engine core (:class:`engine.core.SyncEngine`): the stream path
    the server's Backfill uses (with the job's batch size: :func:`core_settings`)."""

    def __init__(self, engine: Any, policy: str, *, apply: bool) -> None:
        self._engine, self._policy, self._apply = engine, policy, apply

    def decide_stream(self, facts: Iterable[Fact]) -> Iterator[Decision]:
        for item in self._engine.stream(facts, self._policy, apply=self._apply):
            yield item.decision


class StreamDecider:
    """Over gRPC: the ``Backfill`` stream of a :class:`~engine.client.MemgateClient`."""

    def __init__(self, client: Any, policy: str, *, dry_run: bool) -> None:
        self._client, self._policy, self._dry_run = client, policy, dry_run

    def decide_stream(self, facts: Iterable[Fact]) -> Iterator[Decision]:
        return iter(self._client.backfill(facts, self._policy, dry_run=self._dry_run))


class Progress(Protocol):
    def update(self, position: int, postfix: str) -> None: ...

    def close(self) -> None: ...


class NullProgress:
    def update(self, position: int, postfix: str) -> None:
        pass

    def close(self) -> None:
        pass


Status = Literal["finished", "stopped", "failed"]


@dataclass
class JobResult:
    status: Status
    """finished (the end of the input); stopped (interrupted, resumable); failed (a bad row
    with on_error=fail: the rows before it are applied)."""
    tally: Tally
    """Decisions of the whole job (rebuilt from the audit file when resumed)."""
    rows_this_run: int = 0
    replayed_this_run: int = 0
    seconds: float = 0.0
    resumed_after: int = 0
    """Input line the run started after (0: from the start)."""
    failed: Row | None = None
    audit: Path | None = None
    checkpoint: Path | None = None
    audit_incomplete: bool = False
    """The audit file was shorter than the checkpoint said: rows before this run are missing."""
    done_line: int = 0
    """Every input line up to this one is done (the checkpoint's ``done_line``)."""
    batch: int = 0
    """The batch size used (in process, a resumed job keeps the one of its first run)."""


@dataclass(frozen=True)
class RunState:
    """One run of a job, opened by :meth:`Job.resume_state`."""

    name: str
    """The job's name (the first run's input fingerprint): it keys the rows' idempotency."""
    state: Checkpoint
    """The checkpoint as the run starts."""
    writer: CheckpointWriter
    audit: AuditLog
    resumed: bool
    """The run continues after a done line of an earlier run."""
    incomplete: bool
    """The audit file lacks rows of earlier runs (see ``JobResult.audit_incomplete``)."""
    started: float
    """``time.perf_counter()`` at the start."""


class Job:
    """One backfill of one input into one destination. Call :meth:`run` once."""

    def __init__(
        self,
        source: Source,
        settings: BackfillSettings,
        *,
        destination: str,
        audit: Path,
        checkpoint: Path,
        stop: threading.Event | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.source = source
        self.settings = settings
        self.destination = destination
        self.audit_path = Path(audit)
        self.checkpoint_path = Path(checkpoint)
        self.stop = stop or threading.Event()
        self.progress: Progress = progress or NullProgress()
        self._failed: Row | None = None
        self._tally = Tally()
        self._rows = 0
        self._replayed = 0
        self._batch = settings.batch
        self._synced = 0.0

    # -- entry ------------------------------------------------------------------------------
    def preflight(self) -> Checkpoint | None:
        """The checkpoint this job would resume, checked against the command (raises
        ``InvalidInput`` on a mismatch). Cheap: call it before loading models."""
        if self.settings.dry_run:
            return None
        previous = load(self.checkpoint_path)
        if previous is not None:
            self._check(previous)
        return previous

    def run(self, decider: BatchDecider | StreamingDecider) -> JobResult:
        """Run to the end of the input, to a stop request, or to a bad row (on_error=fail)."""
        if self.settings.dry_run:
            return self._run(decider, None)
        self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        with JobLock(self.checkpoint_path):
            return self._run(decider, load(self.checkpoint_path))

    def _run(
        self, decider: BatchDecider | StreamingDecider, previous: Checkpoint | None
    ) -> JobResult:
        streaming = hasattr(decider, "decide_stream")
        # In process, a job keeps the batch size of its first run: resumed, it cuts the same
        # batches again (see engine.backfill.checkpoint).
        batch = previous.batch if previous is not None and not streaming else self.settings.batch
        run = self.resume_state(previous, batch=batch)
        rows = self._read(run.name, start_after=run.state.done_line)
        state = run.state
        pending = state.pending_through if (state.pending_through or 0) > state.done_line else None
        try:
            if streaming:
                stream = cast(StreamingDecider, decider)
                status = self._run_stream(stream, rows, run.writer, run.audit, pending)
            else:
                batches = cast(BatchDecider, decider)
                status = self._run_batches(batches, rows, run.writer, run.audit, pending)
        finally:
            self.close_run(run)
        return self.result(run, status, run.writer.state.done_line)

    # -- a run's state (shared with the Ray driver, engine.backfill.ray_engine) --------------
    def resume_state(self, previous: Checkpoint | None, *, batch: int) -> RunState:
        """Open a run: the checkpoint to continue (``previous``, checked against this
        command) or a new one, its writer, the audit file cut back to the checkpoint, and the
        tally rebuilt from it. ``batch``: the batch size this run cuts (kept in the
        checkpoint). Close it with :meth:`close_run`."""
        s = self.settings
        started = time.perf_counter()
        if previous is not None:
            self._check(previous)
        name = previous.job if previous is not None else self.source.job
        self._batch = batch
        state = previous or Checkpoint(
            job=name,
            input=str(self.source.path),
            destination=self.destination,
            policy=s.policy,
            fields=s.fields.describe(),
            audit=str(self.audit_path),
            batch=s.batch,
        )
        # The audit file continues where the checkpoint says; one given anew starts empty.
        same_audit = previous is not None and previous.audit == str(self.audit_path)
        state = replace(
            state,
            audit=str(self.audit_path),
            audit_offset=state.audit_offset if same_audit else 0,
            batch=batch,
            head=self.source.job,
            finished=False,
        )
        writer = CheckpointWriter(self.checkpoint_path, state, enabled=not s.dry_run)
        resumed = previous is not None and previous.done_line > 0
        audit = AuditLog(self.audit_path, truncate_to=state.audit_offset if same_audit else None)
        if same_audit and not audit.short:
            self._tally = Tally.from_audit(self.audit_path, state.audit_offset)
        self._rows = state.rows
        self.progress.update(self.source.position(state.done_line), self._tally.postfix())
        return RunState(
            name=name,
            state=state,
            writer=writer,
            audit=audit,
            resumed=resumed,
            incomplete=audit.short or (resumed and not same_audit),
            started=started,
        )

    def close_run(self, run: RunState) -> None:
        run.writer.close()
        run.audit.close()
        self.progress.close()

    def result(self, run: RunState, status: Status, done_line: int) -> JobResult:
        return JobResult(
            status,
            self._tally,
            rows_this_run=self._rows - run.state.rows,
            replayed_this_run=self._replayed,
            seconds=time.perf_counter() - run.started,
            resumed_after=run.state.done_line if run.resumed else 0,
            failed=self._failed,
            audit=self.audit_path,
            checkpoint=None if self.settings.dry_run else self.checkpoint_path,
            audit_incomplete=run.incomplete,
            done_line=done_line,
            batch=self._batch,
        )

    def row(self, rec: Record, job: str) -> Row:
        """A read record as a row of job ``job`` (validated, with its idempotency key)."""
        if rec.values is None:
            return Row(rec.line, None, None, rec.error)
        s = self.settings
        return to_row(
            rec.line,
            rec.values,
            s.fields,
            job=job,
            source=f"backfill:{self.source.path.name}",
            settings=s.limits,
            default_namespace=s.default_namespace,
        )

    def fail(self, row: Row) -> None:
        """Stop at a bad row (``on_error=fail``): the run ends ``failed``."""
        self._failed = row

    def record(self, audit: AuditLog, row: Row, record: dict[str, Any]) -> int:
        """Audit one row (in input order) and count it; its line."""
        audit.write(record)
        self._tally.add(record)
        self._rows += 1
        if record.get("replayed"):
            self._replayed += 1
        return row.line

    def record_batch(
        self,
        writer: CheckpointWriter,
        audit: AuditLog,
        done: Iterable[tuple[Row, dict[str, Any]]],
        **extra: Any,
    ) -> int | None:
        """Audit rows that are done (in input order), then one checkpoint after the last; its
        line (None: no row). ``extra``: more checkpoint fields (``pending_through``)."""
        line = None
        for row, record in done:
            line = self.record(audit, row, record)
        if line is not None:
            self.commit_point(writer, audit, line, **extra)
        return line

    def _check(self, cp: Checkpoint) -> None:
        s = self.settings
        where = f"checkpoint {self.checkpoint_path}"
        problems = []
        if cp.input != str(self.source.path):
            problems.append(f"it is for input {cp.input}")
        if cp.destination != self.destination:
            problems.append(f"it is for destination {cp.destination}")
        if cp.policy != s.policy:
            problems.append(f"it was written with --policy {cp.policy}")
        if cp.fields != s.fields.describe():
            problems.append(f"it was written with another --map ({_map_str(cp.fields)})")
        if problems:
            raise InvalidInput(
                f"{where} does not match this command: {'; '.join(problems)}. Run the same "
                "command as before, or remove the checkpoint to start the job over"
            )
        if (cp.head or cp.job) != self.source.job and not s.resume_changed:
            raise InvalidInput(
                f"the input changed since {where} was written (its first 64 KiB differ). "
                f"If only rows after line {cp.done_line} changed, add --resume-changed; "
                "to start over, remove the checkpoint"
            )

    # -- rows -------------------------------------------------------------------------------
    def _read(self, job: str, start_after: int) -> Iterator[Row]:
        s = self.settings
        src = self.source
        for rec in read_records(
            src.path, src.format, src.gzip, start_after=start_after, fields=s.fields.columns()
        ):
            row = self.row(rec, job)
            if row.fact is None and s.on_error == "fail":
                self.fail(row)
                return
            yield row

    def _chunks(self, rows: Iterator[Row], first_through: int | None) -> Iterator[list[Row]]:
        """Rows cut after every ``batch``-th fact. ``first_through``: the first chunk is exactly
        the rows up to that line (the batch a killed run may have committed)."""
        chunk: list[Row] = []
        facts = 0
        for row in rows:
            if first_through is not None and row.line > first_through:
                first_through = None
                if chunk:
                    yield chunk
                    chunk, facts = [], 0
            chunk.append(row)
            if row.fact is not None:
                facts += 1
            if first_through is None and facts >= self._batch:
                yield chunk
                chunk, facts = [], 0
        if chunk:
            yield chunk

    # -- audit ------------------------------------------------------------------------------
    def _record_of(self, row: Row, decision: Decision | None) -> dict[str, Any]:
        if decision is None:
            assert row.error is not None
            return error_record(row.line, row.row_id, row.error, self.settings.policy)
        return decision_record(row.line, row.row_id, decision)

    def commit_point(
        self,
        writer: CheckpointWriter,
        audit: AuditLog,
        line: int,
        *,
        final: bool = False,
        **extra: Any,
    ) -> None:
        """Every row up to ``line`` is audited: sync the audit file and save the checkpoint
        (fsynced about once every ``sync_every_s``, and always when ``final``)."""
        now = time.monotonic()
        durable = final or now - self._synced >= self.settings.sync_every_s
        if durable:
            self._synced = now
        offset = audit.sync(durable)
        writer.save(durable, done_line=line, audit_offset=offset, rows=self._rows, **extra)
        self.progress.update(self.source.position(line), self._tally.postfix())

    def end(self, writer: CheckpointWriter, audit: AuditLog, line: int) -> Status:
        """The last checkpoint of a run (durable): stopped, failed or finished."""
        status: Status
        if self.stop.is_set():
            status = "stopped"
        elif self._failed is not None:
            status = "failed"
        else:
            status = "finished"
        self.commit_point(
            writer, audit, line, final=True, finished=status == "finished", pending_through=None
        )
        if status == "finished" and self.source.total is not None:
            self.progress.update(self.source.total, self._tally.postfix())
        return status

    # -- in process -------------------------------------------------------------------------
    def _run_batches(
        self,
        decider: BatchDecider,
        rows: Iterator[Row],
        writer: CheckpointWriter,
        audit: AuditLog,
        pending: int | None,
    ) -> Status:
        chunks = self._chunks(rows, pending)
        current = next(chunks, None) if not self.stop.is_set() else None
        done = writer.state.done_line
        if current is not None:
            writer.reserve(current[-1].line)
        while current is not None:
            facts = [r.fact for r in current if r.fact is not None]
            decisions = iter(decider.decide(facts) if facts else [])
            records = [
                (row, self._record_of(row, None if row.fact is None else next(decisions)))
                for row in current
            ]
            done = current[-1].line
            nxt = None if self.stop.is_set() else next(chunks, None)
            # One checkpoint write per batch: this batch done, the next one reserved.
            self.record_batch(
                writer, audit, records, pending_through=None if nxt is None else nxt[-1].line
            )
            current = nxt
        return self.end(writer, audit, done)

    # -- over gRPC --------------------------------------------------------------------------
    def _run_stream(
        self,
        decider: StreamingDecider,
        rows: Iterator[Row],
        writer: CheckpointWriter,
        audit: AuditLog,
        pending: int | None,
    ) -> Status:
        """Facts stream out while decisions stream back, a checkpoint every ``batch``
        decisions. At most two batches are in flight, so the server cuts its next batch while
        the current one is in the model. The rows a killed run may have sent (``pending``) go
        one at a time, each after the previous one's decision, so a replayed fact never shares
        a server batch with a new fact of the same stream."""
        every = self._batch
        window = 2 * every
        queue: deque[Row] = deque()  # rows sent (or bad), oldest first
        flow = threading.Condition()
        in_flight = [0]
        closed = [False]
        lockstep = pending or 0

        def facts() -> Iterator[Fact]:
            for chunk in self._chunks(rows, None):
                if closed[0]:
                    return
                writer.reserve(chunk[-1].line)
                for row in chunk:
                    if self.stop.is_set() or closed[0]:
                        return
                    if row.fact is None:
                        queue.append(row)
                        continue
                    limit = 1 if row.line <= lockstep else window
                    with flow:
                        while in_flight[0] >= limit and not closed[0]:
                            flow.wait()
                        if closed[0]:
                            return
                        in_flight[0] += 1
                    queue.append(row)
                    yield row.fact

        done = writer.state.done_line
        since = 0
        try:
            for decision in decider.decide_stream(facts()):
                with flow:
                    in_flight[0] -= 1
                    flow.notify_all()
                while queue and queue[0].fact is None:
                    done = self._audit_row(audit, queue.popleft(), None)
                done = self._audit_row(audit, queue.popleft(), decision)
                self.progress.update(self.source.position(done), self._tally.postfix())
                since += 1
                if since >= every:
                    since = 0
                    self.commit_point(writer, audit, done)
        finally:
            with flow:
                closed[0] = True
                flow.notify_all()
        while queue:  # bad rows after the last fact
            done = self._audit_row(audit, queue.popleft(), None)
        return self.end(writer, audit, done)

    def _audit_row(self, audit: AuditLog, row: Row, decision: Decision | None) -> int:
        return self.record(audit, row, self._record_of(row, decision))


def _map_str(fields: dict[str, Any]) -> str:
    return ",".join(f"{k}={v or ''}" for k, v in fields.items())
