"""``memgate backfill --engine ray``: the same job as the local backfill, decided by a pool of
Ray actors, each with its own ONNX sessions and in-process engine on the shared store.

::

    Ray Data reader (read_text / read_csv / read_parquet, order preserved)
        -> driver: line numbers, to_row (validation, idempotency keys), route by namespace
        -> actor[p] = partition_of(namespace): decide batches, in order, one call at a time
        -> driver: results back into input order -> audit file -> checkpoint

Only this module imports ``ray``. Pure parts (:func:`partition_of`, :class:`RaySettings`,
:class:`Reorder`) are unit-testable without Ray.

**Within a namespace, facts are decided in input order.** Every row carries its input line.
The driver reads the input in file order (Ray Data with ``preserve_order``) and numbers the
lines itself. Each namespace is owned by exactly one partition, ``sha256(namespace) mod
actors``, and each partition by exactly one live actor. A partition's rows go out in line
order, in batches, to that actor only. The actor runs one call at a time (a synchronous actor
executes one caller's calls in submission order), checks that lines only grow per namespace, and
decides each batch in order with one ``Gate.triage`` (one store transaction). A failed call
poisons its actor, so no later batch of the partition can commit after an earlier one failed.
When an actor dies, the driver makes sure it is dead (``ray.kill``), starts a replacement, and
sends it the partition's unanswered batches again, in the same order. No two processes ever
write one namespace at the same time, so each actor's FAISS index, loaded from the store,
sees every write of its namespaces.

**Exactly once.** The local backfill's idempotency keys (:func:`engine.backfill.rows.to_row`:
``bf:id:<id>`` or ``bf:<job>:<line>``), the same checkpoint (:mod:`engine.backfill.checkpoint`)
and the same audit file (:mod:`engine.backfill.audit`). The audit file is written in input
order. The checkpoint's ``done_line`` says that every row up to it is decided, committed and
audited. Rows after it may have been committed by an actor, in any partition. A restart, after
a worker or the driver was killed, sends them again. The gate looks idempotency keys up before
deciding, so those rows come back as replays with their first result. Because a namespace's
committed rows are always a prefix of its rows (see above), the replays and the new facts of a
namespace never interleave.

Store: a SQLite path (several processes on one file are safe: see the README's
"Guarantees"); a ``postgresql://`` DSN (``--store``) is shared the same way.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from engine.backfill.audit import AuditLog, decision_record, error_record
from engine.backfill.checkpoint import Checkpoint, CheckpointWriter, JobLock, load
from engine.backfill.readers import Record, columns, parse_json_line
from engine.backfill.rows import Row
from engine.errors import Conflict, InvalidInput, MemgateError, Unavailable
from engine.store import is_dsn

if TYPE_CHECKING:
    from engine.app import EngineSettings, OpenedEngine
    from engine.backfill.job import Job, JobResult, RunState, Status

__all__ = [
    "RayBackfill",
    "RaySettings",
    "Reorder",
    "partition_of",
    "run_from_args",
]

_RAY_EXTRA = "pip install 'memgate[ray]'"
_READ_BATCH = 4096
_ACTOR_CPUS = 0.5


@dataclass(frozen=True)
class RaySettings:
    """How the Ray backfill runs. Every field is range-checked."""

    address: str | None = None
    """Ray cluster to join (``ray://host:10001`` or ``host:6379``); None: ``ray.init()`` starts
    one on this machine, with one CPU per core."""
    actors: int = 0
    """Deciding actors, one partition of the namespaces each; 0: one per CPU of the cluster."""
    threads: int = 1
    """ONNX Runtime intra-op threads per actor."""
    in_flight: int = 2
    """Batches queued per actor, so the next one is ready when a batch ends."""
    buffered: int = 4096
    """Most rows read but not yet sent to an actor; full, partial batches are sent."""
    restarts: int = 3
    """Replacement actors per partition before the job fails (it stays resumable)."""
    num_cpus: int | None = None
    """CPUs of a local cluster (None: ``os.cpu_count()``); ignored with ``address``."""

    def __post_init__(self) -> None:
        if not 0 <= self.actors <= 4096:
            raise InvalidInput(f"actors must be in [0, 4096], got {self.actors}")
        if not 1 <= self.threads <= 256:
            raise InvalidInput(f"threads must be in [1, 256], got {self.threads}")
        if not 1 <= self.in_flight <= 64:
            raise InvalidInput(f"in_flight must be in [1, 64], got {self.in_flight}")
        if not 1 <= self.buffered <= 10_000_000:
            raise InvalidInput(f"buffered must be in [1, 10000000], got {self.buffered}")
        if not 0 <= self.restarts <= 1000:
            raise InvalidInput(f"restarts must be in [0, 1000], got {self.restarts}")
        if self.num_cpus is not None and not 1 <= self.num_cpus <= 4096:
            raise InvalidInput(f"num_cpus must be in [1, 4096], got {self.num_cpus}")


def partition_of(namespace: str, partitions: int) -> int:
    """The partition that owns ``namespace``: stable across processes, runs and machines
    (Python's ``hash`` is salted per process)."""
    digest = hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % partitions


class Reorder:
    """Results back into input order: lines are registered as they are read, results arrive
    in any order, and :meth:`ready` hands out the contiguous prefix."""

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._done: dict[int, tuple[Row, dict[str, Any]]] = {}

    def expect(self, line: int) -> None:
        self._order.append(line)

    def put(self, row: Row, record: dict[str, Any]) -> None:
        self._done[row.line] = (row, record)

    def ready(self) -> Iterator[tuple[Row, dict[str, Any]]]:
        while self._order and self._order[0] in self._done:
            yield self._done.pop(self._order.popleft())

    def __len__(self) -> int:
        return len(self._order)


# -- the store ---------------------------------------------------------------------------------
def _check_store(spec: str) -> None:
    """Fail before Ray starts on a store spec no actor could open."""
    if "://" in spec and not is_dsn(spec):
        scheme = spec.split("://", 1)[0]
        raise InvalidInput(
            f"backfill --engine ray: a {scheme}:// store is not supported; give a data "
            "directory (SQLite) or a postgresql:// DSN"
        )


def _open_engine(settings: EngineSettings, store: str) -> OpenedEngine:
    """The actor's engine: its own ONNX sessions and index over the shared store (a SQLite
    file, or a PostgreSQL database whose event log every actor's index follows)."""
    from engine.app import open_engine

    _check_store(store)
    if is_dsn(store):
        return open_engine(replace(settings, store_spec=store))
    return open_engine(settings, db_path=Path(store))


# -- the actor ---------------------------------------------------------------------------------
class Decider:
    """One deciding actor (wrapped by ``ray.remote``): an in-process engine over the shared
    store. One call at a time; a failed call poisons it (see the module docstring)."""

    def __init__(
        self,
        settings: EngineSettings,
        store: str,
        policy: str,
        apply: bool,
        locks: tuple[str, str] | None = None,
    ) -> None:
        # The job's actors lock (shared: the next run waits until every actor of this one is
        # gone) and the partition's lock (exclusive: a replacement waits for the dead actor).
        self._locks = [] if locks is None else [_flock(locks[0], shared=True), _flock(locks[1])]
        self._engine = _open_engine(settings, store)
        self._policy, self._apply = policy, apply
        self._last: dict[str, int] = {}
        self._failed: str | None = None

    def pid(self) -> int:
        return os.getpid()

    def decide(self, rows: Sequence[tuple[int, str | None, Any]]) -> list[dict[str, Any]]:
        """``(line, row id, fact)`` in line order -> their audit records, after the commit."""
        if self._failed is not None:
            raise Unavailable(f"this actor failed earlier ({self._failed}); it decides no more")
        try:
            for line, _, fact in rows:
                if line <= self._last.get(fact.namespace, 0):
                    raise AssertionError(
                        f"line {line} of {fact.namespace!r} arrived after line "
                        f"{self._last[fact.namespace]}: order broken"
                    )
                self._last[fact.namespace] = line
            facts = [fact for _, _, fact in rows]
            result = self._engine.gate.triage(facts, self._policy, apply=self._apply)
        except BaseException as exc:
            self._failed = f"{type(exc).__name__}: {exc}"
            raise
        return [
            decision_record(line, row_id, d)
            for (line, row_id, _), d in zip(rows, result.decisions, strict=True)
        ]

    def close(self) -> None:
        try:
            self._engine.close()
        finally:
            for f in self._locks:
                f.close()


def _flock(path: str, *, shared: bool = False, timeout: float | None = None) -> IO[str]:
    """An open file holding a ``flock`` on ``path`` (released when closed, or by the kernel
    when the process dies, ``kill -9`` included)."""
    import fcntl

    f = open(path, "a+", encoding="utf-8")  # noqa: SIM115
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(f.fileno(), mode | (fcntl.LOCK_NB if deadline is not None else 0))
            return f
        except OSError:
            if deadline is None or time.monotonic() > deadline:
                f.close()
                raise Conflict(
                    f"{path} is still held by a deciding actor of an earlier run of this job; "
                    "wait for Ray to end it, then run the same command again"
                ) from None
            time.sleep(0.1)


# -- reading with Ray Data ---------------------------------------------------------------------
def _dataset(ray_data: Any, job: Job) -> Any:
    """The input as a Ray Dataset of raw values, in file order.

    JSON Lines are read as text lines (``read_text``) and parsed here, like the local reader:
    Arrow's JSON reader would merge the metadata objects of a block into one struct type (every
    row gains the keys of the others, as nulls) and fails the whole file on one bad line. CSV
    cells are read as strings (``05`` stays ``05``), quoted newlines allowed."""
    src = job.source
    path = str(src.path)
    # num_cpus=0: the actors hold the CPUs; a read task waiting for one would stall the job.
    common: dict[str, Any] = {"num_cpus": 0}
    if src.gzip:
        common["arrow_open_stream_args"] = {"compression": "gzip"}
    if src.format == "jsonl":
        return ray_data.read_text(path, drop_empty_lines=False, **common)
    if src.format in ("csv", "tsv"):
        import pyarrow as pa
        import pyarrow.csv as pcsv

        names = columns(src.path, src.format, src.gzip) or []
        return ray_data.read_csv(
            path,
            parse_options=pcsv.ParseOptions(
                delimiter="\t" if src.format == "tsv" else ",", newlines_in_values=True
            ),
            convert_options=pcsv.ConvertOptions(
                column_types={n: pa.string() for n in names}, strings_can_be_null=False
            ),
            **common,
        )
    # Every column: a select_columns step would be a task of its own that waits for a CPU.
    return ray_data.read_parquet(path, **common)


def _records(ds: Any, job: Job) -> Iterator[Record]:
    """Records with the local reader's line numbers: the physical line of a JSON Lines row,
    the first line of a CSV record (the header is line 1; CSV blank lines are dropped by Arrow
    and not counted), the row number of a Parquet row."""
    fmt = job.source.format
    line = 1 if fmt in ("csv", "tsv") else 0
    for batch in ds.iter_batches(batch_size=_READ_BATCH, batch_format="pyarrow"):
        for values in batch.to_pylist():
            line += 1
            if fmt == "jsonl":
                text = values["text"]
                if text.strip():
                    yield parse_json_line(line, text)
                continue
            yield Record(line, values)
            if fmt in ("csv", "tsv"):
                line += sum(v.count("\n") for v in values.values() if isinstance(v, str))


# -- the driver --------------------------------------------------------------------------------
@dataclass
class _Partition:
    index: int
    actor: Any = None
    generation: int = 0
    pending: list[Row] = field(default_factory=list)
    in_flight: deque[tuple[Any, list[Row]]] = field(default_factory=deque)


class RayBackfill:
    """Runs a :class:`~engine.backfill.job.Job` (its source, settings, audit, checkpoint, stop
    event and progress) on Ray. Call :meth:`run` once."""

    def __init__(
        self,
        job: Job,
        engine: EngineSettings,
        store: str,
        settings: RaySettings | None = None,
    ) -> None:
        self.job = job
        self.engine = engine
        self.store = store
        self.settings = settings or RaySettings()
        self.actor_pids: dict[int, int] = {}
        """Partition -> pid of its live actor (tests kill them)."""
        self._ray: Any = None
        self._remote: Any = None

    # -- entry ------------------------------------------------------------------------------
    def run(self) -> JobResult:
        _check_store(self.store)  # a store no actor can open fails before Ray starts
        ray = _import_ray()
        started_ray = False
        if not ray.is_initialized():
            s = self.settings
            ray.init(
                address=s.address,
                num_cpus=None if s.address else (s.num_cpus or os.cpu_count() or 1),
                include_dashboard=False,
                log_to_driver=False,
                logging_level="WARNING",
            )
            started_ray = True
        self._ray = ray
        try:
            if self.job.settings.dry_run:
                return self._run(None)
            self.job.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
            with JobLock(self.job.checkpoint_path):
                return self._run(load(self.job.checkpoint_path))
        finally:
            if started_ray:
                ray.shutdown()

    def _run(self, previous: Checkpoint | None) -> JobResult:
        job = self.job
        run = job.resume_state(previous, batch=job.settings.batch)  # the local job's checks
        partitions: list[_Partition] = []
        try:
            partitions = self._start_actors()
            status, done = self._loop(run.name, run.state.done_line, partitions, run)
        finally:
            self._stop_actors(partitions)
            job.close_run(run)
        return job.result(run, status, done)

    # -- actors -----------------------------------------------------------------------------
    def _actor_count(self) -> int:
        if self.settings.actors:
            return self.settings.actors
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))  # one per core

    def _start_actors(self) -> list[_Partition]:
        parts = [_Partition(i) for i in range(self._actor_count())]
        if not self.job.settings.dry_run:
            # Actors of a killed run of this job may still be deciding: wait until they are
            # gone (each holds this lock shared), so no namespace has two writers.
            _flock(self._lock_path("actors"), timeout=60.0).close()
        for part in parts:
            self._spawn(part)
        # Wait for every engine to load its models: a bad cache fails here, before any row.
        for part in parts:
            self.actor_pids[part.index] = self._get(part.actor.pid.remote())
        return parts

    def _spawn(self, part: _Partition) -> None:
        if self._remote is None:
            # Half a Ray CPU each, spread over the nodes: Ray Data's own steps (file listing,
            # reading) ask for a whole CPU, and with every CPU held by an actor they would wait
            # forever. Each actor runs ``threads`` ONNX threads whatever it reserves.
            options = {
                "num_cpus": _ACTOR_CPUS,
                "max_restarts": 0,
                "max_task_retries": 0,
                "scheduling_strategy": "SPREAD",
            }
            self._remote = self._ray.remote(**options)(Decider)
        session = replace(self.engine.session, intra_op_threads=self.settings.threads)
        locks = (
            None
            if self.job.settings.dry_run
            else (self._lock_path("actors"), self._lock_path(f"p{part.index}"))
        )
        part.actor = self._remote.remote(
            replace(self.engine, session=session),
            self.store,
            self.job.settings.policy,
            not self.job.settings.dry_run,
            locks,
        )

    def _lock_path(self, what: str) -> str:
        # Next to the checkpoint: the SQLite store and its actors are on this machine.
        cp = self.job.checkpoint_path
        return str(cp.with_name(f"{cp.name}.{what}.lock"))

    def _replace(self, part: _Partition, exc: BaseException) -> None:
        """The partition's actor died: make sure it is gone, start another one, and send it the
        unanswered batches again, in order."""
        ray = self._ray
        if part.generation >= self.settings.restarts:
            raise Unavailable(
                f"backfill actor {part.index} died {part.generation + 1} times (last: "
                f"{type(exc).__name__}); the checkpoint holds every row done: run the same "
                "command again to resume"
            )
        ray.kill(part.actor, no_restart=True)
        part.generation += 1
        self._spawn(part)
        self.actor_pids[part.index] = self._get(part.actor.pid.remote())
        batches = [rows for _, rows in part.in_flight]
        part.in_flight.clear()
        for rows in batches:
            self._send(part, rows)

    def _stop_actors(self, parts: Sequence[_Partition]) -> None:
        ray = self._ray
        closing = []
        for part in parts:
            if part.actor is not None:
                closing.append(part.actor.close.remote())
        if closing:
            try:
                ray.wait(closing, num_returns=len(closing), timeout=60)
            finally:
                for part in parts:
                    ray.kill(part.actor, no_restart=True)

    def _get(self, ref: Any) -> Any:
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            raise cause if isinstance(cause, MemgateError) else exc from None

    # -- the loop ---------------------------------------------------------------------------
    def _send(self, part: _Partition, rows: list[Row]) -> None:
        payload = [(r.line, r.row_id, r.fact) for r in rows]
        part.in_flight.append((part.actor.decide.remote(payload), rows))

    def _loop(
        self, name: str, done_line: int, parts: list[_Partition], run: RunState
    ) -> tuple[Status, int]:
        job, s, rs = self.job, self.job.settings, self.settings
        writer, audit = run.writer, run.audit
        reorder = Reorder()
        buffered = read = 0
        done = done_line
        ds = _dataset(_import_ray_data(), job)
        try:
            for rec in _records(ds, job):
                if job.stop.is_set():
                    break
                if rec.line <= done_line:
                    continue  # resumed: done before
                row = job.row(rec, name)
                if row.fact is None and s.on_error == "fail":
                    job.fail(row)
                    break
                reorder.expect(row.line)
                if row.fact is None:
                    assert row.error is not None
                    reorder.put(row, error_record(row.line, row.row_id, row.error, s.policy))
                else:
                    part = parts[partition_of(row.fact.namespace, len(parts))]
                    part.pending.append(row)
                    buffered += 1
                    if len(part.pending) >= s.batch and len(part.in_flight) < rs.in_flight:
                        buffered -= self._flush(part, s.batch)
                read += 1
                if read % 64 == 0:  # now and then, take the answers that are in
                    self._collect(parts, reorder, block=False)
                    for p in parts:
                        if len(p.pending) >= s.batch and self._free(p):
                            buffered -= self._flush(p, s.batch)
                while buffered >= rs.buffered:
                    sent = sum(self._flush(p, s.batch) for p in parts if self._free(p))
                    buffered -= sent
                    if not sent:
                        self._collect(parts, reorder)
                done = self._drain_ready(reorder, writer, audit, done)
        except Exception as exc:
            if _is_read_error(exc):
                raise InvalidInput(
                    f"{job.source.path.name}: Ray's {job.source.format} reader failed "
                    f"({_short(exc)}); every row up to line {done:,} is applied. "
                    "`--engine local` reports bad rows one by one"
                ) from None
            raise
        # The end of the input: send what is left. A stop: send nothing more. Either way, wait
        # for every batch in flight (rows never sent stay after done_line: a resume sends them).
        for p in parts if job.stop.is_set() else ():
            p.pending.clear()
        while any(p.pending or p.in_flight for p in parts):
            for p in parts:
                if self._free(p):
                    self._flush(p, s.batch)
            self._collect(parts, reorder)
            done = self._drain_ready(reorder, writer, audit, done)
        done = self._drain_ready(reorder, writer, audit, done)
        return job.end(writer, audit, done), done

    def _free(self, part: _Partition) -> bool:
        return bool(part.pending) and len(part.in_flight) < self.settings.in_flight

    def _flush(self, part: _Partition, batch: int) -> int:
        """Send the partition's next batch (possibly partial); the rows it took."""
        rows, part.pending = part.pending[:batch], part.pending[batch:]
        if rows:
            self._send(part, rows)
        return len(rows)

    def _collect(self, parts: list[_Partition], reorder: Reorder, *, block: bool = True) -> None:
        """Take the answered oldest batches of the partitions (``block``: wait for one).
        Only a partition's oldest batch is waited on: its actor answers them in order."""
        ray = self._ray
        heads = {id(p.in_flight[0][0]): p for p in parts if p.in_flight}
        if not heads:
            return
        refs = [p.in_flight[0][0] for p in heads.values()]
        ready, _ = ray.wait(
            refs, num_returns=1 if block else len(refs), timeout=None if block else 0
        )
        for ref in ready:
            part = heads[id(ref)]
            try:
                records = self._get(ref)
            except ray.exceptions.RayActorError as exc:
                self._replace(part, exc)
                continue
            _, rows = part.in_flight.popleft()
            for row, record in zip(rows, records, strict=True):
                reorder.put(row, record)

    def _drain_ready(
        self, reorder: Reorder, writer: CheckpointWriter, audit: AuditLog, done: int
    ) -> int:
        line = self.job.record_batch(writer, audit, reorder.ready())
        return done if line is None else line


def _is_read_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return any(k in text for k in ("ArrowInvalid", "UnicodeDecodeError", "CSV parse error"))


def _short(exc: BaseException) -> str:
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    return lines[-1][:300] if lines else type(exc).__name__


# -- Ray, imported here only -------------------------------------------------------------------
def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InvalidInput(f"backfill --engine ray needs Ray: {_RAY_EXTRA}") from None
    return ray


def _import_ray_data() -> Any:
    try:
        import ray.data as ray_data
    except ImportError:
        raise InvalidInput(f"backfill --engine ray needs Ray Data: {_RAY_EXTRA}") from None
    ctx = ray_data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # the file's order is the rows' order
    ctx.enable_progress_bars = False
    return ray_data


def run_from_args(job: Job, args: Any, engine: EngineSettings) -> JobResult:
    """``memgate backfill --engine ray``: the CLI's hook (engine/backfill/cli.py)."""
    store = getattr(args, "store", None) or str(Path(args.data_dir) / "memgate.db")
    settings = RaySettings(
        address=args.address,
        actors=args.actors,
        threads=args.threads if args.threads > 0 else 1,
    )
    job.settings = replace(job.settings, limits=engine.gate)  # rows checked as the gate will
    return RayBackfill(job, engine, store, settings).run()
