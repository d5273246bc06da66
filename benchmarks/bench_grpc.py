"""Serving benchmark: the gRPC server under load, against in-process batch triage in the same run.

1. **Baseline**: 1,000 memories over ``--namespaces`` namespaces are stored; then the gate triages
   a pool of incoming facts (updates, paraphrases, new facts) in-process, in batches of 64:
   facts/s with no server, no queue, no network. It is measured again after the load, and the
   mean of both is the baseline (their difference shows how busy the machine was meanwhile).
2. **Served**: the same store is served by ``memgate serve`` in a subprocess (its own
   interpreter, so the load generator does not share its GIL), and a grpc.aio load generator
   sends the same facts as ``Triage`` dry runs (the store never changes, so every phase sees the
   same data):

   * *closed loop*: 32 concurrent clients, one fact per call: facts/s, and the ratio to the
     baseline (target >= 0.8);
   * *HTTP arm*: the same server also serves HTTP/JSON (``--http-port``, the same engine); 32
     closed-loop clients (keep-alive connections, httptools' C parser) send the same facts as
     ``POST /v1/Triage`` JSON. The closed
     loops run gRPC, HTTP, gRPC again (A-B-A, so drift on a shared machine shows), and HTTP
     is compared with the mean of the two gRPC runs (target >= 0.85);
   * *open loop*: Poisson arrivals of single facts and small batches (2-8) at a sweep of offered
     loads, from a quarter of that capacity to twice it: throughput, p50/p95/p99 latency and the
     share shed with RESOURCE_EXHAUSTED. At 2x, the p99 of accepted calls is compared with the
     unloaded p99 (the lowest offered load) (target <= 2x).

Prints a table, writes JSON (git sha, machine, settings, figures) and a PNG to
``benchmarks/results/``. ``--quick`` takes one to two minutes.

``--door-arms 0,250,1000 --repeats 2`` compares values of the delay door
(``--max-queue-delay-ms``, 0: off) instead: each arm in its own server on the same store,
interleaved (odd repeats in the given order, even ones reversed), with a closed loop and the
open loop at 0.25x / 0.5x / 2x of the first arm's closed-loop capacity, held fixed for every
arm; a table of medians and ``bench_grpc_doors-*.json`` (no plot).

    MEMGATE_HOME=~/.cache/memgate python benchmarks/bench_grpc.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402 - the path above makes the helpers importable
    RESULTS,
    ROOT,
    default_cache_dir,
    pyplot,
    run_header,
    utc_stamp,
    write_json,
)

SUBJECTS = [
    "The customer",
    "Alice",
    "Bob",
    "The CTO",
    "The support lead",
    "Priya",
    "The finance team",
    "Marco",
    "The warehouse manager",
    "Yuki",
]
ATTRIBUTES = [
    ("office is in", ["Denver", "Chicago", "Austin", "Boston", "Seattle", "Lisbon", "Osaka"]),
    ("preferred contact channel is", ["email", "phone", "Slack", "SMS", "video calls"]),
    ("favourite lunch is", ["ramen", "tacos", "a salad", "falafel", "pizza", "sushi"]),
    ("team has", ["4 people", "12 people", "30 people", "7 people", "55 people"]),
    ("timezone is", ["UTC", "UTC+1", "UTC-5", "UTC+9", "UTC-8"]),
    ("laptop is", ["a ThinkPad", "a MacBook Pro", "a Dell XPS", "a Framework"]),
    ("weekly meeting is on", ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]),
    ("budget this quarter is", ["$10,000", "$25,000", "$80,000", "$120,000"]),
    ("main project is", ["the billing migration", "the mobile app", "the data lake", "SSO"]),
    ("car is", ["a red Volvo", "a blue Tesla", "a grey Toyota", "a bicycle"]),
]
NEW_TOPICS = [
    "is learning to play the cello",
    "ran a half marathon last spring",
    "keeps bees on the roof",
    "collects vintage maps",
    "is allergic to peanuts",
    "volunteers at the food bank",
    "speaks fluent Portuguese",
    "restores old motorbikes",
    "writes a newsletter about tea",
]


# -- data -----------------------------------------------------------------------------------------
def possessive(subject: str) -> str:
    return subject + "'s"


def build_data(
    namespaces: int, memories: int, incoming: int, seed: int
) -> tuple[list[Any], list[Any]]:
    """``memories`` stored facts over ``namespaces``; ``incoming`` facts to triage: about half
    updates of a stored attribute, a quarter paraphrases (duplicates), a quarter new facts."""
    from engine.types import Fact

    rng = random.Random(seed)
    per_ns = max(1, memories // namespaces)
    stored: list[Fact] = []
    slots: list[tuple[str, str, str, list[str], str]] = []
    for n in range(namespaces):
        ns = f"bench/tenant-{n:03d}"
        pairs = [(s, a) for s in SUBJECTS for a in ATTRIBUTES]
        rng.shuffle(pairs)
        for subject, (attr, values) in pairs[:per_ns]:
            value = rng.choice(values)
            stored.append(Fact(ns, f"{possessive(subject)} {attr} {value}."))
            slots.append((ns, subject, attr, values, value))
    incoming_facts: list[Fact] = []
    for _ in range(incoming):
        ns, subject, attr, values, value = rng.choice(slots)
        roll = rng.random()
        if roll < 0.5:
            other = rng.choice([v for v in values if v != value] or values)
            text = f"{possessive(subject)} {attr} {other} now."
        elif roll < 0.75:
            text = f"As noted, {possessive(subject).lower()} {attr} {value}."
        else:
            text = f"{subject} {rng.choice(NEW_TOPICS)}."
        incoming_facts.append(Fact(ns, text))
    return stored, incoming_facts


# -- baseline -------------------------------------------------------------------------------------
def engine_settings(args: argparse.Namespace, data_dir: Path, *, served: bool = False) -> Any:
    """``served``: the sessions ``memgate serve`` builds (its spinning default, ``SERVE_SPIN``);
    else the in-process default."""
    from engine.app import EngineSettings
    from engine.cli.serve import SERVE_SPIN
    from engine.runtime.session import SessionSettings

    session = SessionSettings(allow_spinning=SERVE_SPIN) if served else SessionSettings()
    return EngineSettings(data_dir=data_dir, cache_dir=Path(args.cache_dir), session=session)


def baseline(
    args: argparse.Namespace, db: Path, stored: list[Any], incoming: list[Any], seconds: float
) -> dict[str, Any]:
    """In-process ``gate.triage`` in batches of 64 for ``seconds`` (storing ``stored`` first)."""
    from engine.app import open_engine

    with open_engine(engine_settings(args, db.parent), db_path=db) as eng:
        gate = eng.gate
        t0 = time.perf_counter()
        for i in range(0, len(stored), 256):
            gate.ingest(stored[i : i + 256])
        ingest_s = time.perf_counter() - t0
        if stored:
            print(f"  stored {len(stored)} memories in {ingest_s:.1f}s", flush=True)
        gate.triage(incoming[:64])  # warm the indexes and the sessions
        facts = 0
        pairs = 0
        actions: dict[str, int] = {}
        t0 = time.perf_counter()
        deadline = t0 + seconds
        i = 0
        while time.perf_counter() < deadline:
            batch = [incoming[(i + j) % len(incoming)] for j in range(64)]
            i += 64
            result = gate.triage(batch)
            facts += len(batch)
            pairs += result.nli_pairs
            for d in result.decisions:
                actions[d.action] = actions.get(d.action, 0) + 1
        elapsed = time.perf_counter() - t0
        models = {
            "embedder": gate.embedder.manifest.describe(),  # type: ignore[attr-defined]
            "nli": gate.nli.manifest.describe(),  # type: ignore[attr-defined]
        }
    return {
        "facts_per_s": facts / elapsed,
        "facts": facts,
        "seconds": elapsed,
        "nli_pairs_per_fact": pairs / max(facts, 1),
        "actions": actions,
        "ingest_s": ingest_s,
        "models": models,
    }


def engine_closed(
    args: argparse.Namespace, db: Path, incoming: list[Any], seconds: float
) -> dict[str, Any]:
    """The served closed loop without the transport: ``args.clients`` asyncio callers of the
    engine core, in this process, one fact per ``Engine.triage`` dry run, on the core the server
    runs (``engine.server.server.core_settings`` of the same settings), so served / this is
    what the wire, the server process and its event loop cost."""
    from engine.app import build_engine, open_engine
    from engine.server.server import core_settings

    batches: list[int] = []

    def on_batch(facts: int, entries: int, _seconds: float) -> None:
        batches.append(facts)

    async def run(gate: Any) -> tuple[int, float, list[float]]:
        engine = build_engine(gate, core_settings(server_settings(args)), on_batch=on_batch)
        await engine.start()
        try:
            await engine.warm_up()
            cursor = [0]
            lat: list[float] = []

            async def loop(end: float, out: list[float]) -> None:
                while time.perf_counter() < end:
                    fact = incoming[cursor[0] % len(incoming)]
                    cursor[0] += 1
                    t0 = time.perf_counter()
                    await engine.triage([fact])
                    out.append(time.perf_counter() - t0)

            warm_end = time.perf_counter() + 2.0
            await asyncio.gather(*(loop(warm_end, []) for _ in range(8)))
            batches.clear()
            t0 = time.perf_counter()
            end = t0 + seconds
            await asyncio.gather(*(loop(end, lat) for _ in range(args.clients)))
            return len(lat), time.perf_counter() - t0, lat
        finally:
            await engine.close()

    with open_engine(engine_settings(args, db.parent, served=True), db_path=db) as eng:
        facts, elapsed, lat = asyncio.run(run(eng.gate))
    return {
        "facts_per_s": facts / elapsed,
        "facts": facts,
        "seconds": elapsed,
        "batch_mean": sum(batches) / max(1, len(batches)),
        "p50_ms": _pct(lat, 50),
        "p99_ms": _pct(lat, 99),
    }


# -- the server subprocess ------------------------------------------------------------------------
def server_settings(args: argparse.Namespace) -> Any:
    """The served settings: the server's defaults with this run's admission and batching."""
    from engine.core.queue import QueueSettings
    from engine.server.server import ServerSettings

    return ServerSettings(
        port=0,
        max_queued_facts=args.max_queued_facts,
        max_queue_delay_s=args.max_queue_delay_ms / 1000 if args.max_queue_delay_ms else None,
        batching=QueueSettings(
            max_batch_facts=args.max_batch_facts, max_wait_s=args.max_wait_ms / 1000
        ),
        metrics_port=args.metrics_port,
        grace_s=2.0,
        http_port=0 if args.http else None,
    )


def serve_main(args: argparse.Namespace) -> int:
    """``--serve``: open the store, serve it on a free port, print the port, run until SIGTERM."""
    from engine.app import open_engine
    from engine.server.server import MemgateServer

    settings = server_settings(args)
    db = Path(args.db)

    async def main() -> None:
        with open_engine(engine_settings(args, db.parent, served=True), db_path=db) as eng:
            server = MemgateServer(eng.gate, settings)
            port = await server.start()
            print(f"PORT {port} {server.http_port or 0}", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, stop.set)
            await stop.wait()
            await server.stop(1.0)

    asyncio.run(main())
    return 0


class ServerProcess:
    def __init__(self, args: argparse.Namespace, db: Path, metrics_port: int) -> None:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve",
            "--db",
            str(db),
            "--cache-dir",
            args.cache_dir,
            "--metrics-port",
            str(metrics_port),
            "--max-queued-facts",
            str(args.max_queued_facts),
            "--max-queue-delay-ms",
            str(args.max_queue_delay_ms),
            "--max-batch-facts",
            str(args.max_batch_facts),
            "--max-wait-ms",
            str(args.max_wait_ms),
            "--http" if args.http else "--no-http",
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )
        self.metrics_port = metrics_port
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise SystemExit("the server subprocess did not start (run it with --serve to see why)")
        self.port = int(line.split()[1])
        self.http_port = int(line.split()[2])

    def batch_stats(self) -> tuple[float, float]:
        """(sum of facts, count of batches) from the server's Prometheus endpoint."""
        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as resp:
            text = resp.read().decode()
        total = count = 0.0
        for family in text_string_to_metric_families(text):
            if family.name == "memgate_batch_facts":
                for s in family.samples:
                    if s.name.endswith("_sum"):
                        total = s.value
                    elif s.name.endswith("_count"):
                        count = s.value
        return total, count

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


# -- load -----------------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    offered: float | None
    """Offered facts/s (open loop); None for the closed loop."""
    seconds: float
    calls: int
    ok_calls: int
    shed_calls: int
    other_errors: int
    ok_facts: int
    throughput: float
    """Facts/s answered OK."""
    p50_ms: float
    p95_ms: float
    p99_ms: float
    shed_share: float
    mean_batch_facts: float
    queue_ms_mean: float
    client_cpu_ms_per_call: float = float("nan")
    """CPU of the load generator's process per call (closed loops): its client library's
    share of the machine."""


def _pct(lat: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(lat) * 1000, q)) if lat else float("nan")


class Load:
    def __init__(self, port: int, incoming: list[Any], channels: int, seed: int) -> None:
        self.port = port
        self.incoming = incoming
        self.channels_n = channels
        self.rng = random.Random(seed)
        self.cursor = 0
        self.last_client_cpu_ms = float("nan")

    async def __aenter__(self) -> Load:
        import grpc

        from engine.server import convert
        from engine.server.proto import pb, pb_grpc

        self.grpc, self.pb, self.convert = grpc, pb, convert
        self.channels = [
            grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") for _ in range(self.channels_n)
        ]
        self.stubs = [pb_grpc.MemgateStub(ch) for ch in self.channels]
        self.encoded = [convert.fact_to_pb(f) for f in self.incoming]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for ch in self.channels:
            await ch.close()

    def request(self, size: int) -> Any:
        facts = [self.encoded[(self.cursor + j) % len(self.encoded)] for j in range(size)]
        self.cursor += size
        return self.pb.TriageRequest(facts=facts)

    def read_request(self) -> Any:
        """A store read (no model): the review queue of a fact's namespace."""
        fact = self.encoded[self.cursor % len(self.encoded)]
        self.cursor += 1
        return self.pb.ListReviewRequest(namespace=fact.namespace, limit=10)

    async def call(
        self, size: int, out: list[tuple[float, str, int, float]], rpc: str = "Triage"
    ) -> None:
        stub = self.stubs[self.rng.randrange(len(self.stubs))]
        request = self.request(size) if rpc == "Triage" else self.read_request()
        t0 = time.perf_counter()
        queue = 0.0
        try:
            response = await getattr(stub, rpc)(request, timeout=30)
            code = "OK"
            queue = response.timings.queue
        except self.grpc.aio.AioRpcError as err:
            code = err.code().name
        out.append((time.perf_counter() - t0, code, size, queue))

    async def closed(
        self, clients: int, seconds: float, http: HttpLoad | None = None, rpc: str = "Triage"
    ) -> tuple[list[Any], float]:
        """``clients`` callers, one fact per call; a refused caller backs off 50-100 ms.
        With ``http``, the calls go over HTTP/JSON instead of gRPC; ``rpc="ListReview"``: a
        store read per call instead of a fact (the doors' own cost, no model)."""
        out: list[tuple[float, str, int, float]] = []
        end = time.perf_counter() + seconds
        call = http.call if http is not None else self.call

        async def client() -> None:
            while time.perf_counter() < end:
                await call(1, out, rpc)
                if out[-1][1] == "RESOURCE_EXHAUSTED":
                    await asyncio.sleep(0.05 + 0.05 * self.rng.random())

        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client() for _ in range(clients)))
        self.last_client_cpu_ms = (time.process_time() - cpu0) * 1000 / max(1, len(out))
        return out, time.perf_counter() - t0

    async def open(
        self, facts_per_s: float, seconds: float, batch_share: float, min_calls: int
    ) -> tuple[list[Any], float]:
        """Poisson arrivals: single facts, or with probability ``batch_share`` 2-8 facts. Runs
        ``seconds``, stretched (up to 3x) so that at least ``min_calls`` calls are sent.
        Returns the calls and the time from the first send to the last answer."""
        out: list[tuple[float, str, int, float]] = []
        tasks: list[asyncio.Task[None]] = []
        mean_size = 1 + batch_share * 4.0
        rate = facts_per_s / mean_size  # calls/s
        window = min(max(seconds, min_calls / rate), 3 * seconds)
        arrivals = []
        t = self.rng.expovariate(rate)
        while t < window:
            arrivals.append(t)
            t += self.rng.expovariate(rate)
        t0 = time.perf_counter()
        for at in arrivals:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            size = self.rng.randint(2, 8) if self.rng.random() < batch_share else 1
            tasks.append(asyncio.ensure_future(self.call(size, out)))
        if tasks:
            await asyncio.gather(*tasks)
        return out, max(window, time.perf_counter() - t0)


class _Keepalive:
    """One keep-alive HTTP/1.1 connection whose responses are parsed by httptools (the C parser
    uvicorn[standard] ships). httpx spent 1-3 ms of CPU per call on these 2 cores, which the
    server then lacked; this client spends a fraction of that, so the arm measures the door."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import httptools

        self.reader, self.writer = reader, writer
        self._chunks: list[bytes] = []
        self._done = False
        self._parser = httptools.HttpResponseParser(self)

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self._done = True

    async def post(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        self._chunks, self._done = [], False
        while not self._done:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            self._parser.feed_data(data)
        return self._parser.get_status_code(), b"".join(self._chunks)


class HttpLoad:
    """The same facts as ``POST /v1/Triage`` JSON bodies (or the same store reads), over
    keep-alive HTTP/1.1: one connection per closed-loop client, as gRPC's clients share
    ``--channels`` HTTP/2 connections."""

    def __init__(self, port: int, load: Load, clients: int) -> None:
        self.port = port
        self.load = load
        self.clients = clients

    async def __aenter__(self) -> HttpLoad:
        from engine.server.jsonmap import encode_json, message_to_dict

        pb = self.load.pb
        self.bodies = [
            encode_json(message_to_dict(pb.TriageRequest(facts=[f]))) for f in self.load.encoded
        ]
        self.reads = [
            encode_json(message_to_dict(pb.ListReviewRequest(namespace=f.namespace, limit=10)))
            for f in self.load.encoded
        ]
        # The same 30 s deadline as the gRPC calls (deadline-aware admission treats both alike).
        self.heads = {
            rpc: (
                f"POST /v1/{rpc} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
                "content-type: application/json\r\nx-timeout-s: 30\r\n"
            ).encode()
            for rpc in ("Triage", "ListReview")
        }
        self.pool: asyncio.Queue[_Keepalive] = asyncio.Queue()
        for _ in range(self.clients):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            self.pool.put_nowait(_Keepalive(reader, writer))
        return self

    async def __aexit__(self, *exc: object) -> None:
        while not self.pool.empty():
            conn = self.pool.get_nowait()
            conn.writer.close()

    async def call(
        self, size: int, out: list[tuple[float, str, int, float]], rpc: str = "Triage"
    ) -> None:
        assert size == 1, "the HTTP arm sends single facts (the closed loop)"
        bodies = self.bodies if rpc == "Triage" else self.reads
        body = bodies[self.load.cursor % len(bodies)]
        self.load.cursor += 1
        conn = await self.pool.get()
        t0 = time.perf_counter()
        queue = 0.0
        try:
            status, raw = await conn.post(self.heads[rpc], body)
            answer = json.loads(raw)
            if status == 200:
                code = "OK"
                queue = answer["timings"]["queue"]
            else:
                code = answer.get("code", str(status))
        except (OSError, ValueError) as err:
            code = type(err).__name__
        finally:
            self.pool.put_nowait(conn)
        out.append((time.perf_counter() - t0, code, size, queue))


def summarise(
    name: str, offered: float | None, out: list[Any], seconds: float, batch: tuple[float, float]
) -> Phase:
    ok = [r for r in out if r[1] == "OK"]
    shed = [r for r in out if r[1] == "RESOURCE_EXHAUSTED"]
    lat = [r[0] for r in ok]
    ok_facts = sum(r[2] for r in ok)
    return Phase(
        name=name,
        offered=offered,
        seconds=seconds,
        calls=len(out),
        ok_calls=len(ok),
        shed_calls=len(shed),
        other_errors=len(out) - len(ok) - len(shed),
        ok_facts=ok_facts,
        throughput=ok_facts / seconds if seconds else 0.0,
        p50_ms=_pct(lat, 50),
        p95_ms=_pct(lat, 95),
        p99_ms=_pct(lat, 99),
        shed_share=len(shed) / len(out) if out else 0.0,
        mean_batch_facts=batch[0] / batch[1] if batch[1] else 0.0,
        queue_ms_mean=float(np.mean([r[3] for r in ok]) * 1000) if ok else float("nan"),
    )


async def run_load(
    args: argparse.Namespace, server: ServerProcess, incoming: list[Any]
) -> list[Phase]:
    phases: list[Phase] = []

    def delta(before: tuple[float, float]) -> tuple[float, float]:
        after = server.batch_stats()
        return after[0] - before[0], after[1] - before[1]

    async with Load(server.port, incoming, args.channels, args.seed) as load:
        await load.closed(8, 2.0)  # warm up the connections and the server
        print(f"  closed loop: {args.clients} clients x 1 fact, {args.phase_s:.0f}s", flush=True)
        before = server.batch_stats()
        out, secs = await load.closed(args.clients, args.phase_s)
        closed = summarise(f"closed-{args.clients}", None, out, secs, delta(before))
        closed.client_cpu_ms_per_call = load.last_client_cpu_ms
        phases.append(closed)
        capacity = closed.throughput
        if server.http_port:
            async with HttpLoad(server.http_port, load, args.clients) as http:
                await load.closed(8, 2.0, http)  # warm up the connections
                print(f"  HTTP closed loop: {args.clients} clients x 1 fact", flush=True)
                before = server.batch_stats()
                out, secs = await load.closed(args.clients, args.phase_s, http)
                phases.append(summarise(f"http-{args.clients}", None, out, secs, delta(before)))
                phases[-1].client_cpu_ms_per_call = load.last_client_cpu_ms
            print(f"  closed loop again (gRPC): {args.clients} clients", flush=True)
            before = server.batch_stats()
            out, secs = await load.closed(args.clients, args.phase_s)
            phases.append(summarise(f"closed-{args.clients}b", None, out, secs, delta(before)))
            phases[-1].client_cpu_ms_per_call = load.last_client_cpu_ms
            # The doors' own cost: store reads (ListReview), no model, gRPC then HTTP.
            reads_s = args.phase_s / 2
            print(f"  store reads (ListReview), gRPC then HTTP: {reads_s:.0f}s each", flush=True)
            out, secs = await load.closed(args.clients, reads_s, rpc="ListReview")
            phases.append(summarise(f"reads-grpc-{args.clients}", None, out, secs, (0, 0)))
            phases[-1].client_cpu_ms_per_call = load.last_client_cpu_ms
            async with HttpLoad(server.http_port, load, args.clients) as http:
                out, secs = await load.closed(args.clients, reads_s, http, rpc="ListReview")
            phases.append(summarise(f"reads-http-{args.clients}", None, out, secs, (0, 0)))
            phases[-1].client_cpu_ms_per_call = load.last_client_cpu_ms
        for mult in args.loads:
            offered = capacity * mult
            print(
                f"  open loop: {mult:.2f}x capacity = {offered:.0f} facts/s, {args.phase_s:.0f}s",
                flush=True,
            )
            before = server.batch_stats()
            out, secs = await load.open(offered, args.phase_s, args.batch_share, args.min_calls)
            phases.append(summarise(f"open-{mult:.2f}x", offered, out, secs, delta(before)))
    return phases


async def door_arm(
    args: argparse.Namespace, server: ServerProcess, incoming: list[Any], capacity: float | None
) -> tuple[list[Phase], float]:
    """One arm of ``--door-arms``: warm-up, the closed loop, then the open loop at 0.25x, 0.5x
    and 2x of ``capacity`` (None: this arm's closed-loop facts/s, which then becomes the
    capacity of every later arm). Returns the phases and the capacity used."""
    phases: list[Phase] = []

    def delta(before: tuple[float, float]) -> tuple[float, float]:
        after = server.batch_stats()
        return after[0] - before[0], after[1] - before[1]

    async with Load(server.port, incoming, args.channels, args.seed) as load:
        await load.closed(8, 2.0)
        before = server.batch_stats()
        out, secs = await load.closed(args.clients, args.phase_s)
        phases.append(summarise(f"closed-{args.clients}", None, out, secs, delta(before)))
        if capacity is None:
            capacity = phases[0].throughput
        for mult in DOOR_LOADS:
            before = server.batch_stats()
            out, secs = await load.open(
                capacity * mult, args.phase_s, args.batch_share, args.min_calls
            )
            phases.append(summarise(f"open-{mult:.2f}x", capacity * mult, out, secs, delta(before)))
    return phases, capacity


DOOR_LOADS = (0.25, 0.5, 2.0)
"""Offered loads of a door arm, in units of the capacity: unloaded, half, twice."""


def run_doors(args: argparse.Namespace, db: Path, incoming: list[Any]) -> list[dict[str, Any]]:
    """``--door-arms``: every arm (a ``--max-queue-delay-ms``) in its own server subprocess on
    the same store, interleaved: repeat 1 in the given order, repeat 2 reversed, and so on. The
    capacity is the first arm's closed loop, then held fixed (every arm gets the same load)."""
    import socket

    runs: list[dict[str, Any]] = []
    capacity: float | None = None
    for rep in range(args.repeats):
        order = args.door_arms if rep % 2 == 0 else list(reversed(args.door_arms))
        for delay_ms in order:
            arm = argparse.Namespace(
                **{**vars(args), "max_queue_delay_ms": delay_ms, "http": False}
            )
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                metrics_port = int(s.getsockname()[1])
            print(f"  repeat {rep + 1}, door {delay_ms:g} ms", flush=True)
            server = ServerProcess(arm, db, metrics_port)
            try:
                phases, capacity = asyncio.run(door_arm(arm, server, incoming, capacity))
            finally:
                server.stop()
            by = {p.name: p for p in phases}
            unloaded, half, over = (by[f"open-{m:.2f}x"] for m in DOOR_LOADS)
            run = {
                "repeat": rep + 1,
                "delay_ms": delay_ms,
                "capacity_facts_per_s": capacity,
                "closed_shed_share": phases[0].shed_share,
                "closed_facts_per_s": phases[0].throughput,
                "unloaded_p99_ms": unloaded.p99_ms,
                "half_shed_share": half.shed_share,
                "half_p99_ms": half.p99_ms,
                "overload_shed_share": over.shed_share,
                "overload_facts_per_s": over.throughput,
                "overload_p99_ms": over.p99_ms,
                "ratio": over.p99_ms / unloaded.p99_ms,
                "phases": [asdict(p) for p in phases],
            }
            print(
                f"    closed shed {run['closed_shed_share']:.1%}; 0.5x shed "
                f"{run['half_shed_share']:.1%}; 2x shed {run['overload_shed_share']:.1%}, "
                f"{run['overload_facts_per_s']:.1f} facts/s, p99 {run['overload_p99_ms']:.0f} ms "
                f"vs unloaded {run['unloaded_p99_ms']:.0f} ms = {run['ratio']:.2f}x",
                flush=True,
            )
            runs.append(run)
    return runs


def door_table(runs: list[dict[str, Any]], arms: list[float]) -> tuple[str, list[dict[str, Any]]]:
    """Medians over the repeats per arm, and the table printed from them."""
    rows = []
    for delay in arms:
        mine = [r for r in runs if r["delay_ms"] == delay]

        def med(key: str, mine: list[dict[str, Any]] = mine) -> float:
            return float(np.median([r[key] for r in mine]))

        rows.append(
            {
                "delay_ms": delay,
                "repeats": len(mine),
                "ratio": med("ratio"),
                "unloaded_p99_ms": med("unloaded_p99_ms"),
                "overload_p99_ms": med("overload_p99_ms"),
                "overload_facts_per_s": med("overload_facts_per_s"),
                "overload_shed_share": med("overload_shed_share"),
                "half_shed_max": max(r["half_shed_share"] for r in mine),
                "closed_shed_share": med("closed_shed_share"),
                "ratios": [r["ratio"] for r in mine],
            }
        )
    head = (
        f"{'door ms':>8}{'unl p99':>9}{'2x p99':>9}{'p99 ratio':>11}{'2x facts/s':>12}"
        f"{'2x shed':>9}{'0.5x shed max':>15}{'closed shed':>13}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['delay_ms']:>8g}{r['unloaded_p99_ms']:>9.0f}{r['overload_p99_ms']:>9.0f}"
            f"{r['ratio']:>10.2f}x{r['overload_facts_per_s']:>12.1f}{r['overload_shed_share']:>9.1%}"
            f"{r['half_shed_max']:>15.1%}{r['closed_shed_share']:>13.1%}"
        )
    return "\n".join(lines), rows


# -- report ---------------------------------------------------------------------------------------
def table(base: dict[str, Any], phases: list[Phase]) -> str:
    head = (
        f"{'phase':<14}{'offered/s':>10}{'served/s':>10}{'p50 ms':>9}{'p95 ms':>9}"
        f"{'p99 ms':>9}{'shed':>8}{'batch':>7}{'queue ms':>10}"
    )
    rows = [head, "-" * len(head)]
    rows.append(
        f"{'in-process':<14}{'':>10}{base['facts_per_s']:>10.1f}{'':>9}{'':>9}{'':>9}"
        f"{'':>8}{64:>7}{'':>10}"
    )
    eng = base.get("engine_closed")
    if eng:
        rows.append(
            f"{'engine-32':<14}{'closed':>10}{eng['facts_per_s']:>10.1f}{eng['p50_ms']:>9.1f}"
            f"{'':>9}{eng['p99_ms']:>9.1f}{'':>8}{eng['batch_mean']:>7.1f}{'':>10}"
        )
    for p in phases:
        offered = f"{p.offered:.0f}" if p.offered is not None else "closed"
        rows.append(
            f"{p.name:<14}{offered:>10}{p.throughput:>10.1f}{p.p50_ms:>9.1f}{p.p95_ms:>9.1f}"
            f"{p.p99_ms:>9.1f}{p.shed_share:>8.1%}{p.mean_batch_facts:>7.1f}{p.queue_ms_mean:>10.1f}"
        )
    return "\n".join(rows)


def plot(path: Path, base: dict[str, Any], phases: list[Phase]) -> None:
    plt = pyplot()
    if plt is None:
        return
    opened = [p for p in phases if p.offered is not None]
    x = [p.offered for p in opened]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(x, [p.throughput for p in opened], "o-", label="served (OK facts/s)")
    ax1.plot(x, x, ":", color="grey", label="offered")
    ax1.axhline(base["facts_per_s"], color="tab:red", ls="--", label="in-process batch-64")
    if base.get("engine_closed"):
        ax1.axhline(
            base["engine_closed"]["facts_per_s"],
            color="tab:purple",
            ls="--",
            label="in-process engine, 32 callers",
        )
    for p in phases:
        if p.name.startswith("http-"):
            ax1.axhline(p.throughput, color="tab:green", ls="-.", label=f"HTTP/JSON {p.name}")
        elif p.offered is None and not p.name.startswith("reads-"):
            ax1.axhline(p.throughput, color="tab:blue", ls=":", lw=0.8, label=f"gRPC {p.name}")
    ax1.set_xlabel("offered load (facts/s)")
    ax1.set_ylabel("facts/s")
    ax1.set_title("throughput")
    ax1b = ax1.twinx()
    ax1b.plot(x, [100 * p.shed_share for p in opened], "s--", color="tab:orange", label="shed %")
    ax1b.set_ylabel("shed with RESOURCE_EXHAUSTED (%)")
    ax1.legend(loc="upper left", fontsize=8)
    for q, style in (("p50_ms", "o-"), ("p95_ms", "s-"), ("p99_ms", "^-")):
        ax2.plot(x, [getattr(p, q) for p in opened], style, label=q.replace("_ms", ""))
    ax2.set_xlabel("offered load (facts/s)")
    ax2.set_ylabel("latency of accepted calls (ms)")
    ax2.set_title("latency")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report_doors(
    args: argparse.Namespace,
    header: dict[str, Any],
    base: dict[str, Any],
    runs: list[dict[str, Any]],
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
) -> int:
    text, rows = door_table(runs, args.door_arms)
    print()
    print(text)
    print()
    print(
        f"in-process baseline {base['facts_per_s']:.1f} facts/s; capacity (first arm's closed "
        f"loop) {runs[0]['capacity_facts_per_s']:.1f} facts/s; load average "
        f"{load_start[0]:.2f} -> {load_end[0]:.2f} on {os.cpu_count()} cores; medians of "
        f"{args.repeats} repeats"
    )
    record = {
        **header,
        "settings": {
            "quick": args.quick,
            "door_arms_ms": args.door_arms,
            "repeats": args.repeats,
            "loads": list(DOOR_LOADS),
            "clients": args.clients,
            "batch_share": args.batch_share,
            "phase_s": args.phase_s,
            "min_calls": args.min_calls,
            "max_queued_facts": args.max_queued_facts,
            "max_batch_facts": args.max_batch_facts,
            "max_wait_ms": args.max_wait_ms,
            "models": base["models"],
        },
        "load_average": [load_start[0], load_end[0]],
        "baseline": base,
        "arms": rows,
        "runs": runs,
    }
    json_path = write_json(args.out, "bench_grpc_doors", record)
    print(f"wrote {json_path.relative_to(ROOT) if json_path.is_relative_to(ROOT) else json_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="short phases (about 1-2 minutes)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny store and 2 s phases to check the plumbing; the figures mean nothing",
    )
    p.add_argument(
        "--cache-dir",
        default=str(default_cache_dir()),
    )
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--memories", type=int, default=1000)
    p.add_argument("--incoming", type=int, default=2000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--channels", type=int, default=4, help="client channels (HTTP/2 connections)")
    p.add_argument(
        "--batch-share",
        type=float,
        default=0.25,
        help="share of open-loop calls that carry 2-8 facts",
    )
    p.add_argument(
        "--max-queued-facts",
        type=int,
        default=None,
        help="server admission limit (default: the server's default)",
    )
    p.add_argument(
        "--max-queue-delay-ms",
        type=float,
        default=None,
        help="server queue-delay admission budget (default: the server's; 0: off)",
    )
    p.add_argument("--max-batch-facts", type=int, default=None)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--http",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the HTTP/JSON arm (needs the http extra; --no-http: gRPC only)",
    )
    p.add_argument(
        "--door-arms",
        type=lambda v: [float(x) for x in v.split(",")],
        default=None,
        help="instead of the usual phases: compare these --max-queue-delay-ms values "
        "(comma-separated, 0: off), each in its own server, interleaved over --repeats, at "
        "0.25x / 0.5x / 2x of the first arm's closed-loop capacity",
    )
    p.add_argument("--repeats", type=int, default=2, help="repeats of each --door-arms arm")
    p.add_argument("--out", type=Path, default=RESULTS)
    # the server subprocess
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    p.add_argument("--metrics-port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    from engine.core.queue import QueueSettings
    from engine.server.server import ServerSettings

    defaults = ServerSettings()
    if args.max_queued_facts is None:
        args.max_queued_facts = defaults.max_queued_facts
    if args.max_queue_delay_ms is None:
        delay = defaults.max_queue_delay_s
        args.max_queue_delay_ms = 0.0 if delay is None else delay * 1000
    if args.max_batch_facts is None:
        args.max_batch_facts = QueueSettings().max_batch_facts
    if args.serve:
        return serve_main(args)

    args.baseline_s = 10.0 if args.quick else 30.0
    args.phase_s = 8.0 if args.quick else 20.0
    args.min_calls = 40 if args.quick else 200
    args.loads = [0.25, 0.5, 1.0, 2.0] if args.quick else [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
    if args.smoke:
        args.baseline_s, args.phase_s, args.min_calls, args.loads = 2.0, 2.0, 5, [0.5, 2.0]
        args.memories, args.incoming = min(args.memories, 100), min(args.incoming, 200)
        args.clients = min(args.clients, 4)
    header = run_header("bench_grpc", args)
    stored, incoming = build_data(args.namespaces, args.memories, args.incoming, args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        db = Path(tmp) / "memgate.db"
        print(
            f"baseline: in-process gate.triage, batches of 64, {args.baseline_s:.0f}s", flush=True
        )
        load_start = os.getloadavg()
        base = baseline(args, db, stored, incoming, args.baseline_s)
        print(
            f"  {base['facts_per_s']:.1f} facts/s "
            f"({base['nli_pairs_per_fact']:.2f} NLI pairs/fact)",
            flush=True,
        )
        if not args.door_arms:
            print(
                f"in-process engine: {args.clients} closed-loop callers of Engine.triage, "
                f"{args.phase_s:.0f}s",
                flush=True,
            )
            eng_before = engine_closed(args, db, incoming, args.phase_s)
            print(
                f"  {eng_before['facts_per_s']:.1f} facts/s (batch {eng_before['batch_mean']:.1f})",
                flush=True,
            )
        from engine.server.codegen import ensure

        ensure()
        if args.door_arms:
            runs = run_doors(args, db, incoming)
            return report_doors(args, header, base, runs, load_start, os.getloadavg())
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            metrics_port = int(s.getsockname()[1])
        print("served: memgate serve in a subprocess", flush=True)
        server = ServerProcess(args, db, metrics_port)
        try:
            phases = asyncio.run(run_load(args, server, incoming))
        finally:
            server.stop()
        # Again after the load, on the same store: other work on the machine shows up as drift.
        print(f"baseline again: {args.baseline_s / 2:.0f}s", flush=True)
        after = baseline(args, db, [], incoming, args.baseline_s / 2)
        print(f"  {after['facts_per_s']:.1f} facts/s", flush=True)
        print(f"in-process engine again: {args.phase_s:.0f}s", flush=True)
        eng_after = engine_closed(args, db, incoming, args.phase_s)
        print(f"  {eng_after['facts_per_s']:.1f} facts/s", flush=True)
        load_end = os.getloadavg()
    base["facts_per_s_before"] = base["facts_per_s"]
    base["facts_per_s_after"] = after["facts_per_s"]
    base["facts_per_s"] = (base["facts_per_s"] + after["facts_per_s"]) / 2
    base["engine_closed"] = {
        k: (eng_before[k] + eng_after[k]) / 2
        for k in ("facts_per_s", "batch_mean", "p50_ms", "p99_ms")
    } | {"before": eng_before, "after": eng_after}

    closed = phases[0]
    by_name = {p.name: p for p in phases}
    http_phase = by_name.get(f"http-{args.clients}")
    again = by_name.get(f"closed-{args.clients}b")
    reads_grpc = by_name.get(f"reads-grpc-{args.clients}")
    reads_http = by_name.get(f"reads-http-{args.clients}")
    opened = [p for p in phases if p.offered is not None]
    unloaded = opened[0]
    overload = opened[-1]
    figures = {
        "in_process_facts_per_s": base["facts_per_s"],
        "in_process_drift": base["facts_per_s_after"] / base["facts_per_s_before"] - 1,
        "served_facts_per_s_32_clients": closed.throughput,
        "ratio_served_to_in_process": closed.throughput / base["facts_per_s"],
        "in_process_engine_facts_per_s": base["engine_closed"]["facts_per_s"],
        "ratio_served_to_in_process_engine": closed.throughput
        / base["engine_closed"]["facts_per_s"],
        "unloaded_p99_ms": unloaded.p99_ms,
        "overload_offered_x": args.loads[-1],
        "overload_shed_share": overload.shed_share,
        "overload_accepted_p99_ms": overload.p99_ms,
        "overload_p99_over_unloaded_p99": overload.p99_ms / unloaded.p99_ms,
    }
    if http_phase is not None and again is not None:
        grpc_mean = (closed.throughput + again.throughput) / 2
        figures |= {
            "grpc_closed_facts_per_s_mean": grpc_mean,
            "http_facts_per_s_32_clients": http_phase.throughput,
            "ratio_http_to_grpc": http_phase.throughput / grpc_mean if grpc_mean else 0.0,
            "http_other_errors": http_phase.other_errors,
        }
    if reads_grpc is not None and reads_http is not None and reads_grpc.throughput:
        figures |= {
            "reads_grpc_calls_per_s": reads_grpc.throughput,
            "reads_http_calls_per_s": reads_http.throughput,
            "ratio_http_to_grpc_reads": reads_http.throughput / reads_grpc.throughput,
            "reads_grpc_client_cpu_ms_per_call": reads_grpc.client_cpu_ms_per_call,
            "reads_http_client_cpu_ms_per_call": reads_http.client_cpu_ms_per_call,
        }
    print()
    print(table(base, phases))
    print()
    print(
        f"in-process before/after the load: {base['facts_per_s_before']:.1f} / "
        f"{base['facts_per_s_after']:.1f} facts/s; load average {load_start[0]:.2f} -> "
        f"{load_end[0]:.2f} on {os.cpu_count()} cores"
    )
    print(
        f"served/in-process at {args.clients} single-fact clients: "
        f"{figures['ratio_served_to_in_process']:.2f} (target >= 0.8)"
    )
    eng = base["engine_closed"]
    print(
        f"served / in-process engine at {args.clients} closed-loop callers (what the transport "
        f"costs): {closed.throughput:.1f} vs {eng['facts_per_s']:.1f} facts/s (before / after "
        f"{eng['before']['facts_per_s']:.1f} / {eng['after']['facts_per_s']:.1f}, batch "
        f"{eng['batch_mean']:.1f} vs {closed.mean_batch_facts:.1f}) = "
        f"{figures['ratio_served_to_in_process_engine']:.2f} (issue 34's target >= 0.95)"
    )
    if "ratio_http_to_grpc" in figures:
        print(
            f"HTTP/JSON vs gRPC at {args.clients} closed-loop clients: "
            f"{figures['http_facts_per_s_32_clients']:.1f} vs "
            f"{figures['grpc_closed_facts_per_s_mean']:.1f} facts/s (gRPC: mean of the runs "
            f"before and after) = {figures['ratio_http_to_grpc']:.2f} (target >= 0.85)"
        )
    if "ratio_http_to_grpc_reads" in figures:
        print(
            f"the doors alone (ListReview store reads, no model): HTTP "
            f"{figures['reads_http_calls_per_s']:.0f} vs gRPC "
            f"{figures['reads_grpc_calls_per_s']:.0f} calls/s = "
            f"{figures['ratio_http_to_grpc_reads']:.2f}; the load generator's own CPU per call: "
            f"HTTP {figures['reads_http_client_cpu_ms_per_call']:.2f} ms, grpc.aio "
            f"{figures['reads_grpc_client_cpu_ms_per_call']:.2f} ms (same cores as the server)"
        )
    print(
        f"at {args.loads[-1]:.0f}x capacity: shed {overload.shed_share:.1%} "
        "with RESOURCE_EXHAUSTED;"
        f" accepted p99 {overload.p99_ms:.1f} ms vs unloaded p99 {unloaded.p99_ms:.1f} ms = "
        f"{figures['overload_p99_over_unloaded_p99']:.2f}x (target <= 2x)"
    )
    stamp = utc_stamp()
    record = {
        **header,
        "settings": {
            "quick": args.quick,
            "smoke": args.smoke,
            "namespaces": args.namespaces,
            "memories": args.memories,
            "incoming": args.incoming,
            "clients": args.clients,
            "channels": args.channels,
            "batch_share": args.batch_share,
            "max_queued_facts": args.max_queued_facts,
            "max_queue_delay_ms": args.max_queue_delay_ms,
            "min_admitted_facts": defaults.min_admitted_facts,
            "max_batch_facts": args.max_batch_facts,
            "max_wait_ms": args.max_wait_ms,
            "baseline_s": args.baseline_s,
            "phase_s": args.phase_s,
            "min_calls": args.min_calls,
            "loads": args.loads,
            "rpc": "Triage (dry run)",
            "http_arm": args.http,
            "models": base["models"],
        },
        "baseline": base,
        "phases": [asdict(p) for p in phases],
        "figures": figures,
    }
    json_path = write_json(args.out, "bench_grpc", record, stamp=stamp)
    png_path = args.out / f"bench_grpc-{stamp}.png"
    plot(png_path, base, phases)
    print(
        f"wrote {json_path.relative_to(ROOT) if json_path.is_relative_to(ROOT) else json_path}"
        f" and {png_path.name}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
