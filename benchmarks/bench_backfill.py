"""Backfill benchmark: ``memgate backfill`` facts/s against plain batch triage, in the same run.

The data: ``--facts`` synthetic facts (default 100,000) over ``--namespaces`` namespaces (default
1,000), from ``_common.Corpus``: per namespace, memory-like statements first, then incoming facts
that update, repeat or add to them (about half updates), namespaces interleaved in file order
with each namespace's own order kept. Written as JSON Lines with an ``id`` per row.

Three runs, each into a fresh store, with the same models (fp32 MiniLM, the int8 NLI model):

1. **baseline**: ``gate.triage(batch, apply=True)`` over the same facts in batches of
   ``--batch``: no reader, no validation, no idempotency keys, no audit, no checkpoint;
2. **in process**: the backfill job as ``memgate backfill`` runs it (reader, validation,
   idempotency keys, audit file with an fsync and an atomic checkpoint per batch), through the
   engine core's stream (``engine.core.SyncEngine``) with its batches of up to ``--batch``
   facts (``engine.backfill.core_settings``; the server's stream releases decisions fact by
   fact instead);
3. **gRPC**: ``memgate serve`` in a subprocess on a free loopback port, and the same job
   through the streaming Backfill RPC. The server runs with ``--max-batch-facts`` = ``--batch``
   and a backfill window of two batches (the job keeps two in flight). When the server does
   not come up, this part is skipped with a line saying why;
4. **stream latency**: on the same server, idle, one Backfill stream of ``--latency-facts``
   (default 1,000) fresh facts: time from opening the stream to the first decision, and the
   gaps between consecutive decisions (p50 / p99 / max) against the per-fact model time the
   responses' timings report (the model call's phases / its facts).

The baseline is measured again at the end; the ratios are to the mean of both (their difference
shows how busy the machine was). Targets: in process / gRPC >= 0.95 (the local job is never
the slower path); first decision within 1 s; p99 gap <= 2x the per-fact model time. Prints a
table and writes JSON to ``benchmarks/results/``.

    python benchmarks/bench_backfill.py --quick     # 10,000 facts over 100 namespaces
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    ROOT,
    Corpus,
    add_common_args,
    fmt,
    manifest_summary,
    run_header,
    shared_machine_note,
    table,
    write_json,
)

TARGETS: dict[str, float] = {}
IN_PROCESS_OVER_GRPC = 0.95
FIRST_DECISION_S = 1.0
GAP_OVER_MODEL = 2.0


# -- data ----------------------------------------------------------------------------------------
def build_rows(facts: int, namespaces: int, seed: int) -> list[dict[str, Any]]:
    """``facts`` rows over ``namespaces``: per namespace 40% statements, then 60% incoming facts
    about them; namespaces interleaved at random, each one's order kept."""
    corpus = Corpus(seed)
    per_ns = [facts // namespaces + (1 if i < facts % namespaces else 0) for i in range(namespaces)]
    streams: list[list[str]] = []
    for i, n in enumerate(per_ns):
        ns = f"bench/tenant{i:04d}"
        stored = corpus.memories(max(1, (n * 2) // 5), namespace=ns, salt=i)
        incoming = corpus.incoming(stored, n - len(stored), salt=10_000 + i)
        streams.append([s.text for s in stored] + [f.text for f in incoming])
    rng = random.Random(seed)
    order = [i for i, s in enumerate(streams) for _ in s]
    rng.shuffle(order)
    cursor = [0] * namespaces
    rows = []
    for n, i in enumerate(order, 1):
        text = streams[i][cursor[i]]
        cursor[i] += 1
        rows.append({"id": f"f{n}", "namespace": f"bench/tenant{i:04d}", "text": text})
    return rows


# -- the runs ------------------------------------------------------------------------------------
def engine_settings(args: argparse.Namespace, data_dir: Path) -> Any:
    from engine.app import EngineSettings
    from engine.runtime.loader import ModelChoice
    from engine.runtime.session import SessionSettings

    return EngineSettings(
        data_dir=data_dir,
        cache_dir=Path(args.cache_dir),
        models=ModelChoice(nli=args.nli, nli_variant=args.nli_variant),
        session=SessionSettings(intra_op_threads=args.threads, allow_spinning=args.spin),
    )


def fresh_gate(engine: Any, data_dir: Path) -> tuple[Any, Any]:
    """A gate over a fresh store, sharing the loaded model sessions."""
    from engine.gate.gate import Gate
    from engine.index import IndexManager, IndexSettings
    from engine.store import SQLiteStore

    data_dir.mkdir(parents=True)
    store = SQLiteStore(data_dir / "memgate.db")
    index = IndexManager(store.iter_active_embeddings, IndexSettings(threads=1))
    return Gate(store, index, engine.gate.embedder, engine.gate.nli), store


def run_baseline(engine: Any, work: Path, facts: list[Any], batch: int) -> dict[str, Any]:
    gate, store = fresh_gate(engine, work)
    actions: Counter[str] = Counter()
    t0 = time.perf_counter()
    try:
        for i in range(0, len(facts), batch):
            result = gate.triage(facts[i : i + batch], "strict", apply=True)
            actions.update(d.action for d in result.decisions)
        seconds = time.perf_counter() - t0
    finally:
        store.close()
    return {"facts": len(facts), "seconds": seconds, "actions": dict(actions)}


def run_job(decider: Any, src: Path, work: Path, destination: str, batch: int) -> dict[str, Any]:
    from engine.backfill import BackfillSettings, Job, Source

    work.mkdir(parents=True, exist_ok=True)
    job = Job(
        Source.open(src),
        BackfillSettings(batch=batch),
        destination=destination,
        audit=work / "audit.jsonl",
        checkpoint=work / "checkpoint.json",
    )
    t0 = time.perf_counter()
    result = job.run(decider)
    seconds = time.perf_counter() - t0
    if result.status != "finished":
        raise SystemExit(f"the backfill did not finish: {result.status}")
    actions = {a: n for a, n in result.tally.actions.items() if n}
    return {"facts": result.tally.rows, "seconds": seconds, "actions": actions}


def core_settings(batch: int) -> Any:
    """What ``memgate backfill --batch B`` runs in process (``engine.backfill.core_settings``:
    batches of up to B facts of its stream, two in flight)."""
    from engine.backfill import core_settings as job_core

    return job_core(batch)


def run_in_process(engine: Any, src: Path, work: Path, batch: int) -> dict[str, Any]:
    from engine.app import build_engine
    from engine.backfill import EngineDecider
    from engine.core import SyncEngine

    gate, store = fresh_gate(engine, work / "data")
    try:
        with SyncEngine(build_engine(gate, core_settings(batch))) as core:
            decider = EngineDecider(core, "strict", apply=True)
            return run_job(decider, src, work, "local:bench", batch)
    finally:
        store.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def stream_latency(target: str, rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """One Backfill stream of ``n`` fresh facts on an idle server: first decision and gaps."""
    import grpc

    from engine.server.proto import pb, pb_grpc

    facts = [
        pb.Fact(namespace=f"latency/{r['namespace']}", text=r["text"].encode()) for r in rows[:n]
    ]
    arrived: list[float] = []
    per_fact: list[float] = []
    batch_facts: list[int] = []
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.MemgateStub(channel)
        t0 = time.perf_counter()
        for resp in stub.Backfill(iter(pb.BackfillRequest(fact=f) for f in facts)):
            arrived.append(time.perf_counter())
            t = resp.timings
            model = t.embed + t.search + t.keys + t.nli + t.decide + t.store + t.other
            per_fact.append(model / max(1, t.batch_facts))
            batch_facts.append(t.batch_facts)
    gaps = [b - a for a, b in zip(arrived, arrived[1:], strict=False)]
    model_s = statistics.median(per_fact)
    p99 = _percentile(gaps, 99)
    # Each gap against the model time of the fact whose decision ended it: what streaming adds
    # on top of that fact's own model work (facts differ: one with many candidate pairs costs
    # many NLI passes).
    own = [g / m for g, m in zip(gaps, per_fact[1:], strict=True) if m > 0]
    return {
        "facts": len(arrived),
        "seconds": arrived[-1] - t0,
        "first_decision_s": arrived[0] - t0,
        "gap_p50_s": _percentile(gaps, 50),
        "gap_p99_s": p99,
        "gap_max_s": max(gaps),
        "per_fact_model_s": model_s,
        "gap_p99_over_model": p99 / model_s,
        "per_fact_model_p99_s": _percentile(per_fact, 99),
        "gap_over_own_model_p99": _percentile(own, 99),
        "batch_facts_max": max(batch_facts),
    }


class NullDecider:
    """Decides without a model (every fact an add): what the backfill plumbing alone costs."""

    def decide(self, facts: Any) -> list[Any]:
        from engine.types import Decision

        return [Decision("add", f, None, (), "strict", "null", memory_id="mem_null") for f in facts]


def run_plumbing(src: Path, work: Path, batch: int) -> dict[str, Any]:
    """Reader, validation, keys, audit (fsync) and checkpoint per batch, with no model work."""
    return run_job(NullDecider(), src, work, "local:null", batch)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_grpc(
    args: argparse.Namespace, src: Path, work: Path, rows: list[dict[str, Any]]
) -> dict[str, Any] | str:
    """The job through ``memgate serve`` in a subprocess; a string says why it was skipped."""
    try:
        from engine.server.codegen import ensure

        ensure()
        from engine.backfill import StreamDecider
        from engine.client import MemgateClient
        from engine.errors import MemgateError
    except (ImportError, SystemExit) as exc:
        return f"the gRPC stubs or client are not available ({exc})"
    port = free_port()
    target = f"127.0.0.1:{port}"
    log = work / "server.log"
    work.mkdir(parents=True)
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "--cache-dir",
        str(args.cache_dir),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(work / "data"),
        "--threads",
        str(args.threads),
        "--nli",
        args.nli,
        "--nli-variant",
        args.nli_variant,
        "--max-batch-facts",
        str(args.batch),
        "--backfill-window",
        str(2 * args.batch),
        "--max-queued-facts",
        str(max(1024, 2 * args.batch)),
        "--log-format",
        "text",
        "--no-access-log",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ)
        )
    try:
        with MemgateClient(target, timeout=None) as client:
            deadline = time.monotonic() + args.server_wait
            ready = False
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    ready = client.health(timeout=1.0) == "SERVING"
                except MemgateError:  # not listening yet
                    ready = False
                if ready:
                    break
                time.sleep(0.2)  # the server loads its models: a bounded start-up wait
            if not ready:
                tail = log.read_text(errors="replace")[-400:].strip().replace("\n", " | ")
                state = "exited" if proc.poll() is not None else "not serving"
                return f"memgate serve {state} after {args.server_wait:.0f} s ({tail})"
            decider = StreamDecider(client, "strict", dry_run=False)
            out = run_job(decider, src, work, f"grpc:{target}", args.batch)
            print(f"stream latency: one stream of {args.latency_facts:,} facts ...", flush=True)
            fresh = build_rows(args.latency_facts, max(1, args.latency_facts // 100), args.seed + 1)
            out["latency"] = stream_latency(target, fresh, args.latency_facts)
            return out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- main ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(p)
    p.add_argument(
        "--spin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ONNX Runtime spinning in this process's sessions (baseline and in-process job)",
    )
    p.add_argument("--facts", type=int, help="facts in the file (default 100,000; quick 10,000)")
    p.add_argument("--namespaces", type=int, help="namespaces (default 1,000; quick 100)")
    p.add_argument("--batch", type=int, default=256, help="facts per gate batch (default 256)")
    p.add_argument("--nli", default="auto", help="NLI artefact (auto: the int8 aegis-nli on CPU)")
    p.add_argument("--nli-variant", default="auto")
    p.add_argument("--no-grpc", action="store_true", help="skip the gRPC run")
    p.add_argument("--server-wait", type=float, default=120.0, help="seconds for serve to start")
    p.add_argument(
        "--latency-facts", type=int, default=1000, help="facts in the latency stream (1,000)"
    )
    args = p.parse_args(argv)
    size = (10_000, 100) if args.quick else (600, 12) if args.smoke else (100_000, 1_000)
    custom = args.facts is not None or args.namespaces is not None
    args.facts = args.facts or size[0]
    args.namespaces = args.namespaces or size[1]
    header = run_header("bench_backfill", args)

    from engine.app import open_engine
    from engine.types import Fact

    rows = build_rows(args.facts, args.namespaces, args.seed)
    facts = [Fact(r["namespace"], r["text"]) for r in rows]
    scale = f"{args.facts:,} facts over {args.namespaces:,} namespaces"
    if custom:
        print(f"custom size: {scale} (the full run is 100,000 over 1,000)", flush=True)
    elif args.quick:
        print(f"quick: {scale} (the full run is 100,000 over 1,000)", flush=True)
    elif args.smoke:
        print(f"smoke: {scale}; the figures mean nothing", flush=True)
    else:
        print(f"full: {scale}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
    figures: dict[str, Any] = {}
    try:
        src = work / "facts.jsonl"
        with open(src, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print("backfill plumbing alone (no model) ...", flush=True)
        figures["plumbing"] = run_plumbing(src, work / "plumbing", args.batch)
        with open_engine(engine_settings(args, work / "models-only")) as engine:
            models = {
                "embedder": engine.gate.embedder.manifest.describe(),  # type: ignore[attr-defined]
                "nli": engine.gate.nli.manifest.describe(),  # type: ignore[attr-defined]
            }
            print(f"models: {models['embedder']} + {models['nli']}", flush=True)
            print("baseline: gate.triage(apply=True) ...", flush=True)
            figures["baseline"] = run_baseline(engine, work / "baseline", facts, args.batch)
            print("backfill in process ...", flush=True)
            figures["in-process"] = run_in_process(engine, src, work / "in-process", args.batch)
        if args.no_grpc:
            figures["grpc"] = "skipped (--no-grpc)"
        else:
            print("backfill over gRPC (memgate serve in a subprocess) ...", flush=True)
            figures["grpc"] = run_grpc(args, src, work / "grpc", rows)
        with open_engine(engine_settings(args, work / "models-only")) as engine:
            print("baseline again ...", flush=True)
            figures["baseline-after"] = run_baseline(engine, work / "baseline-2", facts, args.batch)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    base = [figures["baseline"], figures["baseline-after"]]
    base_rate = sum(b["facts"] / b["seconds"] for b in base) / 2
    for b in base:
        b["facts_per_s"] = b["facts"] / b["seconds"]
    table_rows: list[list[Any]] = []
    for name, label in [
        ("baseline", "baseline: gate.triage"),
        ("baseline-after", "baseline, again"),
        ("in-process", "backfill, in process"),
        ("grpc", "backfill, gRPC stream"),
    ]:
        fig = figures[name]
        if isinstance(fig, str):
            print(f"{label}: skipped: {fig}")
            table_rows.append([label, "-", "-", "-", "-", "-", "skipped"])
            continue
        fig["facts_per_s"] = fig["facts"] / fig["seconds"]
        ratio = fig["facts_per_s"] / base_rate
        if name in TARGETS:
            fig["ratio"] = ratio
            fig["target"] = TARGETS[name]
        acts = fig["actions"]
        table_rows.append(
            [
                label,
                fig["facts"],
                round(fig["seconds"], 1),
                round(fig["facts_per_s"], 1),
                round(ratio, 3),
                f"{acts.get('add', 0)}/{acts.get('replace', 0)}/{acts.get('skip', 0)}"
                f"/{acts.get('review', 0)}",
                f">= {TARGETS[name]}" if name in TARGETS else "",
            ]
        )
    drift = abs(base[0]["facts_per_s"] - base[1]["facts_per_s"]) / base_rate
    plumbing = figures["plumbing"]
    plumbing["facts_per_s"] = plumbing["facts"] / plumbing["seconds"]
    per_fact = plumbing["seconds"] / plumbing["facts"]
    # If the plumbing ran serially with the model, in-process could not beat this ratio.
    plumbing["ceiling_ratio"] = (1 / base_rate) / (1 / base_rate + per_fact)
    print()
    print(
        table(
            ["run", "facts", "s", "facts/s", "ratio", "add/replace/skip/review", "target"],
            table_rows,
            title=f"backfill, {scale}, batch {args.batch}, {args.threads} threads "
            f"(ratio: to the mean baseline, {fmt(base_rate)} facts/s; the two baselines "
            f"differ by {100 * drift:.0f}%)",
        )
    )
    print(
        f"backfill plumbing alone (reader, validation, keys, audit + fsync, checkpoint; no "
        f"model): {fmt(plumbing['facts_per_s'])} facts/s, {1e6 * per_fact:,.0f} us per fact; "
        f"at the baseline's speed it caps the in-process ratio at "
        f"{plumbing['ceiling_ratio']:.4f}"
    )
    grpc_fig, inproc = figures["grpc"], figures["in-process"]
    if not isinstance(grpc_fig, str):
        over = inproc["facts_per_s"] / grpc_fig["facts_per_s"]
        figures["in_process_over_grpc"] = over
        print(
            f"in process / gRPC backfill: {over:.3f} (target >= {IN_PROCESS_OVER_GRPC}: "
            f"{'met' if over >= IN_PROCESS_OVER_GRPC else 'MISSED'})"
        )
        lat = grpc_fig["latency"]
        print(
            f"stream of {lat['facts']:,} facts on an idle server: first decision "
            f"{lat['first_decision_s']:.3f} s (target <= {FIRST_DECISION_S}: "
            f"{'met' if lat['first_decision_s'] <= FIRST_DECISION_S else 'MISSED'}); gaps p50 "
            f"{1e3 * lat['gap_p50_s']:.1f} ms, p99 {1e3 * lat['gap_p99_s']:.1f} ms, max "
            f"{1e3 * lat['gap_max_s']:.1f} ms; per-fact model time "
            f"{1e3 * lat['per_fact_model_s']:.1f} ms: p99 gap / model = "
            f"{lat['gap_p99_over_model']:.2f} (target <= {GAP_OVER_MODEL}: "
            f"{'met' if lat['gap_p99_over_model'] <= GAP_OVER_MODEL else 'MISSED'}); per-fact "
            f"model time p99 {1e3 * lat['per_fact_model_p99_s']:.1f} ms; each gap / the model "
            f"time of the fact that ended it, p99: {lat['gap_over_own_model_p99']:.2f}; largest "
            f"model call {lat['batch_facts_max']} facts"
        )
    note = shared_machine_note()
    if note:
        print(note)
    payload = {
        **header,
        "models": models,
        "manifests": manifest_summary(
            args.cache_dir, [("minilm", "fp32"), ("aegis-nli", "imported")]
        ),
        "scale": {"facts": args.facts, "namespaces": args.namespaces, "batch": args.batch},
        "baseline_facts_per_s": base_rate,
        "baseline_drift": drift,
        "figures": figures,
        "note": note,
    }
    path = write_json(args.out, "bench_backfill", payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
