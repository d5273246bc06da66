"""``memgate client [--target ...] <rpc> ...``: call a running server, JSON lines out.

The connection flags (``--target``, ``--token``, ``--tls``, ``--tls-ca``, ``--tls-server-name``,
``--timeout``) go before or after the RPC name: ``memgate client --target H:P write -`` and
``memgate client write - --target H:P`` are the same command.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from engine.cli.common import add_client_flags, client_from_args, facts_from_arg
from engine.gate.policy import POLICY_NAMES

__all__ = ["register"]

_AS_OF = (
    "read as of a point of the event log: an event seq (42) or an RFC 3339 time "
    "(2026-03-01T09:30:00Z); default: now"
)


def register(sub: Any) -> None:
    client = sub.add_parser("client", help="call a running memgate server (JSON lines out)")
    add_client_flags(client)
    client.set_defaults(func=cmd_client)
    rpcs = client.add_subparsers(dest="rpc", required=True, metavar="RPC")

    def rpc(name: str, text: str, parent: Any = rpcs) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=text)
        add_client_flags(p, inner=True)
        return p

    def batch(name: str, text: str) -> argparse.ArgumentParser:
        p = rpc(name, text)
        p.add_argument("file", help="JSON Lines of facts ({namespace, text, kind?, key?, ...}); -")
        p.add_argument("--policy", choices=list(POLICY_NAMES), default="strict")
        p.add_argument("--overrides", help='JSON of policy overrides, e.g. {"floor": 0.7}')
        return p

    batch("triage", "decide facts without storing them (Triage)")
    batch("write", "decide and store facts in one transaction (Write)")
    batch("backfill", "stream facts, decisions out in order (Backfill)").add_argument(
        "--dry-run", action="store_true"
    )
    p = rpc("recall", "the memories most similar to a query")
    p.add_argument("namespace")
    p.add_argument("query")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--as-of", default="", help=_AS_OF)
    p.add_argument(
        "--include-inactive",
        action="store_true",
        help="return superseded, expired and undone memories too, each with its status",
    )
    for name, text in (
        ("get", "one memory"),
        ("forget", "erase a memory"),
        ("undo", "undo the replacement a memory made"),
        ("history", "the supersedes chain of a memory"),
    ):
        p = rpc(name, text)
        p.add_argument("namespace")
        p.add_argument("memory_id")
        if name in ("get", "history"):
            p.add_argument("--as-of", default="", help=_AS_OF)
    review = rpc("review", "the review queue")
    reviews = review.add_subparsers(dest="review_rpc", required=True)
    p = rpc("list", "pending review items", reviews)
    p.add_argument("namespace")
    p.add_argument("--limit", type=int, default=100)
    p = rpc("resolve", "resolve a review item", reviews)
    p.add_argument("namespace")
    p.add_argument("review_id")
    p.add_argument("resolution", choices=["accept", "keep_both", "reject"])
    p = rpc("events", "the audit log of a namespace (ListEvents)")
    p.add_argument("namespace")
    p.add_argument("--after-seq", type=int, default=0, help="events after this seq (default 0)")
    p.add_argument("--limit", type=int, default=100, help="events in one page (1-1000)")
    p.add_argument("--all", action="store_true", help="every event from --after-seq on")
    p = rpc("health", "SERVING / NOT_SERVING (exit 1)")
    p.add_argument("--service", default="", help='"" (server) or memgate.v1.Memgate')


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
    prog = f"memgate client {args.rpc}"
    facts = facts_from_arg(prog, args.file) if hasattr(args, "file") else None
    with client_from_args(args) as mg:
        rpc = args.rpc
        if rpc in ("triage", "write"):
            assert facts is not None
            method = mg.triage if rpc == "triage" else mg.write
            out = method(list(facts), args.policy, _overrides(args))
            for d in out.decisions:
                _emit(_decision(d))
            _emit({"timings": out.timings, "request_id": out.request_id})
        elif rpc == "backfill":
            assert facts is not None
            for d in mg.backfill(
                facts, args.policy, dry_run=args.dry_run, overrides=_overrides(args)
            ):
                _emit(_decision(d))
        elif rpc == "recall":
            hits = mg.recall(
                args.namespace,
                args.query,
                args.k,
                as_of=args.as_of,
                include_inactive=args.include_inactive,
            )
            for memory, similarity in hits:
                _emit({"similarity": round(similarity, 6), **asdict(memory)})
            _emit({"hidden": asdict(hits.hidden), "as_of_seq": hits.seq})  # the last line
        elif rpc == "get":
            _emit(asdict(mg.get(args.namespace, args.memory_id, as_of=args.as_of)))
        elif rpc == "forget":
            _emit({"forgotten": mg.forget(args.namespace, args.memory_id)})
        elif rpc == "undo":
            restored, undone = mg.undo(args.namespace, args.memory_id)
            _emit({"restored": asdict(restored), "undone": asdict(undone)})
        elif rpc == "history":
            for memory in mg.history(args.namespace, args.memory_id, as_of=args.as_of):
                _emit(asdict(memory))
        elif rpc == "review" and args.review_rpc == "list":
            for item in mg.list_review(args.namespace, args.limit):
                _emit(asdict(item))
        elif rpc == "review" and args.review_rpc == "resolve":
            _emit(asdict(mg.resolve_review(args.namespace, args.review_id, args.resolution)))
        elif rpc == "events":
            after = args.after_seq
            while True:  # one page, or with --all every page
                page = mg.events(args.namespace, after, 1000 if args.all else args.limit)
                for event in page:
                    _emit(asdict(event))
                if not args.all or not page:
                    break
                after = page[-1].seq
        elif rpc == "health":
            status = mg.health(args.service)
            _emit({"status": status})
            return 0 if status == "SERVING" else 1
    return 0
