"""``memgate backfill``: load a file of facts through the gate, resumably.

::

    memgate backfill --input facts.jsonl[.gz] | rows.csv | rows.parquet
                     [--map namespace=ns_col,text=body,kind=k,key=attr,metadata=meta,id=row_id]
                     [--namespace NS] [--policy strict|review|review-uncertain|seed|seed-review]
                     [--dry-run] [--batch 256]
                     [--on-error skip|fail] [--audit FILE] [--checkpoint FILE]
                     [--target host:port [--token T] [--tls | --tls-ca PEM]]
                     [--data-dir DIR ...engine flags]

In process by default (the store in ``--data-dir``); with ``--target`` through a running
``memgate serve`` (the streaming Backfill RPC). Ctrl-C stops after the batch in flight, and the
same command resumes; so does a ``kill -9`` (see :mod:`engine.backfill.checkpoint`). The audit
file and the checkpoint default to ``<data dir>/backfill/<input name>.<digest>.*``, the digest
naming the input's path and the destination.

This edge installs signal handlers; nothing below it does (the environment is read by
:mod:`engine.cli.common`).
"""

from __future__ import annotations

import argparse
import hashlib
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.cli.common import (
    add_client_flags,
    add_engine_flags,
    add_policy_file_flag,
    client_from_args,
    engine_settings,
)
from engine.errors import InvalidInput, MemgateError
from engine.gate.policy import POLICY_NAMES

__all__ = ["LOCAL_SPIN", "register"]

LOCAL_SPIN = False
"""The local job's default for ONNX Runtime's spinning: off. Its engine core parses and commits
beside the model, as a server does. Adopted under a rule written before the runs
(docs/experiments/2026-12-05-spinning-default.md, *Local backfill*): ``bench_backfill.py --quick
--no-grpc --facts 4000 --namespaces 40``, 2-core AMD EPYC, in process 105-107 facts/s without
spinning against 90-92 with it (1.16x), the same decisions."""

_INTERRUPTED = 130


def register(subparsers: Any) -> None:
    """Add ``backfill`` to ``memgate``'s subcommands."""
    p = subparsers.add_parser(
        "backfill",
        help="load a JSONL / CSV / Parquet file through the gate (resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--input", required=True, help="JSON Lines (.jsonl, .gz), CSV/TSV or Parquet")
    p.add_argument("--format", choices=["jsonl", "csv", "tsv", "parquet"], help="default: by name")
    p.add_argument(
        "--map",
        dest="field_map",
        help="field=column pairs: namespace, text, kind, key, metadata, id, source "
        "(default: the field's own name; field= switches one off)",
    )
    p.add_argument("--namespace", help="namespace of rows that have none")
    p.add_argument("--policy", choices=list(POLICY_NAMES), help="default: strict")
    add_policy_file_flag(p)
    p.add_argument("--dry-run", action="store_true", help="decide only: store nothing")
    p.add_argument("--batch", type=int, default=256, help="facts per gate batch (default 256)")
    p.add_argument(
        "--on-error",
        choices=["skip", "fail"],
        default="skip",
        help="a bad row is reported and skipped (default), or stops the job",
    )
    p.add_argument(
        "--sync-every",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="most seconds between fsyncs of audit and checkpoint (0: every batch; a kill "
        "loses nothing either way, a power cut may replay up to this much)",
    )
    p.add_argument("--audit", help="audit JSON Lines (default: under <data dir>/backfill/)")
    p.add_argument("--checkpoint", help="checkpoint file (default: under <data dir>/backfill/)")
    p.add_argument(
        "--resume-changed",
        action="store_true",
        help="resume although the input's first 64 KiB changed (you fixed rows after the "
        "checkpoint)",
    )
    p.add_argument(
        "--progress",
        choices=["auto", "on", "off"],
        default="auto",
        help="progress bar on stderr (auto: when stderr is a terminal)",
    )
    # No deadline: a backfill stream lives as long as the file takes.
    add_client_flags(
        p.add_argument_group("remote (through memgate serve)"), timeout=None, target=None
    )
    ray = p.add_argument_group("distributed (Ray; pip install 'memgate[ray]')")
    ray.add_argument("--engine", choices=["local", "ray"], default="local", help="default local")
    ray.add_argument("--address", help="Ray cluster to join (default: start one on this machine)")
    ray.add_argument("--actors", type=int, default=0, help="deciding actors (0: one per CPU)")
    add_engine_flags(p, spin=None, spin_default="off for the local job, on for --engine ray")
    p.set_defaults(func=cmd_backfill)


# -- the command ---------------------------------------------------------------------------------
def cmd_backfill(args: argparse.Namespace) -> int:
    from engine.backfill.job import BackfillSettings, EngineDecider, Job, Source, StreamDecider
    from engine.backfill.readers import columns
    from engine.backfill.rows import parse_map
    from engine.tuning.policy_file import PolicyFileGate, base_name, load_policy_file

    policy_file = load_policy_file(args.policy_file) if args.policy_file else None
    if policy_file is not None and args.target:
        raise InvalidInput(
            "--policy-file applies to the local engine; through --target the server decides "
            "(start it with memgate serve --policy-file)"
        )
    args.policy = base_name(args.policy, policy_file)
    settings = BackfillSettings(
        policy=args.policy,
        dry_run=args.dry_run,
        batch=args.batch,
        on_error=args.on_error,
        fields=parse_map(args.field_map),
        default_namespace=args.namespace,
        resume_changed=args.resume_changed,
        sync_every_s=args.sync_every,
    )
    source = Source.open(Path(args.input), args.format)
    _check_columns(columns(source.path, source.format, source.gzip), settings)
    destination = f"grpc:{args.target}" if args.target else f"local:{Path(args.data_dir).resolve()}"
    audit, checkpoint = _paths(args, source.path, destination)
    stop = threading.Event()
    with _signals(stop):
        job = Job(
            source,
            settings,
            destination=destination,
            audit=audit,
            checkpoint=checkpoint,
            stop=stop,
            progress=_progress(args.progress, source.total),
        )
        previous = job.preflight()  # a wrong command fails before the models load
        if previous is not None and previous.done_line:
            print(
                f"memgate backfill: resuming after line {previous.done_line:,} "
                f"({previous.rows:,} rows done; checkpoint {checkpoint})",
                file=sys.stderr,
            )
        try:
            if args.target:
                with client_from_args(args, timeout=None) as client:
                    result = job.run(StreamDecider(client, args.policy, dry_run=args.dry_run))
            elif args.engine == "ray":
                # Ray's actors run bare Gate.triage calls, nothing beside the model: they spin.
                from engine.backfill.ray_engine import run_from_args

                result = run_from_args(job, args, engine_settings(args))
            else:
                from engine.app import build_engine, open_engine
                from engine.backfill import core_settings
                from engine.core import SyncEngine

                # The local job runs the engine core (parsing and commits beside the model):
                # its sessions sleep between calls unless --spin (LOCAL_SPIN).
                spin = LOCAL_SPIN if args.spin is None else args.spin
                with open_engine(engine_settings(args, spin=spin)) as eng:
                    job.settings = _with_limits(settings, eng.gate.settings)
                    gate = (
                        eng.gate if policy_file is None else PolicyFileGate(eng.gate, policy_file)
                    )
                    with SyncEngine(build_engine(gate, core_settings(args.batch))) as core:
                        decider = EngineDecider(core, args.policy, apply=not args.dry_run)
                        result = job.run(decider)
        except KeyboardInterrupt:
            print(
                "\nmemgate backfill: aborted. Every row up to the last checkpoint is applied "
                "exactly once; run the same command again to resume.",
                file=sys.stderr,
            )
            return _INTERRUPTED
        except MemgateError as exc:
            if not args.dry_run and not isinstance(exc, InvalidInput):
                exc.args = (
                    f"{exc} (the checkpoint {checkpoint} holds every row done: "
                    "run the same command again to resume)",
                )
            raise
    print(summary(result, source.path, destination, args.policy, args.dry_run))
    if result.batch != args.batch:
        print(
            f"memgate backfill: note: kept --batch {result.batch} of the job's first run "
            "(a resumed job cuts the same batches)",
            file=sys.stderr,
        )
    if result.status == "stopped":
        print(
            f"memgate backfill: interrupted; every row up to line {result.done_line:,} is "
            "applied. Run the same command again to resume.",
            file=sys.stderr,
        )
        return _INTERRUPTED
    if result.status == "failed":
        assert result.failed is not None
        print(
            f"memgate backfill: {source.path.name}:{result.failed.line}: {result.failed.error}. "
            "The rows before it are applied; fix the row (or pass --on-error skip) and run the "
            "same command again.",
            file=sys.stderr,
        )
        return 1
    return 0


def _with_limits(settings: Any, gate_settings: Any) -> Any:
    from dataclasses import replace

    return replace(settings, limits=gate_settings)


def _check_columns(names: list[str] | None, settings: Any) -> None:
    """CSV headers and Parquet schemas are known up front: a wrong --map fails now, not as
    one bad row per line."""
    if names is None:
        return
    fmap = settings.fields
    if fmap.text not in names:
        raise InvalidInput(f"the input has no text column {fmap.text!r} (columns: {names})")
    if fmap.namespace not in names and settings.default_namespace is None:
        raise InvalidInput(
            f"the input has no namespace column {fmap.namespace!r} (columns: {names}): "
            "map one (--map namespace=COLUMN) or give --namespace"
        )


def _paths(args: argparse.Namespace, source: Path, destination: str) -> tuple[Path, Path]:
    digest = hashlib.sha256(f"{source}\0{destination}".encode()).hexdigest()[:10]
    base = Path(args.data_dir) / "backfill" / f"{source.name}.{digest}"
    dry = ".dry-run" if args.dry_run else ""
    audit = Path(args.audit) if args.audit else base.with_name(base.name + f"{dry}.audit.jsonl")
    checkpoint = (
        Path(args.checkpoint) if args.checkpoint else base.with_name(base.name + ".checkpoint.json")
    )
    return audit.resolve(), checkpoint.resolve()


@contextmanager
def _signals(stop: threading.Event) -> Iterator[None]:
    """First SIGINT / SIGTERM: stop after the batch in flight. Second SIGINT: abort now."""

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()
        print(
            "\nmemgate backfill: stopping after the batch in flight "
            "(Ctrl-C again to abort now; either way the same command resumes)",
            file=sys.stderr,
            flush=True,
        )

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# -- progress ------------------------------------------------------------------------------------
class _Bar:
    """tqdm on stderr: facts/s, ETA when the row count is known, decisions so far."""

    def __init__(self, total: int | None) -> None:
        self._total = total
        self._bar: Any = None
        self._shown = 0.0
        self._postfix = ""

    def update(self, position: int, postfix: str) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self._total,
                initial=position,
                unit="fact",
                desc="backfill",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
                smoothing=0.1,
            )
        if position > self._bar.n:
            self._bar.update(position - self._bar.n)
        self._postfix = postfix
        now = time.monotonic()
        if now - self._shown >= 0.5:
            self._shown = now
            self._bar.set_postfix_str(postfix, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix, refresh=True)
            self._bar.close()
            self._bar = None


def _progress(mode: str, total: int | None) -> Any:
    if mode == "off" or (mode == "auto" and not sys.stderr.isatty()):
        return None
    return _Bar(total)


# -- summary -------------------------------------------------------------------------------------
def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[f"{c:,}" if isinstance(c, int) else str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str], numeric: Sequence[bool]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    kinds = [isinstance(c, int) for c in rows[0]] if rows else [False] * len(headers)
    out = [line(headers, kinds), line(["-" * w for w in widths], kinds)]
    out += [line(r, kinds) for r in cells]
    return "\n".join(out)


def summary(result: Any, source: Path, destination: str, policy: str, dry_run: bool) -> str:
    """The end-of-job report: totals, decisions per policy and kind, top namespaces."""
    from engine.backfill.audit import AUDIT_ACTIONS

    tally = result.tally
    rate = result.rows_this_run / result.seconds if result.seconds > 0 else 0.0
    head = [
        f"backfill {source.name} -> {destination} (policy {policy}"
        + (", dry run: nothing stored)" if dry_run else ")"),
        f"  {tally.rows:,} rows in the job; this run {result.rows_this_run:,} rows in "
        f"{result.seconds:,.1f} s ({rate:,.1f} facts/s)"
        + (f", resumed after line {result.resumed_after:,}" if result.resumed_after else ""),
    ]
    if result.replayed_this_run:
        head.append(
            f"  {result.replayed_this_run:,} rows replayed: applied by the run that was "
            "stopped, not applied again"
        )
    if result.audit_incomplete:
        head.append("  note: the audit file was shorter than the checkpoint said; it lacks rows")
    head.append(f"  audit: {result.audit}")
    if result.checkpoint is not None:
        head.append(f"  checkpoint: {result.checkpoint}")
    groups = sorted({(p, k) for p, k, _ in tally.by_kind})
    rows: list[list[Any]] = []
    for p, k in groups:
        counts = [tally.by_kind.get((p, k, a), 0) for a in AUDIT_ACTIONS]
        rows.append([p, k, *counts, sum(counts)])
    totals = [tally.actions.get(a, 0) for a in AUDIT_ACTIONS]
    rows.append(["total", "", *totals, sum(totals)])
    out = head + ["", _table(["policy", "kind", *AUDIT_ACTIONS, "rows"], rows)]
    if tally.namespaces:
        top = tally.namespaces.most_common(10)
        facts = sum(tally.namespaces.values())
        ns_rows = [[ns, n, f"{100 * n / facts:.1f}%"] for ns, n in top]
        more = len(tally.namespaces) - len(top)
        out += [
            "",
            f"top namespaces by facts ({len(tally.namespaces):,} namespaces"
            + (f", {more:,} more not shown)" if more > 0 else ")"),
            _table(["namespace", "facts", "share"], ns_rows),
        ]
    return "\n".join(out)
