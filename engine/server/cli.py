"""``memgate serve`` and ``memgate client <rpc>``: the service's command-line edge.

Like ``engine.cli``, this is where files and the environment are read: the tokens file, TLS
material, ``MEMGATE_TOKEN`` for the client. Nothing here imports grpc until a command runs, so
``memgate --help`` works without the generated stubs.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.facts import read_facts

__all__ = ["register"]


# -- serve ---------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    from engine.app import open_engine
    from engine.cli import _engine_settings
    from engine.core.queue import QueueSettings
    from engine.server.auth import parse_tokens
    from engine.server.convert import Limits
    from engine.server.logs import install_json_logging
    from engine.server.server import ServerSettings, serve

    if args.log_format == "json":
        install_json_logging("INFO" if args.access_log else "WARNING")
    tokens = parse_tokens(Path(args.tokens_file).read_text("utf-8")) if args.tokens_file else None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("memgate serve: --tls-cert and --tls-key go together")
    settings = ServerSettings(
        host=args.host,
        port=args.port,
        max_request_facts=args.max_request_facts,
        limits=Limits(max_text_bytes=args.max_text_bytes),
        max_queued_facts=args.max_queued_facts,
        min_admitted_facts=args.min_admitted_facts,
        max_queue_delay_s=args.max_queue_delay_ms / 1000.0 if args.max_queue_delay_ms else None,
        batching=QueueSettings(
            max_batch_tokens=args.max_batch_tokens,
            max_batch_facts=args.max_batch_facts,
            max_wait_s=args.max_wait_ms / 1000.0,
        ),
        backfill_window=args.backfill_window,
        io_threads=args.io_threads,
        grace_s=args.grace,
        reflection=args.reflection,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        tls_cert=Path(args.tls_cert).read_bytes() if args.tls_cert else None,
        tls_key=Path(args.tls_key).read_bytes() if args.tls_key else None,
        exact_tokens=args.exact_tokens,
    )
    with open_engine(_engine_settings(args)) as eng:
        return serve(eng.gate, settings, tokens=tokens)


def _add_serve(sub: Any) -> None:
    from engine.cli import _add_engine_flags

    p = sub.add_parser("serve", help="serve the gate over gRPC (health, metrics, auth, TLS)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--tokens-file", help="JSON {token: [namespace prefix, ...]}; absent: auth off")
    p.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key: TLS only)")
    p.add_argument("--tls-key", help="PEM private key")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0: off)")
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--reflection", action="store_true", help="serve gRPC reflection")
    p.add_argument("--grace", type=float, default=10.0, help="drain seconds on SIGTERM")
    p.add_argument("--max-request-facts", type=int, default=256)
    p.add_argument("--max-text-bytes", type=int, default=32768)
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
    p.add_argument("--max-batch-facts", type=int, default=256)
    p.add_argument("--max-batch-tokens", type=int, default=16384)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--backfill-window", type=int, default=256)
    p.add_argument("--io-threads", type=int, default=4)
    p.add_argument(
        "--exact-tokens",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count batch tokens with the embedder's tokenizer (default; --no-exact-tokens: "
        "a len/4 estimate)",
    )
    p.add_argument("--log-format", choices=["json", "text"], default="json")
    p.add_argument(
        "--no-access-log", dest="access_log", action="store_false", help="no per-request log line"
    )
    _add_engine_flags(p)
    p.set_defaults(func=cmd_serve)


# -- client --------------------------------------------------------------------------------------
def _client(args: argparse.Namespace) -> Any:
    from engine.client import MemgateClient

    tls: bool | bytes = False
    if args.tls_ca:
        tls = Path(args.tls_ca).read_bytes()
    elif args.tls:
        tls = True
    return MemgateClient(
        args.target,
        token=args.token or None,
        tls=tls,
        tls_server_name=args.tls_server_name,
        timeout=args.timeout,
    )


def _emit(obj: Any) -> None:
    print(json.dumps(obj, default=str, ensure_ascii=False))


def _decision(d: Any) -> dict[str, Any]:
    return {
        "action": d.action,
        "target_id": d.target_id,
        "memory_id": d.memory_id,
        "review_id": d.review_id,
        "rule": d.rule,
        "replayed": d.replayed,
        "namespace": d.fact.namespace,
        "text": d.fact.text,
    }


def _overrides(args: argparse.Namespace) -> dict[str, Any] | None:
    return json.loads(args.overrides) if args.overrides else None


def cmd_client(args: argparse.Namespace) -> int:
    with _client(args) as mg:
        rpc = args.rpc
        if rpc in ("triage", "write"):
            method = mg.triage if rpc == "triage" else mg.write
            out = method(list(read_facts(args.file)), args.policy, _overrides(args))
            for d in out.decisions:
                _emit(_decision(d))
            _emit({"timings": out.timings, "request_id": out.request_id})
        elif rpc == "backfill":
            for d in mg.backfill(
                read_facts(args.file),
                args.policy,
                dry_run=args.dry_run,
                overrides=_overrides(args),
            ):
                _emit(_decision(d))
        elif rpc == "recall":
            for memory, similarity in mg.recall(args.namespace, args.query, args.k):
                _emit({"similarity": round(similarity, 6), **asdict(memory)})
        elif rpc == "get":
            _emit(asdict(mg.get(args.namespace, args.memory_id)))
        elif rpc == "forget":
            _emit({"forgotten": mg.forget(args.namespace, args.memory_id)})
        elif rpc == "undo":
            restored, undone = mg.undo(args.namespace, args.memory_id)
            _emit({"restored": asdict(restored), "undone": asdict(undone)})
        elif rpc == "history":
            for memory in mg.history(args.namespace, args.memory_id):
                _emit(asdict(memory))
        elif rpc == "review" and args.review_rpc == "list":
            for item in mg.list_review(args.namespace, args.limit):
                _emit(asdict(item))
        elif rpc == "review" and args.review_rpc == "resolve":
            _emit(asdict(mg.resolve_review(args.namespace, args.review_id, args.resolution)))
        elif rpc == "health":
            status = mg.health(args.service)
            _emit({"status": status})
            return 0 if status == "SERVING" else 1
    return 0


def _add_client(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", default="127.0.0.1:50051", help="host:port of memgate serve")
    common.add_argument(
        "--token",
        default=os.environ.get("MEMGATE_TOKEN"),
        help="API token (default: $MEMGATE_TOKEN)",
    )
    common.add_argument("--tls", action="store_true", help="TLS with the system roots")
    common.add_argument("--tls-ca", help="PEM root certificate to trust (implies --tls)")
    common.add_argument("--tls-server-name", help="name to check the certificate against")
    common.add_argument("--timeout", type=float, default=30.0, help="deadline in seconds")

    client = sub.add_parser("client", help="call a running memgate server (JSON lines out)")
    rpcs = client.add_subparsers(dest="rpc", required=True)
    client.set_defaults(func=cmd_client)

    def batch(name: str, text: str) -> argparse.ArgumentParser:
        p = rpcs.add_parser(name, parents=[common], help=text)
        p.add_argument("file", help="JSON Lines of facts ({namespace, text, kind?, key?, ...}); -")
        p.add_argument("--policy", choices=["strict", "review"], default="strict")
        p.add_argument("--overrides", help='JSON of policy overrides, e.g. {"floor": 0.7}')
        return p

    batch("triage", "decide facts without storing them (Triage)")
    batch("write", "decide and store facts in one transaction (Write)")
    batch("backfill", "stream facts, decisions out in order (Backfill)").add_argument(
        "--dry-run", action="store_true"
    )
    p = rpcs.add_parser("recall", parents=[common], help="the memories most similar to a query")
    p.add_argument("namespace")
    p.add_argument("query")
    p.add_argument("-k", type=int, default=10)
    for name, text in (
        ("get", "one memory"),
        ("forget", "erase a memory"),
        ("undo", "undo the replacement a memory made"),
        ("history", "the supersedes chain of a memory"),
    ):
        p = rpcs.add_parser(name, parents=[common], help=text)
        p.add_argument("namespace")
        p.add_argument("memory_id")
    review = rpcs.add_parser("review", help="the review queue")
    reviews = review.add_subparsers(dest="review_rpc", required=True)
    p = reviews.add_parser("list", parents=[common], help="pending review items")
    p.add_argument("namespace")
    p.add_argument("--limit", type=int, default=100)
    p = reviews.add_parser("resolve", parents=[common], help="resolve a review item")
    p.add_argument("namespace")
    p.add_argument("review_id")
    p.add_argument("resolution", choices=["accept", "keep_both", "reject"])
    p = rpcs.add_parser("health", parents=[common], help="SERVING / NOT_SERVING (exit 1)")
    p.add_argument("--service", default="", help='"" (server) or memgate.v1.Memgate')


def register(subparsers: Any) -> None:
    """Add ``serve`` and ``client`` to ``memgate``'s subcommands."""
    _add_serve(subparsers)
    _add_client(subparsers)
