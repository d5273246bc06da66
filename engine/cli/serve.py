"""``memgate serve``: the gate over gRPC (health, reflection, metrics, auth, TLS), and with
``--http-port`` over HTTP/JSON too (``--mcp``: the MCP server on that port), one engine.

Reads what the server needs from files (tokens file, TLS material); see the README's "Serving"
section for every flag, the tokens-file format and a metrics example.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.cli.common import add_engine_flags, add_policy_file_flag, engine_settings, usage_error

__all__ = ["SERVE_SPIN", "register", "settings_from_args"]

SERVE_SPIN = False
"""``memgate serve``'s default for ONNX Runtime's spinning: off. A server runs the parse and
commit stages beside the model, and spinning pool threads take their cores. Adopted under a rule
written before the run (docs/experiments/2026-12-05-spinning-default.md; ``bench_spin.py``, 2-core
AMD EPYC, medians of 3 interleaved rounds, SQLite / PostgreSQL): off served 32 writers 1.25x /
1.52x, 32 dry-run clients 1.06x / 1.11x, and a lone write's p50 latency was 0.55x / 0.61x."""

PROG = "memgate serve"


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the gate over gRPC (health, metrics, auth, TLS)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=50051, help="gRPC port")
    p.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="also serve HTTP/JSON on this port (same engine, auth and limits; the http extra)",
    )
    p.add_argument(
        "--mcp",
        action="store_true",
        help="serve MCP (streamable HTTP) at /mcp on --http-port (the mcp extra)",
    )
    p.add_argument(
        "--mcp-namespace",
        default="",
        help="MCP: the namespace of sessions that send no x-memgate-namespace header "
        "(inside the token's prefixes)",
    )
    p.add_argument(
        "--tokens-file", help='JSON {"token": ["namespace prefix", ...]}; absent: auth off'
    )
    p.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key: TLS only)")
    p.add_argument("--tls-key", help="PEM private key")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0: off)")
    p.add_argument("--metrics-host", default="127.0.0.1", help="bind address of the metrics port")
    p.add_argument("--reflection", action="store_true", help="serve gRPC reflection (v1, v1alpha)")
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="on SIGTERM: health NOT_SERVING, new calls UNAVAILABLE, in-flight calls get this "
        "many seconds",
    )
    p.add_argument(
        "--max-request-facts",
        type=int,
        default=256,
        help="most facts in one Triage or Write (more: INVALID_ARGUMENT)",
    )
    p.add_argument(
        "--max-text-bytes",
        type=int,
        default=32768,
        help="longest fact text or query in UTF-8 bytes, 1-1000000 (the only text limit)",
    )
    p.add_argument(
        "--max-queued-facts",
        type=int,
        default=1024,
        help="admission permits: facts queued or in the model (beyond: RESOURCE_EXHAUSTED)",
    )
    p.add_argument(
        "--max-queue-delay-ms",
        type=float,
        default=0.0,
        help="also admit only what the worker finishes in this long at its measured rate "
        "(default 0: off; requests' own deadlines decide)",
    )
    p.add_argument(
        "--min-admitted-facts",
        type=int,
        default=16,
        help="the delay budget never admits fewer facts in flight than this",
    )
    p.add_argument("--max-batch-facts", type=int, default=256, help="most facts in one model batch")
    p.add_argument(
        "--max-batch-tokens", type=int, default=16384, help="token budget of one model batch"
    )
    p.add_argument(
        "--max-batch-work-tokens",
        type=int,
        default=16384,
        help="estimated work of one batch: fact tokens x (1 + the namespace's NLI pair tokens "
        "per fact token, learned from its batches), so a dense namespace gets smaller batches",
    )
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a batch waits to fill")
    p.add_argument(
        "--backfill-window",
        type=int,
        default=256,
        help="most facts of one Backfill stream in flight",
    )
    p.add_argument(
        "--io-threads",
        type=int,
        default=4,
        help="threads for store work (Get, History, Forget, Undo, reviews, events)",
    )
    p.add_argument(
        "--expiry-interval",
        type=float,
        default=60.0,
        help="seconds between expiry sweeps (0: no sweep; expired memories are still hidden "
        "at read and decision time)",
    )
    p.add_argument(
        "--expiry-batch",
        type=int,
        default=500,
        help="most memories one sweep transaction expires (a writer waits for one at most)",
    )
    p.add_argument(
        "--lanes",
        type=int,
        default=8,
        help="batches of different namespaces decided and committed at once, 1-256 (a "
        "namespace waiting on a lock holds up no other)",
    )
    p.add_argument(
        "--lock-timeout",
        type=float,
        default=5.0,
        help="seconds a write waits for a namespace locked by another writer (another replica; "
        "SQLite: another process) before UNAVAILABLE naming the namespace, 0.01-3600",
    )
    p.add_argument(
        "--lock-hold-timeout",
        type=float,
        default=15.0,
        help="PostgreSQL: seconds a lock-holding replica may go silent before the database ends "
        "its transaction (a frozen or cut-off replica loses its namespaces; a live one renews "
        "its lease), 1-86400",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=30.0,
        help="health turns NOT_SERVING when queued work waits this long on the model thread "
        "without a forward finishing, 0.1-3600",
    )
    p.add_argument(
        "--nli-call-tokens",
        type=int,
        default=4096,
        help="most pair tokens (premise + hypothesis) of one NLI model call, merged across "
        "lanes; a lane's call goes in trips of half of it, so short calls wait behind at most "
        "that much of a long one, 32-16777216",
    )
    p.add_argument(
        "--exact-tokens",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count batch tokens with the embedder's tokenizer (default; --no-exact-tokens: "
        "a len/4 estimate)",
    )
    p.add_argument(
        "--log-format", choices=["json", "text"], default="json", help="server log format"
    )
    p.add_argument(
        "--no-access-log", dest="access_log", action="store_false", help="no per-request log line"
    )
    add_policy_file_flag(p)  # requests for the file's base policy get the file's settings
    add_engine_flags(p, spin=SERVE_SPIN)
    p.set_defaults(func=cmd_serve)


def settings_from_args(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(EngineSettings, ServerSettings, tokens) for ``args``; a bad flag is a usage error."""
    from engine.core.queue import QueueSettings
    from engine.core.stage import Budget, StageSettings
    from engine.gate.gate import GateSettings
    from engine.server.auth import parse_tokens
    from engine.server.convert import Limits
    from engine.server.server import ServerSettings
    from engine.store import StoreSettings

    if not 1 <= args.max_text_bytes <= 1_000_000:
        usage_error(PROG, "--max-text-bytes must be in [1, 1000000]")
    if not 32 <= args.nli_call_tokens <= 1 << 24:
        usage_error(PROG, "--nli-call-tokens must be in [32, 16777216]")
    if bool(args.tls_cert) != bool(args.tls_key):
        usage_error(PROG, "--tls-cert and --tls-key go together")
    if args.mcp and args.http_port is None:
        usage_error(PROG, "--mcp is served on the HTTP port: give --http-port too")
    tokens = parse_tokens(Path(args.tokens_file).read_text("utf-8")) if args.tokens_file else None
    server = ServerSettings(
        host=args.host,
        port=args.port,
        max_request_facts=args.max_request_facts,
        limits=Limits(max_text_bytes=args.max_text_bytes),
        max_queued_facts=args.max_queued_facts,
        min_admitted_facts=args.min_admitted_facts,
        max_queue_delay_s=args.max_queue_delay_ms / 1000.0 if args.max_queue_delay_ms else None,
        batching=QueueSettings(
            max_batch_tokens=args.max_batch_tokens,
            max_batch_work_tokens=args.max_batch_work_tokens,
            max_batch_facts=args.max_batch_facts,
            max_wait_s=args.max_wait_ms / 1000.0,
        ),
        backfill_window=args.backfill_window,
        io_threads=args.io_threads,
        expiry_interval_s=args.expiry_interval or None,
        lanes=args.lanes,
        stall_s=args.stall_timeout,
        stage=StageSettings(
            nli=Budget(tokens=args.nli_call_tokens, chunk_tokens=args.nli_call_tokens // 2)
        ),
        grace_s=args.grace,
        reflection=args.reflection,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        tls_cert=Path(args.tls_cert).read_bytes() if args.tls_cert else None,
        tls_key=Path(args.tls_key).read_bytes() if args.tls_key else None,
        exact_tokens=args.exact_tokens,
        http_port=args.http_port,
        mcp=args.mcp,
        mcp_namespace=args.mcp_namespace,
    )
    # One text limit: the gate's character cap follows the byte limit (a text of N bytes has
    # at most N characters), so --max-text-bytes is the only limit a client can meet.
    if not 0.01 <= args.lock_timeout <= 3600:
        usage_error(PROG, "--lock-timeout must be in [0.01, 3600] seconds")
    if not 1 <= args.lock_hold_timeout <= 86400:
        usage_error(PROG, "--lock-hold-timeout must be in [1, 86400] seconds")
    store = StoreSettings(
        lock_timeout_s=args.lock_timeout,
        lock_hold_s=args.lock_hold_timeout,
        busy_timeout_ms=int(args.lock_timeout * 1000),
    )
    gate = GateSettings(max_text_chars=args.max_text_bytes, expiry_batch=args.expiry_batch)
    engine = engine_settings(args, gate=gate, store=store)
    return engine, server, tokens


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.app import open_engine
    from engine.server.logs import install_json_logging
    from engine.server.server import serve

    if args.log_format == "json":
        install_json_logging("INFO" if args.access_log else "WARNING")
    from engine.tuning.policy_file import PolicyFileGate, load_policy_file

    engine, server, tokens = settings_from_args(args)
    policy_file = load_policy_file(args.policy_file) if args.policy_file else None
    with open_engine(engine) as eng:
        gate = eng.gate if policy_file is None else PolicyFileGate(eng.gate, policy_file)
        return serve(gate, server, tokens=tokens)
